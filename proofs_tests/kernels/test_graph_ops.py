"""Tests of verispec/kernels/graph_ops.py: the static attention of the graphed CUDA runtime.

On a machine without CUDA the kernel runs in Triton's interpreter (conftest); on a GPU
the same tests run it compiled, where the bit-for-bit cases are the ones that matter.
"""

from __future__ import annotations

import pytest
import torch

from verispec.core import DraftTree
from verispec.kernels.graph_ops import ATTENTION_TILES, static_attention
from verispec.models.accelerators.invariant import triton_static_attention
from verispec.models.attention import attend_static, on_buffers
from verispec.models.llama import PassKind

HEADS, KV_HEADS, HEAD_DIM, CAPACITY = 6, 2, 16, 320


def _cache(generator: torch.Generator, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A random float32 cache as the runtime holds it: values with a trailing ones column
    (the row sums of attend_static's value product)."""
    k = torch.randn(KV_HEADS, CAPACITY, HEAD_DIM, generator=generator)
    v = torch.randn(KV_HEADS, CAPACITY, HEAD_DIM, generator=generator)
    v = torch.cat([v, torch.ones(KV_HEADS, CAPACITY, 1)], -1)
    return k.to(device), v.to(device)


def _new(q_len: int, generator: torch.Generator, device: torch.device) -> list[torch.Tensor]:
    q = torch.randn(q_len, HEADS, HEAD_DIM, generator=generator)
    k, v = (torch.randn(q_len, KV_HEADS, HEAD_DIM, generator=generator) for _ in "kv")
    return [t.to(device) for t in (q, k, v)]


@pytest.mark.parametrize(("q_len", "start"), [(1, 0), (9, 100), (81, 230)])
def test_static_attention_equals_attend_static(
    device: torch.device, q_len: int, start: int
) -> None:
    """Same cache writes and, to float32 rounding (1e-5; the products sum in another order),
    the same attention as the whole-cache torch path, for tree masks over 1-81 new rows,
    GQA, and contexts that start, end and straddle key tiles."""
    generator = torch.Generator().manual_seed(q_len + start)
    cache_k, cache_v = _cache(generator, device)
    q, k, v = _new(q_len, generator, device)
    parents = [
        int(torch.randint(-1, i, (), generator=generator)) if i else -1 for i in range(q_len)
    ]
    mask = DraftTree.from_parents(torch.zeros(q_len, dtype=torch.long), parents).ancestor_mask
    mask = mask.to(device)
    where = torch.tensor(start, device=device)
    ref_k, ref_v = cache_k.clone(), cache_v.clone()
    expected = on_buffers(attend_static, q, k, v, ref_k, ref_v, where, mask)
    got = static_attention(q, k, v, cache_k, cache_v, where, mask)
    assert torch.equal(cache_k, ref_k) and torch.equal(cache_v, ref_v)
    assert got.shape == expected.shape == (q_len, HEADS * HEAD_DIM)
    assert (got - expected).abs().max().item() < 1e-5


@pytest.mark.gpu
def test_tree_rows_equal_sequential_rows_bit_for_bit(device: torch.device) -> None:
    """A chain of n new rows in one pass gives row j exactly the bits of a one-row pass at
    slot ``start + j`` over the same cache: the same keys, summed over the same tiles in the
    same order, whether a key is new (local mask) or committed (before ``where``).

    CUDA only: in Triton's interpreter ``tl.dot`` is numpy's float32 GEMM, whose rows depend
    on their place in the tile (its kernels take rows six at a time: rows 0-5 of a 16-row
    tile match a one-row product, row 6 on do not), so the property is the GPU's, where
    every row of a tile is summed alike."""
    generator = torch.Generator().manual_seed(5)
    cache_k, cache_v = _cache(generator, device)
    start, n = 57, 40  # rows straddle the 64-slot key tiles
    q, k, v = _new(n, generator, device)
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    tree = static_attention(q, k, v, cache_k, cache_v, torch.tensor(start, device=device), causal)
    for j in (0, 1, 6, 7, 39):
        one = torch.ones(1, 1, dtype=torch.bool, device=device)
        where = torch.tensor(start + j, device=device)
        row = static_attention(q[j : j + 1], k[j : j + 1], v[j : j + 1], cache_k.clone(),
                               cache_v.clone(), where, one)  # fmt: skip
        assert torch.equal(row[0], tree[j]), j


def test_rows_do_not_depend_on_the_pass_size(device: torch.device) -> None:
    """The root row of passes of 2 (a padded one-token step), 17, 64 and 129 rows over the
    same committed slots has the same bits: the rows after it only add masked keys."""
    generator = torch.Generator().manual_seed(6)
    cache_k, cache_v = _cache(generator, device)
    q, k, v = _new(129, generator, device)
    where = torch.tensor(100, device=device)
    roots = []
    for size in (2, 17, 64, 129):
        mask = torch.zeros(size, size, dtype=torch.bool, device=device)
        mask[:, 0] = True
        mask |= torch.eye(size, dtype=torch.bool, device=device)
        out = static_attention(q[:size], k[:size], v[:size], cache_k.clone(), cache_v.clone(),
                               where, mask)  # fmt: skip
        roots.append(out[0])
    assert all(torch.equal(roots[0], root) for root in roots[1:])


def test_by_position_a_branching_trees_rows_equal_sequential_rows(device: torch.device) -> None:
    """With ``by_position`` every node of a branching tree gets exactly the bits of a one-row
    pass for the same token after its ancestors were committed at consecutive slots (as
    the runtime's compaction leaves them): the keys are summed in sequence order, not by
    the slots the tree pass wrote them to. Without it the rows agree to rounding only.
    (No ``tl.dot`` here: the interpreter's sums are the GPU's in order, so this holds in
    both.)"""
    generator = torch.Generator().manual_seed(9)
    cache_k, cache_v = _cache(generator, device)
    start = 45  # the tree's slots straddle the 32-slot key tiles
    parents = [-1, -1, 0, 0, 1, 2, 2, 5, 3, 7, 4, 9]
    n = len(parents)
    q, k, v = _new(n, generator, device)
    mask = DraftTree.from_parents(torch.zeros(n, dtype=torch.long), parents).ancestor_mask
    mask = mask.to(device)
    where = torch.tensor(start, device=device)
    tree_k, tree_v = cache_k.clone(), cache_v.clone()
    tree = static_attention(q, k, v, tree_k, tree_v, where, mask, by_position=True)
    loose = static_attention(q, k, v, cache_k.clone(), cache_v.clone(), where, mask)
    for node in range(n):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path.reverse()  # root first
        seq_k, seq_v = cache_k.clone(), cache_v.clone()
        for depth, ancestor in enumerate(path[:-1]):  # committed, compacted
            seq_k[:, start + depth] = tree_k[:, start + ancestor]
            seq_v[:, start + depth] = tree_v[:, start + ancestor]
        one = torch.ones(1, 1, dtype=torch.bool, device=device)
        here = torch.tensor(start + len(path) - 1, device=device)
        alone = static_attention(q[node : node + 1], k[node : node + 1], v[node : node + 1],
                                 seq_k, seq_v, here, one, by_position=True)  # fmt: skip
        assert torch.equal(alone[0], tree[node]), node
        assert (loose[node] - tree[node]).abs().max().item() < 1e-5


def test_compiled_static_attention_equals_eager(device: torch.device) -> None:
    """Inside ``torch.compile(fullgraph=True, dynamic=True)`` the kernel is one opaque
    operator: the compiled function gives the eager function's bits, for two pass sizes
    with one compile."""
    generator = torch.Generator().manual_seed(7)
    compiled = torch.compile(static_attention, fullgraph=True, dynamic=True)
    for q_len in (5, 12):
        cache_k, cache_v = _cache(generator, device)
        q, k, v = _new(q_len, generator, device)
        mask = torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()
        where = torch.tensor(33, device=device)
        eager = static_attention(q, k, v, cache_k.clone(), cache_v.clone(), where, mask)
        got = compiled(q, k, v, cache_k.clone(), cache_v.clone(), where, mask)
        assert torch.equal(eager, got)


def test_rows_straddle_tiles_as_the_kernel_sees_them() -> None:
    """The tests above place rows and contexts across key-tile boundaries: the tiles are
    the constants they assume (never chosen from the row count)."""
    assert ATTENTION_TILES == (16, 32)


def test_bad_input_is_refused(device: torch.device) -> None:
    """A dtype other than float32, or heads that are not a multiple of the key heads, raise
    ValueError naming the argument and what is allowed, before anything is written."""
    generator = torch.Generator().manual_seed(8)
    cache_k, cache_v = _cache(generator, device)
    q, k, v = _new(3, generator, device)
    mask = torch.ones(3, 3, dtype=torch.bool, device=device)
    where = torch.tensor(0, device=device)
    before = cache_k.clone()
    with pytest.raises(ValueError, match="`q` and the caches must be float32"):
        static_attention(q.double(), k, v, cache_k, cache_v, where, mask)
    with pytest.raises(ValueError, match="not a multiple of the cache's 2 key heads"):
        static_attention(q[:, :5], k, v, cache_k, cache_v, where, mask)
    assert torch.equal(cache_k, before)


def test_the_runtime_runs_it_in_its_static_passes(device: torch.device) -> None:
    """``FastModel(attention="triton")`` swaps the kernel into every layer's static passes
    (those the CUDA graphs replay; here through the graphs' buffers without capturing) and
    its logits follow the torch static path's to float32 rounding, prefill and tree."""
    from verispec.models import FastModel, tiny_model
    from verispec.models.accelerators.graphs import GraphedForward

    hf = tiny_model("llama", vocab_size=64, seed=2, dtype=torch.float32, hidden_size=64)
    models = []
    for attention in ("torch", "triton"):
        model = FastModel(hf.hf_model.to(device), cuda_graphs=False, attention=attention)
        model._shared.wrapper = GraphedForward(model.transformer, capture=False)
        models.append(model)
    assert all(
        block.attention.cores[PassKind.STATIC].func is triton_static_attention  # type: ignore[attr-defined]
        for block in models[1].transformer.blocks
    )
    tree = DraftTree.from_parents([7, 8, 9, 10, 11], [-1, 0, 1, -1, 3])
    rows = []
    for model in models:
        model.prefill(torch.tensor([3, 1, 4, 1, 5, 9, 2, 6]))
        rows.append(model.forward_tree(tree))
    assert (rows[0] - rows[1]).abs().max().item() < 1e-4


# -- the batch-invariant products and norms ---------------------------------------------

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
"""Relative to the largest output: float32 ~ 100 ulps of a 72-term sum; the half types a
unit of their last place (2^-10, 2^-7) plus the interpreter's float32 products."""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 17, 130])
def test_invariant_linear_equals_the_product(
    device: torch.device, dtype: torch.dtype, rows: int
) -> None:
    """``x @ w.T + b`` summed in float64 and rounded once agrees with the kernel to the
    dtype's rounding, for one row, one past the 16-row tile and several tiles, and odd
    widths (K = 72, N = 200, neither a multiple of a tile)."""
    from verispec.kernels.graph_ops import invariant_linear

    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 72, generator=generator).to(device, dtype)
    w = torch.randn(200, 72, generator=generator).to(device, dtype)
    b = torch.randn(200, generator=generator).to(device, dtype)
    expected = (x.double() @ w.double().T + b.double()).to(dtype)
    got = invariant_linear(x, w, b)
    assert got.dtype == dtype and got.shape == (rows, 200)
    scale = expected.double().abs().max().item()
    assert (got.double() - expected.double()).abs().max().item() <= TOLERANCE[dtype] * scale
    assert torch.equal(invariant_linear(x, w), invariant_linear(x, w, None))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_invariant_rms_norm_equals_rms_norm(device: torch.device, dtype: torch.dtype) -> None:
    """Row by row it is ``F.rms_norm`` (in float32, rounded once) to the dtype's rounding."""
    from verispec.kernels.graph_ops import invariant_rms_norm

    generator = torch.Generator().manual_seed(3)
    x = torch.randn(7, 576, generator=generator).to(device, dtype)
    w = torch.randn(576, generator=generator).to(device, dtype)
    expected = torch.nn.functional.rms_norm(x.float(), (576,), w.float(), 1e-5).to(dtype)
    got = invariant_rms_norm(x, w, 1e-5)
    scale = expected.double().abs().max().item()
    assert (got.double() - expected.double()).abs().max().item() <= TOLERANCE[dtype] * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_row_has_the_same_bits_at_the_top_of_any_pass(
    device: torch.device, dtype: torch.dtype
) -> None:
    """The first row of a product (and of a norm) over 1, 2, 17, 81 and 256 rows has the
    same bits: one kernel for every row count, summed in one order. (Its place in the tile
    is the same: the interpreter's products depend on it, the GPU's do not; see below.)"""
    from verispec.kernels.graph_ops import invariant_linear, invariant_rms_norm

    generator = torch.Generator().manual_seed(4)
    x = torch.randn(256, 200, generator=generator).to(device, dtype)
    w = torch.randn(96, 200, generator=generator).to(device, dtype)
    norm_w = torch.randn(200, generator=generator).to(device, dtype)
    first = [invariant_linear(x[:rows], w)[0] for rows in (1, 2, 17, 81, 256)]
    assert all(torch.equal(first[0], row) for row in first[1:])
    normed = [invariant_rms_norm(x[:rows], norm_w, 1e-6)[0] for rows in (1, 2, 17, 81, 256)]
    assert all(torch.equal(normed[0], row) for row in normed[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_row_has_its_own_bits_whatever_its_neighbours(
    device: torch.device, dtype: torch.dtype
) -> None:
    """On CUDA every row of an 81-row product equals the product of that row alone and its
    place in a shuffled pass, bit for bit: what tree rows equal to sequential rows needs.
    (CUDA only: the interpreter's ``tl.dot`` is numpy's GEMM, whose rows depend on their
    place in the tile.)"""
    from verispec.kernels.graph_ops import invariant_linear

    generator = torch.Generator().manual_seed(5)
    x = torch.randn(81, 576, generator=generator).to(device, dtype)
    w = torch.randn(1536, 576, generator=generator).to(device, dtype)
    whole = invariant_linear(x, w)
    perm = torch.randperm(81, generator=generator).to(device)
    shuffled = invariant_linear(x[perm], w)
    assert torch.equal(shuffled, whole[perm])
    for i in (0, 5, 6, 17, 80):
        assert torch.equal(invariant_linear(x[i : i + 1], w)[0], whole[i]), i


def test_compiled_invariant_ops_equal_eager(device: torch.device) -> None:
    """Inside ``torch.compile(fullgraph=True)`` the product and the norm are opaque operators
    with the eager bits."""
    from verispec.kernels.graph_ops import invariant_linear, invariant_rms_norm

    def block(x: torch.Tensor, w: torch.Tensor, norm_w: torch.Tensor) -> torch.Tensor:
        return invariant_linear(invariant_rms_norm(x, norm_w, 1e-5), w).relu()

    generator = torch.Generator().manual_seed(6)
    x = torch.randn(5, 64, generator=generator).to(device)
    w = torch.randn(32, 64, generator=generator).to(device)
    norm_w = torch.randn(64, generator=generator).to(device)
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    assert torch.equal(compiled(x, w, norm_w), block(x, w, norm_w))


def test_invariant_ops_refuse_bad_input(device: torch.device) -> None:
    """Mixed dtypes, shapes that do not multiply and a norm weight of the wrong width raise
    ValueError naming the arguments."""
    from verispec.kernels.graph_ops import invariant_linear, invariant_rms_norm

    x = torch.randn(3, 8, device=device)
    with pytest.raises(ValueError, match="`x` and `weight` must share one dtype"):
        invariant_linear(x, torch.randn(4, 8, device=device).half())
    with pytest.raises(ValueError, match=r"`x` must be \(M, K\) and `weight` \(N, K\)"):
        invariant_linear(x, torch.randn(4, 9, device=device))
    with pytest.raises(ValueError, match=r"`x` must be \(M, E\) and `weight` \(E,\)"):
        invariant_rms_norm(x, torch.randn(9, device=device), 1e-5)


def test_batch_invariant_runtime_follows_the_default(device: torch.device) -> None:
    """``FastModel(batch_invariant=True)`` swaps every product and norm (the same parameters,
    not copies) and the static attention, says so in ``runtime``, reports its rows as
    invariant, and its logits follow the default runtime's (to 1e-4: other summation
    orders), prefill and tree pass, through the graphs' static buffers."""
    from verispec.kernels.graph_ops import InvariantLinear, InvariantRMSNorm
    from verispec.models import FastModel, tiny_model
    from verispec.models.accelerators.graphs import GraphedForward

    hf = tiny_model("llama", vocab_size=64, seed=2, dtype=torch.float32, hidden_size=64)
    plain = FastModel(hf.hf_model.to(device), cuda_graphs=False, attention="torch", prepack=False)
    model = FastModel(hf.hf_model.to(device), cuda_graphs=False, batch_invariant=True)
    linears = [m for m in model.transformer.modules() if type(m) is torch.nn.Linear]
    assert not linears and model.row_invariant and "+batch-invariant" in model.runtime
    swapped = [m for m in model.transformer.modules() if isinstance(m, InvariantLinear)]
    assert len(swapped) == 4 * len(model.transformer.blocks) + 1
    assert sum(isinstance(m, InvariantRMSNorm) for m in model.transformer.modules()) == (
        2 * len(model.transformer.blocks) + 1
    )
    params = [sum(p.numel() for p in m.transformer.parameters()) for m in (plain, model)]
    assert params[0] == params[1]  # the same parameters, moved into the new modules
    tree = DraftTree.from_parents([7, 8, 9, 10, 11], [-1, 0, 1, -1, 3])
    rows = []
    for m in (plain, model):
        m._shared.wrapper = GraphedForward(m.transformer, capture=False)
        m.prefill(torch.tensor([3, 1, 4, 1, 5, 9, 2, 6]))
        rows.append(m.forward_tree(tree))
    assert (rows[0] - rows[1]).abs().max().item() < 1e-4
