"""Token Recycling kernels: template expansion and adjacency update equal the drafter's own
PyTorch code (``verispec.drafters.token_recycling``) and the kernel references, exactly."""

from __future__ import annotations

import pytest
import torch

from verispec.drafters.templates import TreeTemplate, resolve_template
from verispec.kernels import ops, reference


def _adjacency(vocab: int, k: int, g: torch.Generator, unknown: float, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    adj = torch.randint(0, vocab, (vocab, k), generator=g)
    adj[torch.rand(vocab, k, generator=g) < unknown] = -1
    return adj.to(dtype)


def _walk(adjacency: torch.Tensor, root: int, template: TreeTemplate) -> torch.Tensor:
    """The expansion written plainly: node by node, each from its parent's row and slot."""
    rows = [root]
    for parent, slot in zip(template.parents.tolist(), template.slots.tolist(), strict=True):
        above = rows[parent + 1]
        rows.append(int(adjacency[above, slot]) if above >= 0 else -1)
    return torch.tensor(rows)


@pytest.mark.parametrize("template_name", ["2.2.2", "8"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_expansion_equals_a_node_by_node_walk(triton_backend, device, template_name, dtype) -> None:  # type: ignore[no-untyped-def]
    """Expanding the "2.2.2" (80 nodes, 6 levels) and "8" templates from 4 roots, one of them
    unknown to the matrix, over a matrix with 30% unknown slots gives, with the PyTorch twin
    (the drafter's path) and the kernel, the rows of a plain node-by-node walk."""
    g = torch.Generator().manual_seed(len(template_name))
    template = resolve_template(template_name, 8)
    adjacency = _adjacency(60, 8, g, 0.3, dtype)
    adjacency[7] = -1  # a root never seen: its whole tree is unknown
    for root in (0, 7, 31, 59):
        expected = _walk(adjacency, root, template)
        args = (template.parents, template.slots, template.level_starts)
        assert torch.equal(reference.expand_template(adjacency, root, *args), expected)
        got = ops.expand_template(adjacency.to(device), root, *args)
        assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("k", [8, 3])
def test_update_equals_sequential_writes_last_writer_wins(triton_backend, device, k) -> None:  # type: ignore[no-untyped-def]
    """Scattering 81 rows of top-K ids whose tokens repeat (20 distinct), with the PyTorch twin
    (the drafter's path) and the kernel, leaves the matrix that writing the rows one by one
    in order leaves: a repeated token keeps its last row."""
    g = torch.Generator().manual_seed(k)
    adjacency = _adjacency(50, k, g, 0.5, torch.int32)
    rows = torch.randint(0, 20, (81,), generator=g)
    topk = torch.randint(0, 50, (81, k), generator=g)
    expected = adjacency.clone()
    for row, ids in zip(rows.tolist(), topk, strict=True):
        expected[row] = ids.to(torch.int32)
    mine = adjacency.clone()
    reference.update_adjacency(mine, rows, topk)
    assert torch.equal(mine, expected)
    on_device = adjacency.to(device)
    ops.update_adjacency(on_device, rows, topk)
    assert torch.equal(on_device.cpu(), expected)
    last = int((rows == rows[0]).nonzero()[-1])
    assert torch.equal(on_device[rows[0]].cpu(), topk[last].to(torch.int32))


def test_the_drafter_routes_through_the_switch(triton_backend, device, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``TokenRecycling(kernels="triton")`` expands and updates with the kernels (a spy sees
    both launch each step) and, over 8 steps fed the same random logits and verdicts as a
    ``kernels="torch"`` drafter, proposes the same trees and keeps the same matrix."""
    from verispec.core.sampling import SamplingParams
    from verispec.core.types import DecodeState, StepOutcome
    from verispec.drafters import TokenRecycling
    from verispec.verifiers import Greedy

    launched: list[str] = []
    real = ops.kernel_module

    def spy(name: str):  # type: ignore[no-untyped-def]
        launched.append(name)
        return real(name)

    monkeypatch.setattr(ops, "kernel_module", spy)
    vocab, g = 40, torch.Generator().manual_seed(11)
    kernel_drafter = TokenRecycling("16", kernels="triton")
    torch_drafter = TokenRecycling("16", kernels="torch")
    tokens, proposed = [3, 7], 0
    for step in range(8):
        states = [
            DecodeState(list(tokens), 2, SamplingParams(), torch.Generator()) for _ in range(2)
        ]
        launched.clear()
        trees = [d.propose(s) for d, s in zip((kernel_drafter, torch_drafter), states, strict=True)]
        assert torch.equal(trees[0].tokens, trees[1].tokens)
        assert torch.equal(trees[0].parents, trees[1].parents)
        proposed += trees[0].num_nodes
        logits = torch.randn(trees[0].num_nodes + 1, vocab, generator=g)
        logits[:, step % 3] += 4.0  # the roots cycle over 3 tokens, so their rows get known
        verdict = Greedy(kernels="torch").verify(trees[1], logits)
        tokens.extend(verdict.committed_tokens(trees[1]))
        for drafter, tree, state in zip(
            (kernel_drafter, torch_drafter), trees, states, strict=True
        ):
            state.tokens.extend(verdict.committed_tokens(tree))
            on = logits.to(device) if drafter is kernel_drafter else logits
            drafter.observe(StepOutcome(tree, on, verdict, state))
        assert launched == (["token_recycling"] if step else []) + ["token_recycling"]
        assert torch.equal(kernel_drafter.adjacency.cpu(), torch_drafter.adjacency)
    assert proposed > 0  # the trees were not all empty
