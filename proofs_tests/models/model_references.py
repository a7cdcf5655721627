"""Helpers of the model tests: a tree strategy and sequential references for either model.

The reference of a :class:`~verispec.models.HFModel` is transformers' own forward, fed
one token at a time with a ``DynamicCache``. The reference of a
:class:`~verispec.models.FastModel` is the runtime itself decoding one token at a time
through a fresh view that shares the weights and has its own cache: no tree, no tree
mask, every token at the slot of its position. Either way a tree pass is checked
against the computation it must reproduce.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from hypothesis import strategies as st
from transformers import DynamicCache

from verispec.core.tree import DraftTree
from verispec.models import FastModel, HFModel

Model = HFModel | FastModel
KV = list[tuple[torch.Tensor, torch.Tensor]]


@st.composite
def draft_trees(draw: st.DrawFn, vocab_size: int, max_nodes: int = 12) -> DraftTree:
    """Random trees: each node's parent is the root or any earlier node; random tokens."""
    num_nodes = draw(st.integers(0, max_nodes))
    parents = [draw(st.integers(-1, i - 1)) for i in range(num_nodes)]
    tokens = draw(st.lists(st.integers(0, vocab_size - 1), min_size=num_nodes, max_size=num_nodes))
    return DraftTree.from_parents(tokens, parents)


def sequential_logits(model: Model, ids: Sequence[int]) -> torch.Tensor:
    """Logits after each token of ``ids``, fed one token at a time. Shape: (len(ids), V)."""
    return sequential_run(model, ids)[0]


def sequential_run(model: Model, ids: Sequence[int]) -> tuple[torch.Tensor, KV]:
    """As :func:`sequential_logits`, also returning every layer's keys and values after the
    last token, each Shape: (1, Hkv, len(ids), D)."""
    if isinstance(model, FastModel):
        return _runtime_sequential(model, ids)
    logits, cache = _hf_sequential_cache(model, ids)
    return logits, [(layer.keys, layer.values) for layer in cache.layers]


def _runtime_sequential(model: FastModel, ids: Sequence[int]) -> tuple[torch.Tensor, KV]:
    view = model.self_draft(model.layer_indices)  # same weights, own cache
    view.prefill(torch.tensor(ids[:1]))
    rows = [view.forward_tree(DraftTree.empty())[0]]
    for token in ids[1:]:
        view.commit([], int(token))
        rows.append(view.forward_tree(DraftTree.empty())[0])
    view.commit([], 0)  # the last token joins the cache
    return torch.stack(rows), view.kv_cache()


def tree_reference(model: Model, prompt: Sequence[int], tree: DraftTree) -> torch.Tensor:
    """Row 0: logits after ``prompt``; row i + 1: logits after prompt + path to node i,
    each path decoded one token at a time. Shape: (N + 1, V)."""
    if isinstance(model, FastModel):
        tokens = tree.tokens.tolist()
        rows = [sequential_logits(model, prompt)[-1]]
        for node in range(tree.num_nodes):
            path = [tokens[i] for i in tree.path_to(node)]
            rows.append(sequential_logits(model, [*prompt, *path])[-1])
        return torch.stack(rows)
    prompt_logits, prompt_cache = _hf_sequential_cache(model, prompt)
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


def decoded_tree_reference(
    model: FastModel, prompt: Sequence[int], tree: DraftTree
) -> torch.Tensor:
    """As :func:`tree_reference` for the runtime, the way greedy decoding (``ar``) computes
    it: the prompt prefilled in one causal pass, then each path token decoded one at a time.
    Shape: (N + 1, V)."""
    view = model.self_draft(model.layer_indices)  # same weights, own cache
    tokens = tree.tokens.tolist()
    rows = []
    for node in [None, *range(tree.num_nodes)]:
        view.prefill(torch.tensor(prompt))
        for i in [] if node is None else tree.path_to(node):
            view.forward_tree(DraftTree.empty())
            view.commit([], tokens[i])
        rows.append(view.forward_tree(DraftTree.empty())[0])
    return torch.stack(rows)


def _hf_sequential_cache(model: HFModel, ids: Sequence[int]) -> tuple[torch.Tensor, DynamicCache]:
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


def causal_logits(model: Model, ids: Sequence[int]) -> torch.Tensor:
    """Logits after each token of ``ids`` from one causal pass (HF) or, for the runtime,
    from sequential decoding. Shape: (len(ids), V)."""
    if isinstance(model, FastModel):
        return sequential_logits(model, ids)
    with torch.no_grad():
        return model.hf_model(torch.tensor([list(ids)], device=model.device)).logits[0]
