"""GPU benchmarks of the Triton kernels against their PyTorch references and sdpa.

Every case is marked ``gpu`` (skipped without CUDA). Each timing synchronises the
device inside the timed call; pytest-benchmark warms up and reports min / median /
max. Shapes are the embedded model's: SmolLM2-135M has 9 query heads over 3 KV heads
of D = 64 and a vocabulary V = 49,152; trees of N = 16-256 nodes over committed
prefixes S = 256-4096 tokens. Run on a GPU machine::

    .venv/bin/python -m pytest benchmarks/test_kernels_gpu.py --benchmark-group-by=param

Tree attention is compared with (a) the kernel's PyTorch reference and (b)
``scaled_dot_product_attention`` with a dense boolean mask over prefix plus tree,
the fast path a user would otherwise take. ``test_token_recycling_end_to_end``
compares tokens/s of Token Recycling on the embedded model with the kernels on
(``attention="verispec"``, greedy kernel) and off (sdpa, ``Greedy``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from verispec.core.tree import DETERMINISTIC, DraftTree, WithoutReplacement
from verispec.drafters.templates import resolve_template
from verispec.kernels import ops, reference
from verispec.kernels.backend import use_backend
from verispec.kernels.block_order import dfs_order, permute_tree

pytestmark = pytest.mark.gpu

HEADS, KV_HEADS, HEAD_DIM, VOCAB = 9, 3, 64, 49152
NODES = (16, 32, 64, 128, 256)
PREFIXES = (256, 1024, 4096)


def _timed(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        out = fn()
        torch.cuda.synchronize()
        return out

    return run


def _random_tree(n: int, seed: int) -> DraftTree:
    """A random recursive tree (parent uniform among earlier nodes), numbered breadth-first."""
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(-1, i, (), generator=g)) for i in range(1, n)]
    tree = DraftTree.from_parents(list(range(n)), parents)
    depth = tree.depth.tolist()
    return permute_tree(tree, sorted(range(n), key=lambda i: depth[i]))


def _attention_inputs(n: int, s: int, dtype: torch.dtype = torch.float16) -> tuple:
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device="cuda", dtype=dtype)

    q = rand(1, HEADS, n, HEAD_DIM)
    return (
        q,
        rand(1, KV_HEADS, s, HEAD_DIM),
        rand(1, KV_HEADS, s, HEAD_DIM),
        rand(1, KV_HEADS, n, HEAD_DIM),
        rand(1, KV_HEADS, n, HEAD_DIM),
    )


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("nodes", NODES)
@pytest.mark.parametrize("impl", ["triton", "triton_dfs", "sdpa_dense", "reference"])
def test_tree_attention(benchmark, impl: str, nodes: int, prefix: int) -> None:  # type: ignore[no-untyped-def]
    """Tree attention for N tree nodes over an S-token prefix, float16, SmolLM2's heads."""
    tree = _random_tree(nodes, seed=nodes)
    if impl == "triton_dfs":
        tree = permute_tree(tree, dfs_order(tree))
    q, kp, vp, kt, vt = _attention_inputs(nodes, prefix)
    mask = tree.ancestor_mask.cuda()
    if impl in ("triton", "triton_dfs"):
        with use_backend("triton"):
            ops.tree_attention(q, kp, vp, kt, vt, mask)  # compile outside the timing
            benchmark(_timed(lambda: ops.tree_attention(q, kp, vp, kt, vt, mask)))
    elif impl == "reference":
        benchmark(_timed(lambda: reference.tree_attention(q, kp, vp, kt, vt, mask[None])))
    else:
        k, v = torch.cat([kp, kt], 2), torch.cat([vp, vt], 2)
        dense = torch.cat([torch.ones(nodes, prefix, dtype=torch.bool, device="cuda"), mask], 1)

        def sdpa() -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=dense, enable_gqa=True
            )

        benchmark(_timed(sdpa))


def _greedy_case() -> tuple[DraftTree, torch.Tensor]:
    template = resolve_template("2.2.2", 8)
    tree = DraftTree.from_parents(torch.arange(80) * 7, template.parents)
    logits = torch.randn(81, VOCAB, device="cuda")
    return tree, logits


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_greedy_verify(benchmark, impl: str) -> None:  # type: ignore[no-untyped-def]
    """Greedy verification of the 80-node "2.2.2" tree over V = 49,152 (packed verdict)."""
    tree, logits = _greedy_case()
    tokens, child_ptr, child_idx = ops.tree_csr(tree, logits.device)
    with use_backend(impl):
        ops.greedy_verify_packed(logits, tokens, child_ptr, child_idx, 8)
        benchmark(_timed(lambda: ops.greedy_verify_packed(logits, tokens, child_ptr, child_idx, 8)))


