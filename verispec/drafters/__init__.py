"""Proposal rules: given the context, which draft tree to send.

Model-free drafters: :class:`Autoregressive` (the empty tree), :class:`TokenRecycling`,
:class:`PromptLookup`.
"""

from verispec.drafters.autoregressive import Autoregressive
from verispec.drafters.budget import LatencyTable, choose_budget, latency_for, measure_latency
from verispec.drafters.dynamic_token_recycling import DynamicTokenRecycling
from verispec.drafters.prompt_lookup import PromptLookup
from verispec.drafters.templates import TEMPLATES, TreeTemplate, resolve_template
from verispec.drafters.token_recycling import TokenRecycling

__all__ = [
    "TEMPLATES",
    "Autoregressive",
    "DynamicTokenRecycling",
    "LatencyTable",
    "PromptLookup",
    "TokenRecycling",
    "TreeTemplate",
    "choose_budget",
    "latency_for",
    "measure_latency",
    "resolve_template",
]
