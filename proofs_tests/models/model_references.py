"""Helpers of the model-adapter tests: a tree strategy and sequential references."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from hypothesis import strategies as st
from transformers import DynamicCache

from verispec.core.tree import DraftTree
from verispec.models import HFModel


@st.composite
def draft_trees(draw: st.DrawFn, vocab_size: int, max_nodes: int = 12) -> DraftTree:
    """Random trees: each node's parent is the root or any earlier node; random tokens."""
    num_nodes = draw(st.integers(0, max_nodes))
    parents = [draw(st.integers(-1, i - 1)) for i in range(num_nodes)]
    tokens = draw(st.lists(st.integers(0, vocab_size - 1), min_size=num_nodes, max_size=num_nodes))
    return DraftTree.from_parents(tokens, parents)


def sequential_logits(model: HFModel, ids: Sequence[int]) -> torch.Tensor:
    """Logits after each token of ``ids``, fed one token at a time through transformers' own
    forward and DynamicCache. float, Shape: (len(ids), V)."""
    return sequential_run(model, ids)[0]


def sequential_run(model: HFModel, ids: Sequence[int]) -> tuple[torch.Tensor, DynamicCache]:
    """As :func:`sequential_logits`, also returning the cache after the last token."""
    cache = DynamicCache(config=model.config)
    rows = []
    with torch.no_grad():
        for position, token in enumerate(ids):
            out = model.hf_model(
                torch.tensor([[token]], device=model.device),
                position_ids=torch.tensor([[position]], device=model.device),
                past_key_values=cache,
                use_cache=True,
            )
            rows.append(out.logits[0, -1])
    return torch.stack(rows), cache


def tree_reference(model: HFModel, prompt: Sequence[int], tree: DraftTree) -> torch.Tensor:
    """Row 0: logits after ``prompt``; row i + 1: logits after prompt + path to node i.

    Every token is fed one at a time through transformers' forward: a node's cache is a copy
    of its parent's cache plus the node's token. Shape: (N + 1, V).
    """
    prompt_logits, prompt_cache = sequential_run(model, prompt)
    rows = [prompt_logits[-1]]
    caches = {-1: prompt_cache}
    depth = tree.depth.tolist()
    with torch.no_grad():
        for node, (token, parent) in enumerate(
            zip(tree.tokens.tolist(), tree.parents.tolist(), strict=True)
        ):
            cache = copy.deepcopy(caches[parent])
            out = model.hf_model(
                torch.tensor([[token]], device=model.device),
                position_ids=torch.tensor([[len(prompt) - 1 + depth[node]]], device=model.device),
                past_key_values=cache,
                use_cache=True,
            )
            caches[node] = cache
            rows.append(out.logits[0, -1])
    return torch.stack(rows)


def causal_logits(model: HFModel, ids: Sequence[int]) -> torch.Tensor:
    """Logits after each token of ``ids`` from one ordinary causal forward of transformers.
    Shape: (len(ids), V)."""
    with torch.no_grad():
        return model.hf_model(torch.tensor([list(ids)], device=model.device)).logits[0]