@pytest.mark.parametrize("law", ["deterministic", "without_replacement"])
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_rejection_verify(benchmark, impl: str, law: str) -> None:  # type: ignore[no-untyped-def]
    """Recursive rejection verification of the "2.2.2" tree over V = 49,152."""
    template = resolve_template("2.2.2", 8)
    g = torch.Generator().manual_seed(0)
    draft = torch.softmax(torch.randn(VOCAB, generator=g, dtype=torch.float64), 0)
    rule = DETERMINISTIC if law == "deterministic" else WithoutReplacement(draft)
    tree = DraftTree.from_parents(torch.arange(80) * 7, template.parents, rule)
    probs = torch.softmax(torch.randn(81, VOCAB, device="cuda", dtype=torch.float64), -1)
    codes, rows, drafts = ops.law_tensors(tree, VOCAB, probs.device)
    tokens, child_ptr, child_idx = ops.tree_csr(tree, probs.device)
    uniforms = torch.rand(81, device="cuda", dtype=torch.float64)
    args = (probs, drafts, rows, codes, tokens, child_ptr, child_idx, uniforms)
    with use_backend(impl):
        ops.rejection_verify_packed(*args)
        benchmark(_timed(lambda: ops.rejection_verify_packed(*args)))


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_token_recycling_expand_and_update(benchmark, impl: str) -> None:  # type: ignore[no-untyped-def]
    """One Token Recycling step's state work: expand "2.2.2" and update 81 rows (K = 8)."""
    template = resolve_template("2.2.2", 8)
    adjacency = torch.randint(0, VOCAB, (VOCAB, 8), device="cuda", dtype=torch.int32)
    topk = torch.randint(0, VOCAB, (81, 8), device="cuda")
    args = (template.parents.cuda(), template.slots.cuda(), template.level_starts)

    def step() -> None:
        rows = ops.expand_template(adjacency, 11, *args)
        ops.update_adjacency(adjacency, rows, topk)

    with use_backend(impl):
        step()
        benchmark(_timed(step))


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_kv_compaction(benchmark, impl: str) -> None:  # type: ignore[no-untyped-def]
    """Move 6 accepted entries into place in 30 layers x (keys, values), L = 4096, float16."""
    caches = [torch.randn(1, KV_HEADS, 4096, HEAD_DIM, device="cuda").half() for _ in range(60)]
    source = torch.tensor([4000, 4003, 4010, 4011, 4020, 4030], device="cuda")
    with use_backend(impl):
        ops.compact_kv(caches, 3990, source)
        benchmark(_timed(lambda: ops.compact_kv(caches, 3990, source)))


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["on", "off"])
def test_token_recycling_end_to_end(benchmark, kernels: str) -> None:  # type: ignore[no-untyped-def]
    """Tokens/s of Token Recycling ("2.2.2") on the embedded SmolLM2, 128 greedy tokens, CUDA,
    float16: tree attention, KV compaction, Token Recycling's updates and greedy verification
    by the kernels (on) or by sdpa and the PyTorch paths (off). Prints tokens/s and mean
    accepted tokens."""
    from verispec import SpeculativeDecoder
    from verispec.drafters import TokenRecycling
    from verispec.models import HFModel
    from verispec.models.default import load_default_model

    model, tokenizer = load_default_model(dtype=torch.float16, device="cuda")
    prompt = tokenizer.encode("Write a short story about a lighthouse keeper and a storm.")
    if kernels == "on":
        target, mode = HFModel(model.hf_model, attention="verispec"), "triton"
    else:
        target, mode = model, "torch"
    drafter = TokenRecycling("2.2.2", kernels=mode)
    decoder = SpeculativeDecoder(target, drafter, tokenizer=tokenizer, kernels=mode)
    with use_backend(mode):
        decoder.generate(prompt, max_new_tokens=32)  # warm-up and a hot adjacency matrix
        result = benchmark.pedantic(
            lambda: decoder.generate(prompt, max_new_tokens=128), rounds=3, warmup_rounds=1
        )
    model.hf_model.set_attn_implementation("sdpa")
    benchmark.extra_info["tokens_per_s"] = result.tokens_per_s
    benchmark.extra_info["mean_accepted_tokens"] = result.mean_accepted_tokens
    print(
        f"kernels {kernels}: {result.tokens_per_s:.1f} tok/s, MAT {result.mean_accepted_tokens:.2f}"
    )
