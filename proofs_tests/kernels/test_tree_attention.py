"""Tree attention: the Triton kernel equals the PyTorch reference; empty tiles are skipped."""

from __future__ import annotations

import pytest
import torch

from verispec.core.tree import DraftTree
from verispec.errors import TreeStructureError
from verispec.kernels import ops, reference

# Largest absolute error allowed against the float64 reference, per input dtype.
TOLERANCE = {
    torch.float64: 1e-12,
    torch.float32: 2e-5,
    torch.float16: 4e-3,  # p is rounded to float16 before p @ v, as in FlashAttention
    torch.bfloat16: 3e-2,
}


def _inputs(heads, kv_heads, n, s, d, dtype, device, seed, batch=1):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device, dtype)

    return (
        rand(batch, heads, n, d),
        rand(batch, kv_heads, s, d),
        rand(batch, kv_heads, s, d),
        rand(batch, kv_heads, n, d),
        rand(batch, kv_heads, n, d),
    )


def _check(q, kp, vp, kt, vt, tmask, pmask=None, **options):  # type: ignore[no-untyped-def]
    out = ops.tree_attention(q, kp, vp, kt, vt, tmask, prefix_mask=pmask, **options)
    f64 = [t.double() if t.dim() == 4 else t.double()[None] for t in (q, kp, vp, kt, vt)]
    tm = tmask if tmask.dim() == 3 else tmask[None]
    pm = None if pmask is None else (pmask if pmask.dim() == 3 else pmask[None])
    expected = reference.tree_attention(*f64, tm, pm).reshape(q.shape)
    assert out.dtype == q.dtype and out.shape == q.shape
    error = (out.double() - expected).abs().max().item()
    assert error <= TOLERANCE[q.dtype], error


def _tree_mask(parents: list[int], device: torch.device) -> torch.Tensor:
    return DraftTree.from_parents([0] * len(parents), parents).ancestor_mask.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_random_tree_each_dtype(triton_backend, device, make_parents, dtype) -> None:  # type: ignore[no-untyped-def]
    """On a random 37-node tree over a 45-token prefix with a partial prefix mask (GQA 4/2,
    D = 64, three query tiles), the kernel equals the reference within the dtype's tolerance."""
    g = torch.Generator().manual_seed(1)
    n, s = 37, 45
    tmask = _tree_mask(make_parents(n, g), device)
    pmask = (torch.rand(n, s, generator=g) < 0.7).to(device)
    _check(*_inputs(4, 2, n, s, 64, dtype, device, seed=2), tmask, pmask)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize(
    "shape",
    ["single node", "chain", "one full tile", "all visible", "no prefix", "nine heads"],
)
def test_awkward_shapes(triton_backend, device, make_parents, shape, head_dim) -> None:  # type: ignore[no-untyped-def]
    """N = 1, a 20-node chain, a 16-node tree in a single tile (no empty block), an
    all-visible mask (every tile full), S = 0, and SmolLM2's 9 heads over 3 KV heads:
    the kernel equals the float32 reference at D = 64 and D = 128."""
    g = torch.Generator().manual_seed(3)
    heads, kv_heads, s = 2, 1, 19
    if shape == "single node":
        parents = [-1]
    elif shape == "chain":
        parents = list(range(-1, 19))
    elif shape == "one full tile":
        parents = make_parents(16, g)
    elif shape == "all visible":
        parents = make_parents(24, g)
    elif shape == "no prefix":
        parents, s = make_parents(21, g), 0
    else:
        parents, heads, kv_heads = make_parents(5, g), 9, 3
    n = len(parents)
    tmask = _tree_mask(parents, device)
    if shape == "all visible":
        tmask = torch.ones_like(tmask)
    inputs = _inputs(heads, kv_heads, n, s, head_dim, torch.float32, device, seed=4)
    _check(*inputs, tmask, block_m=16, block_n=16)


def test_batch_and_three_dim_inputs(triton_backend, device, make_parents) -> None:  # type: ignore[no-untyped-def]
    """A batch of two with one shared mask, and (H, N, D) inputs without a batch axis, match
    the reference; a query whose masks hide every key gets zeros in both."""
    g = torch.Generator().manual_seed(5)
    n, s = 9, 7
    tmask = _tree_mask(make_parents(n, g), device)
    q, kp, vp, kt, vt = _inputs(2, 2, n, s, 64, torch.float32, device, seed=6, batch=2)
    _check(q, kp, vp, kt, vt, tmask)
    _check(q[0], kp[0], vp[0], kt[0], vt[0], tmask)
    blind = tmask.clone()
    blind[3] = False
    hidden = torch.ones(n, s, dtype=torch.bool, device=device)
    hidden[3] = False
    out = ops.tree_attention(q[0], kp[0], vp[0], kt[0], vt[0], blind, prefix_mask=hidden)
    assert torch.all(out[:, 3] == 0)
    _check(q[0], kp[0], vp[0], kt[0], vt[0], blind, hidden)


@pytest.mark.filterwarnings("ignore:All-NaN slice encountered")
def test_empty_tiles_are_never_read(triton_backend, device) -> None:
    """NaN keys and values in tiles that the ancestor mask leaves empty (a chain's upper
    triangle) never reach the output: the kernel skips those tiles instead of masking them."""
    n, s = 48, 16
    q, kp, vp, kt, vt = _inputs(2, 2, n, s, 64, torch.float32, device, seed=7)
    tmask = _tree_mask(list(range(-1, n - 1)), device)
    kt[:, :, 32:] = float("nan")  # keys 32..47: only queries 32..47 (the last tile) see them
    vt[:, :, 32:] = float("nan")
    out = ops.tree_attention(q, kp, vp, kt, vt, tmask, block_m=16, block_n=16)
    assert torch.isfinite(out[:, :, :32]).all()
    assert torch.isnan(out[:, :, 32:]).all()


