"""Proposal rules: given the context, which draft tree to send.

Model-free drafters: :class:`Autoregressive` (the empty tree), :class:`TokenRecycling`,
:class:`DynamicTokenRecycling`, :class:`PromptLookup`, :class:`SuffixDrafter` (with a
:class:`SuffixCorpus` of earlier outputs shared across requests). The budget rule any
drafter with node values can use: :func:`choose_budget` over a :class:`LatencyTable`.
Draft-model drafters: :class:`Chain`, :class:`SpecInferTree`, :class:`DySpec`,
:class:`RSDConstant` (RSD-C), :class:`RSDStochasticBeam` (RSD-S).
"""

from verispec.drafters.autoregressive import Autoregressive
from verispec.drafters.budget import LatencyTable, choose_budget, latency_for, measure_latency
from verispec.drafters.chain import Chain
from verispec.drafters.dynamic_token_recycling import DynamicTokenRecycling
from verispec.drafters.dyspec import DySpec
from verispec.drafters.prompt_lookup import PromptLookup
from verispec.drafters.rsd_beam import RSDStochasticBeam
from verispec.drafters.rsd_constant import RSDConstant
from verispec.drafters.specinfer import SpecInferTree
from verispec.drafters.suffix import SuffixDrafter
from verispec.drafters.suffix_corpus import SuffixCorpus
from verispec.drafters.templates import TEMPLATES, TreeTemplate, resolve_template
from verispec.drafters.token_recycling import TokenRecycling

__all__ = [
    "TEMPLATES",
    "Autoregressive",
    "Chain",
    "DySpec",
    "DynamicTokenRecycling",
    "LatencyTable",
    "PromptLookup",
    "RSDConstant",
    "RSDStochasticBeam",
    "SpecInferTree",
    "SuffixCorpus",
    "SuffixDrafter",
    "TokenRecycling",
    "TreeTemplate",
    "choose_budget",
    "latency_for",
    "measure_latency",
    "resolve_template",
]
