"""Greedy tree verification: kernel = reference = ``verispec.verifiers.Greedy``, exactly."""

from __future__ import annotations

import pytest
import torch

from verispec.core.tree import DraftTree
from verispec.kernels import ops, reference
from verispec.verifiers import Greedy


def _greedy_friendly_tree(
    logits: torch.Tensor, parents: list[int], g: torch.Generator
) -> DraftTree:
    """Tokens that follow the argmax most of the time, so paths of several nodes get accepted."""
    best = logits.argmax(-1)
    vocab = logits.shape[1]
    tokens = [
        int(best[p + 1]) if float(torch.rand((), generator=g)) < 0.6
        else int(torch.randint(0, vocab, (), generator=g))
        for p in parents
    ]  # fmt: skip
    return DraftTree.from_parents(tokens, parents)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_kernel_equals_greedy_on_random_trees(triton_backend, device, make_parents, dtype) -> None:  # type: ignore[no-untyped-def]
    """On 4 random trees of 1-40 nodes (chains included) over V = 300 (two vocabulary tiles)
    the kernels' verdict equals ``Greedy``'s and the reference's, for every logits dtype."""
    g = torch.Generator().manual_seed(len(str(dtype)))
    for trial in range(4):
        n = 1 + int(torch.randint(0, 40, (), generator=g))
        parents = make_parents(n, g, chain_bias=0.8 if trial % 2 else 0.0)
        logits = torch.randn(n + 1, 300, generator=g).to(dtype)
        tree = _greedy_friendly_tree(logits.float(), parents, g)
        expected = Greedy(kernels="torch").verify(tree, logits)
        assert ops.greedy_verify(tree, logits.to(device)) == expected
        tokens, child_ptr, child_idx = ops.tree_csr(tree, torch.device("cpu"))
        packed = reference.greedy_verify(logits, tokens, child_ptr, child_idx)
        assert ops.unpack_verdict(packed) == expected


def test_ties_empty_tree_and_duplicate_siblings(triton_backend, device) -> None:
    """Ties go to the lowest token id, as ``torch.argmax``; a tree that is only the root
    gives the root's argmax; of two siblings with the argmax token the first is accepted."""
    logits = torch.zeros(4, 40)
    logits[0, [5, 33]] = 2.0  # a tie across vocabulary tiles: 5 wins
    logits[1, [7, 9]] = 1.0
    tree = DraftTree.from_parents([5, 5, 7], [-1, -1, 0])
    verdict = Greedy(kernels="triton").verify(tree, logits.to(device))
    assert verdict == Greedy(kernels="torch").verify(tree, logits)
    assert verdict.accepted == (0, 2)
    empty = DraftTree.empty()
    assert ops.greedy_verify(empty, logits[:1].to(device)).extra_token == 5
    minus_inf = torch.full((1, 20), float("-inf"))
    assert ops.greedy_verify(empty, minus_inf.to(device)).extra_token == 0


def test_greedy_routes_to_the_kernels(triton_backend, device, make_parents, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``Greedy(kernels="triton")`` runs the greedy kernels (a spy sees the launch) and gives
    ``Greedy(kernels="torch")``'s verdict on 6 random trees of up to 30 nodes."""
    launched: list[str] = []
    real = ops.kernel_module

    def spy(name: str):  # type: ignore[no-untyped-def]
        launched.append(name)
        return real(name)

    monkeypatch.setattr(ops, "kernel_module", spy)
    g = torch.Generator().manual_seed(12)
    for _ in range(6):
        n = int(torch.randint(1, 30, (), generator=g))
        logits = torch.randn(n + 1, 200, generator=g)
        tree = _greedy_friendly_tree(logits, make_parents(n, g), g)
        launched.clear()
        verdict = Greedy(kernels="triton").verify(tree, logits.to(device))
        assert launched == ["greedy_verify"]
        assert verdict == Greedy(kernels="torch").verify(tree, logits)