def test_bad_shapes_are_refused() -> None:
    """Mismatched heads, a non-boolean mask and a mask of the wrong size raise
    TreeStructureError naming the argument."""
    q, kp, vp, kt, vt = _inputs(3, 2, 4, 5, 8, torch.float32, "cpu", seed=8)
    mask = torch.ones(4, 4, dtype=torch.bool)
    with pytest.raises(TreeStructureError, match="tree_key"):
        ops.tree_attention(q, kp, vp, kt, vt, mask)
    q = q[:, :2]
    with pytest.raises(TreeStructureError, match="tree_mask"):
        ops.tree_attention(q, kp, vp, kt, vt, mask.float())
    with pytest.raises(TreeStructureError, match="tree_mask"):
        ops.tree_attention(q, kp, vp, kt, vt, mask[:3, :3])


@pytest.mark.parametrize("head_dim", [96, 128])
def test_float64_at_head_dims_whose_scale_is_not_a_float32(
    triton_backend, device, make_parents, head_dim
) -> None:  # type: ignore[no-untyped-def]
    """At D = 96 and 128 (scales 96 ** -0.5 and 128 ** -0.5 are not float32 numbers) the
    float64 kernel equals the float64 reference within 1e-12 on a 21-node tree over a
    33-token prefix with a prefix mask."""
    g = torch.Generator().manual_seed(head_dim)
    n, s = 21, 33
    tmask = _tree_mask(make_parents(n, g), device)
    pmask = (torch.rand(n, s, generator=g) < 0.8).to(device)
    inputs = _inputs(3, 1, n, s, head_dim, torch.float64, device, seed=head_dim)
    _check(*[4 * t for t in inputs], tmask, pmask)  # larger scores: a wrong scale shows more


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
@pytest.mark.parametrize("splits", [2, 3, 5])
def test_split_over_the_prefix_equals_the_reference(
    triton_backend, device, make_parents, dtype, splits
) -> None:  # type: ignore[no-untyped-def]
    """Splitting a 70-token prefix over 2, 3 or 5 programs (16-key tiles; the last split
    shorter) and merging the partial softmaxes gives the
    reference within the dtype's tolerance; a query that sees no prefix key in some splits
    and one that sees no key at all (zeros) included."""
    g = torch.Generator().manual_seed(splits)
    n, s = 19, 70
    tmask = _tree_mask(make_parents(n, g), device)
    pmask = torch.rand(n, s, generator=g) < 0.6
    pmask[2, :40] = False  # sees only the later splits' keys
    pmask[5] = False
    tmask[5] = False  # sees nothing at all
    pmask = pmask.to(device)
    inputs = _inputs(4, 2, n, s, 64, dtype, device, seed=splits)
    _check(*inputs, tmask, pmask, block_m=16, block_n=16, num_splits=splits)
    out = ops.tree_attention(*inputs, tmask, prefix_mask=pmask, num_splits=splits)
    assert torch.all(out[..., 5, :] == 0)


@pytest.mark.parametrize("s", [0, 23])
@pytest.mark.parametrize("n", [1, 16, 45])
def test_causal_without_a_mask_equals_the_lower_triangle(triton_backend, device, n, s) -> None:  # type: ignore[no-untyped-def]
    """``tree_mask=None`` (a prefill: query i sees tree keys 0..i, computed in the kernel)
    equals the reference with the lower-triangular mask, for 1, 16 and 45 queries with and
    without a prefix, float32 and float64."""
    tril = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    for dtype in (torch.float32, torch.float64):
        q, kp, vp, kt, vt = _inputs(2, 1, n, s, 64, dtype, device, seed=n + s)
        out = ops.tree_attention(q, kp, vp, kt, vt, None, block_m=16, block_n=16)
        expected = ops.tree_attention(q, kp, vp, kt, vt, tril, kernels="torch")
        assert (out.double() - expected.double()).abs().max().item() <= TOLERANCE[dtype]


def test_prefix_splits_rule(monkeypatch) -> None:
    """The default split count is 1 on the CPU and for prefixes under 512 keys; on a GPU with
    132 multiprocessors it gives a 9-program grid enough splits for about two programs per
    multiprocessor (30) when the prefix allows (at least 256 keys each: 16 at S = 4096),
    and a grid that already fills the GPU (300 programs) none."""
    from verispec.kernels import _attention_host as host

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(host, "_sm_count", lambda device: 132)
    monkeypatch.setattr(host, "interpreting", lambda: False)
    assert host.prefix_splits(9, 4096, 64, torch.device("cpu")) == 1
    assert host.prefix_splits(9, 511, 64, cuda) == 1
    assert host.prefix_splits(9, 4096, 64, cuda) == 16
    assert host.prefix_splits(9, 100_000, 64, cuda) == 30
    assert host.prefix_splits(300, 100_000, 64, cuda) == 1


def test_bad_split_count_is_refused() -> None:
    """``num_splits=0`` raises ConfigError naming the argument."""
    from verispec.errors import ConfigError

    q, kp, vp, kt, vt = _inputs(2, 1, 3, 5, 8, torch.float32, "cpu", seed=9)
    with pytest.raises(ConfigError, match="`num_splits`"):
        ops.tree_attention(q, kp, vp, kt, vt, None, num_splits=0)
