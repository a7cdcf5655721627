"""Proposal rules: given the context, which draft tree to send.

Model-free drafters: :class:`Autoregressive` (the empty tree), :class:`TokenRecycling`.
"""

from verispec.drafters.autoregressive import Autoregressive
from verispec.drafters.templates import TEMPLATES, TreeTemplate, resolve_template
from verispec.drafters.token_recycling import TokenRecycling

__all__ = [
    "TEMPLATES",
    "Autoregressive",
    "TokenRecycling",
    "TreeTemplate",
    "resolve_template",
]
