"""Tests of verispec/models/accelerators/blocks.py: the CPU kernel that reads GGUF blocks.

What it promises: the blocks it finds widen to the float32 matrix bit for bit (so the model
is unchanged); its products equal its float32 twin on the widened matrix bit for bit and
torch's product to rounding; a row's result does not depend on the row count or the thread
count; and FastModel on those products keeps tree rows equal to sequential decoding, bit for
bit, from a single row.
"""

from __future__ import annotations

import ctypes

import pytest
import torch
from block_checks import assert_avx512_equals_avx2, assert_rows_invariant
from hypothesis import given, settings
from hypothesis import strategies as st
from model_references import decoded_tree_reference, draft_trees, tree_reference
from torch import nn

from verispec.core import DraftTree
from verispec.errors import ConfigError
from verispec.kernels.cpu.features import cpu_flags
from verispec.models import FastModel, tiny_model
from verispec.models.accelerators import blocks as cpu_linear
from verispec.models.accelerators.blocks import (
    BLOCK_FORMATS,
    BlockLinear,
    as_q4_1,
    kernel_status,
    quantize_blocks,
    recover_blocks,
)
from verispec.models.accelerators.c_layers import LayerKernel
from verispec.models.attention import attend, on_buffers
from verispec.models.llama import PassInputs, PassKind
from verispec.models.runtime import PROMPT_PASS_TOKENS, prompt_pass_tokens

available, why = kernel_status()
needs_kernel = pytest.mark.skipif(not available, reason=f"block kernel unavailable: {why}")
V = 64


def _linear(rows: int, cols: int, fmt: str | None, seed: int = 0, bias: bool = False) -> nn.Linear:
    generator = torch.Generator().manual_seed(seed)
    linear = nn.Linear(cols, rows, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(rows, cols, generator=generator) * 0.05)
        if fmt is not None:
            linear.weight.copy_(quantize_blocks(linear.weight, fmt))  # type: ignore[arg-type]
        if bias:
            linear.bias.copy_(torch.randn(rows, generator=generator))
    return linear


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_recovered_blocks_widen_to_the_matrix_bit_for_bit(fmt: str) -> None:
    """A matrix rounded to a block format (a query-row style scale by 1/8 included) is found
    to be blocks, and widening them gives back every float32 bit."""
    linear = _linear(96, 256, fmt)
    with torch.no_grad():
        linear.weight[:32] *= 0.125  # the runtime folds the softmax scale in like this
    block = BlockLinear.from_linear(linear, (fmt,))  # type: ignore[arg-type]
    assert block is not None and block.fmt == fmt
    if available:
        assert torch.equal(block.dequantized(), linear.weight)


def test_q4_0_matrices_are_found_and_held_as_q4_0_blocks() -> None:
    """A matrix rounded to Q4_0 (``w = (q - 8) d``; query-row style scale included) is not
    Q4_1 by the Q4_1 rule, but is found as Q4_0 and held as Q4_0 blocks (20 bytes for 32
    weights), or as Q4_1 blocks with ``m = -8 d`` for integer products; both widenings give
    back every float32 bit."""
    linear = _linear(96, 256, "q4_0")
    with torch.no_grad():
        linear.weight[:32] *= 0.125
    weight = linear.weight.detach()
    assert recover_blocks(weight, "q4_1") is None
    assert recover_blocks(weight, "q8_0") is None
    block = BlockLinear.from_linear(linear, BLOCK_FORMATS)
    assert block is not None and block.fmt == "q4_0"
    assert tuple(block.blocks.shape) == (96, 256 // 32 * 20)
    if available:
        assert torch.equal(block.dequantized(), weight)
        wide = BlockLinear("q4_1", as_q4_1(block.blocks), 256, 96, None)
        assert torch.equal(wide.dequantized(), weight)
        ints = BlockLinear.from_linear(linear, BLOCK_FORMATS, "int8")
        assert ints is not None and ints.fmt == "q4_1"
        assert torch.equal(ints.dequantized(), weight)


def test_a_matrix_that_is_not_blocks_is_refused() -> None:
    """Random float32 weights, a width not a multiple of 32 and non-finite values are not
    blocks: recover_blocks says so instead of approximating."""
    assert recover_blocks(_linear(8, 64, None).weight.detach(), "q4_1") is None
    assert recover_blocks(_linear(8, 64, None).weight.detach(), "q8_0") is None
    assert recover_blocks(_linear(8, 64, None).weight.detach(), "q4_0") is None
    assert recover_blocks(torch.zeros(4, 48), "q4_1") is None
    weight = quantize_blocks(_linear(4, 64, None).weight.detach(), "q4_1")
    weight[0, 0] = float("nan")
    assert recover_blocks(weight, "q4_1") is None


def test_quantize_blocks_names_a_bad_matrix() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_blocks(torch.zeros(4, 40), "q4_1")


@needs_kernel
@pytest.mark.parametrize("fmt", ["q4_1", "q4_0", "q8_0"])
@pytest.mark.parametrize("bias", [False, True])
def test_block_product_equals_its_float32_twin_bit_for_bit(fmt: str, bias: bool) -> None:
    """The block product equals the kernel's float32 product on the widened matrix bit for bit
    (same chains of fused multiply-adds), and torch's float32 product to rounding."""
    linear = _linear(72, 576, fmt, bias=bias)  # 72 rows: 18 whole tiles of 4, no tail
    block = BlockLinear.from_linear(linear, (fmt,))  # type: ignore[arg-type]
    twin = BlockLinear.from_linear(linear, ("float32",))
    assert block is not None and twin is not None
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(1))
    got = block(x)
    assert torch.equal(got, twin(x))
    expected = nn.functional.linear(
        x.double(), linear.weight.double(), None if not bias else linear.bias.double()
    )
    assert (got.double() - expected).abs().max().item() < 1e-5


@needs_kernel
@pytest.mark.parametrize("fmt", ["q4_1", "q4_0", "q8_0", "float32"])
def test_rows_do_not_depend_on_row_count_or_threads(fmt: str) -> None:
    """Each row's bits are the same for 1 to 40 rows, and on one or two threads (a tail of
    3 output rows included: 4-row tiles plus one of 3)."""
    linear = _linear(67, 1536, None if fmt == "float32" else fmt)
    block = BlockLinear.from_linear(linear, (fmt,))  # type: ignore[arg-type]
    assert block is not None
    x = torch.randn(40, 1536, generator=torch.Generator().manual_seed(2))
    assert_rows_invariant(block, x)
    assert torch.equal(block(x[7:8]), block(x)[7:8])


@needs_kernel
@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU has no AVX-512")
@pytest.mark.parametrize("fmt", ["q4_1", "q4_0", "q8_0", "float32"])
def test_avx512_products_equal_the_avx2_products_bit_for_bit(fmt: str) -> None:
    """On an AVX-512 CPU the native build (16-lane registers, up to 12 rows widened in
    registers) gives every bit the eight-lane AVX2 build gives, for 1 to 20 rows (the
    register paths and the buffer), with a bias, on one or two threads: the model's numbers
    do not depend on which of the CPU kinds runs it."""
    linear = _linear(67, 1536, None if fmt == "float32" else fmt, seed=3, bias=True)
    block = BlockLinear.from_linear(linear, (fmt,))  # type: ignore[arg-type]
    assert block is not None
    assert_avx512_equals_avx2(
        block, torch.randn(20, 1536, generator=torch.Generator().manual_seed(4))
    )


# -- the runtime on block products --------------------------------------------------------

_MODELS: dict[tuple, FastModel] = {}


def blocks_model(max_length: int = 256, attention: str = "auto") -> FastModel:
    """A tiny float32 Llama (width 64) with 4-bit weights, every product the block kernel."""
    key = (max_length, attention)
    if key not in _MODELS:
        hf = tiny_model(
            "llama", vocab_size=V, seed=1, dtype=torch.float32, hidden_size=64,
            max_length=max_length,
        ).hf_model  # fmt: skip
        _MODELS[key] = FastModel(hf, dtype=torch.float32, weights="q4_1", attention=attention)
    return _MODELS[key]


@needs_kernel
def test_q4_1_model_reads_every_matrix_as_blocks() -> None:
    """weights='q4_1' rounds every matrix and reads it as blocks: no dense product is left,
    and a one-token pass runs on one row."""
    model = blocks_model()
    assert model.runtime == "eager+GGUF blocks+C layers"
    assert model._shared.layers is not None
    linears = [m for m in model.transformer.modules() if isinstance(m, nn.Linear | BlockLinear)]
    assert linears and all(isinstance(m, BlockLinear) for m in linears)
    assert model.transformer.output.fmt == "q8_0"
    assert model._shared.bucket(1) == 1


@needs_kernel
@needs_kernel
@pytest.mark.parametrize("arithmetic", ["exact", "int8"])
def test_a_q4_0_model_runs_on_blocks_with_sequential_tree_rows(arithmetic: str) -> None:
    """A model whose every matrix is Q4_0 (as llama.cpp's Q4_0 files hold them, the head
    too) runs every product on the block kernel, the layers in C, in either arithmetic; its
    tree rows equal decoding their paths one token at a time, bit for bit."""
    hf = tiny_model("llama", vocab_size=V, seed=5, dtype=torch.float32, hidden_size=64).hf_model
    with torch.no_grad():
        for linear in hf.modules():
            if isinstance(linear, nn.Linear):
                linear.weight.copy_(quantize_blocks(linear.weight, "q4_0"))
    model = FastModel(hf, dtype="auto", arithmetic=arithmetic)
    ints = "+int8 products" if arithmetic == "int8" else ""
    assert model.runtime == f"eager+GGUF blocks{ints}+C layers"
    linears = [m for m in model.transformer.modules() if isinstance(m, nn.Linear | BlockLinear)]
    layout = "q4_1" if arithmetic == "int8" else "q4_0"  # integer products: Q4_1 panels
    assert linears and all(isinstance(m, BlockLinear) and m.fmt == layout for m in linears)
    prompt = [5, 6, 7, 8]
    tree = DraftTree.from_parents(torch.tensor([9, 10, 11, 12, 13]), [-1, 0, 1, -1, 3])
    model.prefill(torch.tensor(prompt))
    assert torch.equal(model.forward_tree(tree), tree_reference(model, prompt, tree))


@pytest.mark.parametrize("attention", ["auto", "torch"])
@settings(max_examples=15, deadline=None)
@given(prompt=st.lists(st.integers(0, V - 1), min_size=1, max_size=8), tree=draft_trees(V, 14))
def test_block_tree_rows_are_bitwise_sequential(
    attention: str, prompt: list[int], tree: DraftTree
) -> None:
    """On block products, each tree row is bit for bit the row that decoding its path one
    token at a time gives (single-token passes are not padded any more: the torch attention
    pads its own products), with each layer in one C call and with torch's operators."""
    model = blocks_model(attention=attention)
    model.prefill(torch.tensor(prompt))
    assert torch.equal(model.forward_tree(tree), tree_reference(model, prompt, tree))


@needs_kernel
@settings(max_examples=6, deadline=None)
@given(
    prompt=st.integers(100, 127).flatmap(
        lambda n: st.lists(st.integers(0, V - 1), min_size=n, max_size=n)
    ),
    tree=draft_trees(V, max_nodes=30),
)
def test_block_tree_rows_across_a_value_block(prompt: list[int], tree: DraftTree) -> None:
    """Where the tree straddles slot 128, tree rows still equal greedy decoding bit for bit
    (the torch attention, whose value product is summed per block of 128 slots)."""
    model = blocks_model(512, attention="torch")
    model.prefill(torch.tensor(prompt))
    assert torch.equal(model.forward_tree(tree), decoded_tree_reference(model, prompt, tree))


@needs_kernel
@settings(max_examples=6, deadline=None)
@given(
    prompt=st.integers(PROMPT_PASS_TOKENS + 1, 90).flatmap(
        lambda n: st.lists(st.integers(0, V - 1), min_size=n, max_size=n)
    ),
    tree=draft_trees(V, max_nodes=14),
)
def test_block_tree_rows_after_a_prompt_pass(prompt: list[int], tree: DraftTree) -> None:
    """After a prompt long enough for the prompt pass (GEMMs and fused attention, whose rows
    are not row-invariant; one thread, where its threshold is ``PROMPT_PASS_TOKENS``), each
    tree row is still bit for bit the row greedy decoding computes from the same prefill,
    with every layer in one C call."""
    model = blocks_model()  # one thread: the autouse fixture of these tests
    model.prefill(torch.tensor(prompt))
    assert torch.equal(model.forward_tree(tree), decoded_tree_reference(model, prompt, tree))


@needs_kernel
def test_the_prompt_pass_equals_the_tree_kernels_prefill_to_rounding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 300-token prompt (a 512-token chunk and no more) prefilled by the prompt pass, its
    GEMMs over widened blocks (each weight widened once, though the feed-forward runs in
    chunks of 64 rows) and its fused attention both used, leaves the cache entries and the
    root's logits of a prefill on the tree kernels, to rounding."""
    import verispec.models.llama as llama
    import verispec.models.runtime as runtime

    calls = {"attention": 0, "widened": 0}

    def counted(name: str, function):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls[name] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(BlockLinear, "dequantized", counted("widened", BlockLinear.dequantized))
    monkeypatch.setattr(llama, "PROMPT_MLP_ROWS", 64)
    model = blocks_model(512)
    for block in model.transformer.blocks:
        cores = block.attention.cores
        monkeypatch.setitem(cores, PassKind.PROMPT, counted("attention", cores[PassKind.PROMPT]))
    prompt = torch.randint(0, V, (300,), generator=torch.Generator().manual_seed(3))
    model.prefill(prompt)
    layers = len(model.transformer.blocks)
    # qkv, o, w13, w2 a layer; the last layer writes only its keys and values (its output
    # feeds no row: the root is the next pass's)
    assert calls == {"attention": layers - 1, "widened": 4 * (layers - 1) + 1}
    fast_root = model.forward_tree(DraftTree.empty())[0]
    monkeypatch.setattr(runtime, "PROMPT_PASS_TOKENS", 10**9)
    view = model.self_draft(model.layer_indices)  # same weights, own cache
    view.prefill(prompt)
    assert calls == {"attention": layers - 1, "widened": 4 * (layers - 1) + 1}  # tree kernels
    root = view.forward_tree(DraftTree.empty())[0]
    assert (fast_root - root).abs().max().item() < 1e-4 * root.abs().max().item()
    for (k, v), (k_ref, v_ref) in zip(model.kv_cache(), view.kv_cache(), strict=True):
        assert (k - k_ref).abs().max().item() < 1e-4 * k_ref.abs().max().item()
        assert (v - v_ref).abs().max().item() < 1e-4 * v_ref.abs().max().item()


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_the_prompt_pass_threshold_follows_the_thread_count(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """A prompt of ``PROMPT_PASS_TOKENS + 1`` tokens (its last is the root, fed by the first
    step) runs the prompt pass (its fused attention called) at one thread and the tree
    kernels at two, where the threshold is twice as long (``prompt_pass_tokens``); one of
    ``2 PROMPT_PASS_TOKENS + 1`` tokens runs the prompt pass at both."""
    assert prompt_pass_tokens(1) == PROMPT_PASS_TOKENS
    assert prompt_pass_tokens(2) == prompt_pass_tokens(8) == 2 * PROMPT_PASS_TOKENS
    calls = {"attention": 0}

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["attention"] += 1
        return attend_prompt(*args, **kwargs)

    model = blocks_model(512)
    attend_prompt = model.transformer.blocks[0].attention.cores[PassKind.PROMPT]
    for block in model.transformer.blocks:
        monkeypatch.setitem(block.attention.cores, PassKind.PROMPT, counted)
    kept = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for length, prompt_pass in [
            (PROMPT_PASS_TOKENS + 1, threads == 1),
            (2 * PROMPT_PASS_TOKENS + 1, True),
        ]:
            calls["attention"] = 0
            model = blocks_model(512)
            model.prefill(
                torch.randint(0, V, (length,), generator=torch.Generator().manual_seed(1))
            )
            assert (calls["attention"] > 0) == prompt_pass, (length, threads)
    finally:
        torch.set_num_threads(kept)


@needs_kernel
@pytest.mark.parametrize("length", [PROMPT_PASS_TOKENS + 1, 300])
def test_a_prefill_skips_the_last_layers_rows_and_caches_the_same_bits(
    monkeypatch: pytest.MonkeyPatch, length: int
) -> None:
    """A prefill chunk whose rows nobody reads runs the last layer's keys and values only;
    every layer's cache, and the root's logits after it, are bit for bit those of the full
    pass (attention, feed-forward and final norm of the last layer run and thrown away)."""
    from verispec.models.llama import Transformer

    prompt = torch.randint(0, V, (length,), generator=torch.Generator().manual_seed(5))
    model = blocks_model(512)
    model.prefill(prompt)
    root = model.forward_tree(DraftTree.empty())
    skipped = [(k.clone(), v.clone()) for k, v in model.kv_cache()]
    ran = {"blocks": 0}

    def full_pass(self, x, inputs, p):  # type: ignore[no-untyped-def]
        ran["blocks"] += 1
        return self._blocks(x, inputs, p)[:0]

    monkeypatch.setattr(Transformer, "_write_caches", full_pass)
    model.prefill(prompt)
    assert ran["blocks"] == 1
    assert torch.equal(model.forward_tree(DraftTree.empty()), root)
    for (k, v), (k_ref, v_ref) in zip(skipped, model.kv_cache(), strict=True):
        assert torch.equal(k, k_ref) and torch.equal(v, v_ref)


def test_weights_choices_are_checked() -> None:
    """An unknown `weights` and `weights='blocks'` on a model that is not blocks are refused
    with the argument named; 'auto' falls back to dense products there."""
    hf = tiny_model("llama", vocab_size=V, seed=1, dtype=torch.float32, hidden_size=64).hf_model
    with pytest.raises(ConfigError, match="`weights` must be one of"):
        FastModel(hf, weights="int3")
    with pytest.raises(ConfigError, match="weights='blocks'"):
        FastModel(hf, weights="blocks")
    assert "blocks" not in FastModel(hf, weights="auto").runtime
    assert "blocks" not in FastModel(hf, weights="dense").runtime


def test_without_the_kernel_auto_runs_dense_and_blocks_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the kernel cannot be built, weights='auto' keeps oneDNN on a model that is
    blocks, and weights='blocks' fails naming why."""
    import verispec.models.accelerators.blocks as cpu_linear

    monkeypatch.setattr(cpu_linear, "_STATE", {"lib": None, "why": "no C compiler (test)"})
    hf = tiny_model("llama", vocab_size=V, seed=1, dtype=torch.float32, hidden_size=64).hf_model
    with torch.no_grad():
        for linear in [m for m in hf.modules() if isinstance(m, nn.Linear)]:
            linear.weight.copy_(quantize_blocks(linear.weight, "q4_1"))
    assert FastModel(hf, weights="auto").runtime == "eager+oneDNN"
    with pytest.raises(ConfigError, match=r"weights='blocks'.*no C compiler \(test\)"):
        FastModel(hf, weights="blocks")


def test_a_missing_compiler_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """A compiler that does not exist makes the build fail with a reason (kernel_status),
    and nothing is left in the kernel cache."""
    import verispec.models.accelerators.blocks as cpu_linear

    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_linear, "_STATE", {})
    ok, reason = cpu_linear.kernel_status()
    assert not ok and reason
    assert not any(tmp_path.rglob("*.so"))  # type: ignore[attr-defined]


@needs_kernel
@pytest.mark.parametrize("queries", [1, 2, 7, 16])
def test_c_attention_equals_torch_attention(queries: int) -> None:
    """attend_cpu writes the same cache entries as attend and gives its outputs to rounding,
    for a random tree mask after 300 committed slots (SmolLM2's heads: 9 over 3, D = 64)."""
    from verispec.models.accelerators.c_attention import attend_cpu

    g = torch.Generator().manual_seed(queries)
    cache_k = torch.randn(3, 512, 64, generator=g)
    cache_v = torch.cat([torch.randn(3, 512, 64, generator=g), torch.ones(3, 512, 1)], -1)
    q = torch.randn(queries, 9, 64, generator=g) * 0.2
    k, v = torch.randn(queries, 3, 64, generator=g), torch.randn(queries, 3, 64, generator=g)
    mask = (torch.rand(queries, queries, generator=g) < 0.5).tril() | torch.eye(queries).bool()
    where = torch.tensor([300, 384])
    ours_k, ours_v = cache_k.clone(), cache_v.clone()
    expected = on_buffers(attend, q, k, v, cache_k, cache_v, where, mask)
    got = on_buffers(attend_cpu, q, k, v, ours_k, ours_v, where, mask)
    assert torch.equal(ours_k, cache_k) and torch.equal(ours_v, cache_v)
    assert (got - expected).abs().max().item() < 1e-5


@needs_kernel
def test_c_attention_row_depends_only_on_its_keys() -> None:
    """A row of the C attention has the same bits alone and among 15 others, and when masked
    slots lie between its keys: the property tree decoding needs."""
    from verispec.models.accelerators.c_attention import attend_cpu

    g = torch.Generator().manual_seed(0)
    cache_k = torch.randn(3, 512, 64, generator=g)
    cache_v = torch.cat([torch.randn(3, 512, 64, generator=g), torch.ones(3, 512, 1)], -1)
    q = torch.randn(16, 9, 64, generator=g) * 0.2
    k, v = torch.randn(16, 3, 64, generator=g), torch.randn(16, 3, 64, generator=g)
    chain = torch.ones(16, 16, dtype=torch.bool).tril()
    chain[15, 3:15] = False  # row 15 sees slots 300..302 and itself only
    full = on_buffers(
        attend_cpu, q, k, v, cache_k.clone(), cache_v.clone(), torch.tensor([300, 384]), chain
    )
    # sequential: the keys of rows 0..2, then row 15's token alone at slot 303
    seq_k, seq_v = cache_k.clone(), cache_v.clone()
    on_buffers(
        attend_cpu, q[:3], k[:3], v[:3], seq_k, seq_v, torch.tensor([300, 384]), chain[:3, :3]
    )
    alone = on_buffers(
        attend_cpu,
        q[15:],
        k[15:],
        v[15:],
        seq_k,
        seq_v,
        torch.tensor([303, 384]),
        torch.ones(1, 1).bool(),
    )
    assert torch.equal(full[15:], alone)
    assert torch.equal(
        full[:3],
        on_buffers(
            attend_cpu,
            q[:3],
            k[:3],
            v[:3],
            cache_k.clone(),
            cache_v.clone(),
            torch.tensor([300, 384]),
            chain[:3, :3],
        ),
    )


@needs_kernel
@pytest.mark.parametrize("start", [0, 5, 300, 301, 303])
def test_c_attention_row_ignores_the_rows_after_it_and_the_threads(start: int) -> None:
    """A row's bits do not depend on how many rows follow it in the pass or on the thread
    count: the pass sweeps each key block once for all rows of a KV group, and the keys at
    the end of a short pass (scored one by one) fall into whole blocks of eight (scored
    together) when later rows lengthen it."""
    from verispec.models.accelerators.c_attention import attend_cpu

    g = torch.Generator().manual_seed(start)
    cache_k = torch.randn(3, 384, 64, generator=g)
    cache_v = torch.cat([torch.randn(3, 384, 64, generator=g), torch.ones(3, 384, 1)], -1)
    q = torch.randn(21, 9, 64, generator=g) * 0.3
    k, v = torch.randn(21, 3, 64, generator=g), torch.randn(21, 3, 64, generator=g)
    where, one = torch.tensor([start, 384]), torch.ones(1, 1).bool()
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = on_buffers(
            attend_cpu, q[:1], k[:1], v[:1], cache_k.clone(), cache_v.clone(), where, one
        )
        for rows in (2, 5, 8, 13, 21):
            mask = (torch.rand(rows, rows, generator=g) < 0.5).tril() | torch.eye(rows).bool()
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                out = on_buffers(
                    attend_cpu,
                    q[:rows],
                    k[:rows],
                    v[:rows],
                    cache_k.clone(),
                    cache_v.clone(),
                    where,
                    mask,
                )
                assert torch.equal(out[:1], alone), (rows, threads)
    finally:
        torch.set_num_threads(threads_before)


@needs_kernel
@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU has no AVX-512")
def test_avx512_attention_equals_the_avx2_attention_bit_for_bit() -> None:
    """The native AVX-512 build's attention (value blocks of 64 lanes) gives every bit the
    AVX2 build gives (blocks of 32 lanes), for 1 to 13 tree rows on one or two threads."""
    narrow = cpu_linear._build(("-mno-avx512f",))
    native = cpu_linear.library()
    assert native is not None
    g = torch.Generator().manual_seed(5)
    cache_k = torch.randn(3, 384, 64, generator=g)
    cache_v = torch.cat([torch.randn(3, 384, 64, generator=g), torch.ones(3, 384, 1)], -1)
    q = torch.randn(13, 9, 64, generator=g) * 0.3
    k, v = torch.randn(13, 3, 64, generator=g), torch.randn(13, 3, 64, generator=g)

    def attention(lib: ctypes.CDLL, rows: int, mask: torch.Tensor, threads: int) -> torch.Tensor:
        ck, cv, out = cache_k.clone(), cache_v.clone(), torch.empty(rows, 9 * 64)
        m = mask.contiguous().view(torch.uint8)
        status = lib.vs_attend(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), ck.data_ptr(), cv.data_ptr(), 384,
            rows, 9, 3, 64, 299, m.data_ptr(), rows, out.data_ptr(), threads,
        )  # fmt: skip
        assert status == 0
        return out

    for rows in range(1, 14):
        mask = (torch.rand(rows, rows, generator=g) < 0.5).tril() | torch.eye(rows).bool()
        expected = attention(narrow, rows, mask, 1)
        for threads in (1, 2):
            assert torch.equal(attention(native, rows, mask, threads), expected), rows


def _layer_inputs(model: FastModel, queries: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    args = model.transformer.args
    x = torch.randn(queries, args.dim, generator=g)
    positions = torch.arange(40, 40 + queries)
    cos, sin = model.transformer.rope_cos[positions], model.transformer.rope_sin[positions]
    mask = (torch.rand(queries, queries, generator=g) < 0.5).tril() | torch.eye(queries).bool()
    return x, cos, sin, torch.tensor([40, 40 + queries]), mask


@needs_kernel
@pytest.mark.parametrize("queries", [1, 2, 3, 5, 16])
def test_c_layers_equal_the_torch_blocks(queries: int) -> None:
    """LayerKernel gives the layers' output to rounding and writes the same cache entries to
    rounding, for a tree mask after 40 committed slots, on a 4-bit tiny Llama (every layer,
    and a self-draft's subset of them)."""
    model = blocks_model()
    transformer = model.transformer
    assert model._shared.layers is not None
    kernel = model._shared.layers.kernel
    x, cos, sin, where, mask = _layer_inputs(model, queries, seed=queries)
    layers = len(transformer.blocks)
    for subset in (list(range(layers)), [layers - 1]):
        caches = transformer.setup_caches(64, num_layers=2 * len(subset))
        for i, cache in enumerate(caches):
            seed = i % len(subset)  # layer j's two caches start equal
            cache.k.normal_(generator=torch.Generator().manual_seed(seed))
            cache.v[..., :-1].normal_(generator=torch.Generator().manual_seed(100 + seed))
        ours, theirs = caches[: len(subset)], caches[len(subset) :]
        got = kernel.subset(subset)(x, PassInputs(cos, sin, where, mask), ours)
        expected = x
        for i, cache in zip(subset, theirs, strict=True):
            block = transformer.blocks[i]
            cores = block.attention.cores
            c_core, cores[PassKind.TREE] = cores[PassKind.TREE], attend
            try:
                expected = block(expected, PassInputs(cos, sin, where, mask), cache)
            finally:
                cores[PassKind.TREE] = c_core
        assert (got - expected).abs().max().item() < 1e-4 * expected.abs().max().item()
        for a, b in zip(ours, theirs, strict=True):
            assert (a.k - b.k).abs().max().item() < 1e-4
            assert (a.v - b.v).abs().max().item() < 1e-4


@needs_kernel
def test_c_layers_read_replaced_weights() -> None:
    """A product whose blocks are replaced is read from the new tensor on the next call
    (the kernel keeps no stale pointer)."""
    model = blocks_model()
    kernel = c_layers(model).subset([1])
    x, cos, sin, where, mask = _layer_inputs(model, 2, seed=0)
    inputs = PassInputs(cos, sin, where, mask)
    caches = model.transformer.setup_caches(64, num_layers=1)
    before = kernel(x, inputs, caches)
    down = model.transformer.blocks[1].feed_forward.w2
    original = down.blocks
    try:
        other = _linear(down.out_features, down.in_features, "q4_1")
        replacement = BlockLinear.from_linear(other, ("q4_1",))
        assert replacement is not None
        down.blocks = replacement.blocks
        after = kernel(x, inputs, caches)
    finally:
        down.blocks = original
    assert not torch.equal(before, after)
    assert torch.equal(kernel(x, inputs, caches), before)


@needs_kernel
def test_c_layers_read_weights_moved_by_module_apply() -> None:
    """A product whose blocks ``Module._apply`` replaced (a copy, as a move or cast makes)
    is read from the new tensor: editing the copy changes the next result, editing the
    old tensor does not."""
    model = blocks_model()
    kernel = c_layers(model).subset([1])
    x, cos, sin, where, mask = _layer_inputs(model, 2, seed=0)
    inputs = PassInputs(cos, sin, where, mask)
    before = kernel(x, inputs, model.transformer.setup_caches(64, num_layers=1))
    down = model.transformer.blocks[1].feed_forward.w2
    old = down.blocks
    down._apply(torch.clone)
    assert down.blocks is not old
    old.zero_()  # the stale tensor: no longer read
    assert torch.equal(kernel(x, inputs, model.transformer.setup_caches(64, num_layers=1)), before)
    down.blocks.zero_()  # the new one: read
    after = kernel(x, inputs, model.transformer.setup_caches(64, num_layers=1))
    assert not torch.equal(after, before)


@needs_kernel
def test_c_layers_write_the_caches_they_are_given() -> None:
    """Called with other caches (the runtime's grow by replacement), the kernel writes those
    and reads theirs, not the caches of an earlier call."""
    model = blocks_model()
    kernel = c_layers(model)
    layers = len(model.transformer.blocks)
    x, cos, sin, where, mask = _layer_inputs(model, 3, seed=1)
    inputs = PassInputs(cos, sin, where, mask)
    first = model.transformer.setup_caches(64, num_layers=layers)
    out_first = kernel(x, inputs, first)
    second = model.transformer.setup_caches(64, num_layers=layers)
    for cache in second:  # other earlier entries: the result must change
        cache.k.normal_(generator=torch.Generator().manual_seed(7))
    filled = [cache.k.clone() for cache in second]
    out_second = kernel(x, inputs, second)
    assert not torch.equal(out_second, out_first)
    for cache, before in zip(second, filled, strict=True):  # the new entries went there
        assert not torch.equal(cache.k[:, 40:43], before[:, 40:43])
        assert torch.equal(cache.k[:, :40], before[:, :40])
    third = model.transformer.setup_caches(64, num_layers=layers)
    assert torch.equal(kernel(x, inputs, third), out_first)  # fresh caches: the first result


def c_layers(model: FastModel) -> LayerKernel:
    """The model's C layer kernel (every product is a block one here)."""
    assert model._shared.layers is not None
    return model._shared.layers.kernel


def _decode(
    model: FastModel, prompt: list[int], tokens: list[int], tree: DraftTree | None = None
) -> list[torch.Tensor]:
    """The logits of each plain step after ``prompt`` (the step's token committed after it),
    then of a step with ``tree``."""
    model.prefill(torch.tensor(prompt))
    rows = []
    for token in tokens:
        rows.append(model.forward_tree(DraftTree.empty()))
        model.commit([], token)
    if tree is not None:
        rows.append(model.forward_tree(tree))
    return rows


@needs_kernel
@settings(max_examples=10, deadline=None)
@given(
    prompt=st.lists(st.integers(0, V - 1), min_size=1, max_size=PROMPT_PASS_TOKENS + 8),
    tokens=st.lists(st.integers(0, V - 1), min_size=1, max_size=4),
    tree=draft_trees(V, 14),
)
def test_a_step_is_one_c_call_with_the_general_paths_bits(
    prompt: list[int], tokens: list[int], tree: DraftTree
) -> None:
    """With the C layers and a block-product head, a step with one pending token, plain or
    with a tree, runs as one C call (``CLayers.decode_step``: embedding, layers with the
    tree's mask built in C, final norm, head) and its logits are bit for bit those of the
    general pass (the mask and positions built in torch, the C layers, then the head as a
    product of its own), step after step."""
    model = blocks_model()
    layers = model._shared.layers
    assert layers is not None and layers.decodes
    calls = []
    decode_step = layers.decode_step

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(args)
        return decode_step(*args, **kwargs)  # type: ignore[arg-type]

    layers.decode_step = counted  # type: ignore[method-assign]
    try:
        fast = _decode(model, prompt, tokens, tree)
        layers.decodes = False
        general = _decode(model, prompt, tokens, tree)
    finally:
        layers.decodes = True
        del layers.decode_step
    assert len(calls) == len(tokens) + 1
    assert [a.shape for a in fast] == [(1, V)] * len(tokens) + [(tree.num_nodes + 1, V)]
    for a, b in zip(fast, general, strict=True):
        assert torch.equal(a, b)


@needs_kernel
def test_the_c_forward_refuses_an_unknown_token_and_writes_nothing() -> None:
    """A token id outside the vocabulary is refused with the range it must be in, before any
    cache slot is written."""
    model = blocks_model()
    caches = model.transformer.setup_caches(64)
    before = [(c.k.clone(), c.v.clone()) for c in caches]
    assert model._shared.layers is not None
    with pytest.raises(RuntimeError, match=rf"token ids must be in \[0, {V}\)"):
        model._shared.layers.decode_step(V, 3, caches, 3)
    for cache, (k, v) in zip(caches, before, strict=True):
        assert torch.equal(cache.k, k) and torch.equal(cache.v, v)


@needs_kernel
def test_the_c_forward_reads_a_head_moved_by_module_apply() -> None:
    """The head's blocks replaced by ``Module._apply`` (a move or cast makes a copy) are read
    from the copy by the next plain step: zeroing the old tensor changes nothing, zeroing the
    copy zeroes the logits."""
    hf = tiny_model("llama", vocab_size=V, seed=3, dtype=torch.float32, hidden_size=64).hf_model
    model = FastModel(hf, dtype=torch.float32, weights="q4_1")
    assert model._shared.layers is not None and model._shared.layers.decodes
    before = _decode(model, [1, 2, 3], [4])[0]
    head = model.transformer.output
    old = head.blocks
    head._apply(torch.clone)
    assert head.blocks is not old
    old.zero_()
    assert torch.equal(_decode(model, [1, 2, 3], [4])[0], before)
    head.blocks.zero_()
    assert torch.equal(_decode(model, [1, 2, 3], [4])[0], torch.zeros(1, V))


@needs_kernel
def test_a_head_that_is_not_blocks_decodes_through_the_general_pass() -> None:
    """Layers in blocks but a head that is not (a random float32 matrix): the C layers run,
    the one-call step does not, and plain steps still give the tree rows bit for bit."""
    hf = tiny_model("llama", vocab_size=V, seed=4, dtype=torch.float32, hidden_size=64).hf_model
    with torch.no_grad():
        for linear in hf.model.layers.modules():
            if isinstance(linear, nn.Linear):
                linear.weight.copy_(quantize_blocks(linear.weight, "q4_1"))
    model = FastModel(hf, dtype=torch.float32)
    assert model._shared.layers is not None
    assert not isinstance(model.transformer.output, BlockLinear)
    assert not model._shared.layers.decodes
    prompt = [5, 6, 7]
    tree = DraftTree.from_parents(torch.tensor([8, 9, 10]), [-1, 0, -1])
    model.prefill(torch.tensor(prompt))
    assert torch.equal(model.forward_tree(tree), decoded_tree_reference(model, prompt, tree))


@needs_kernel
def test_the_c_forward_equals_its_parts() -> None:
    """``LayerKernel.forward`` from token ids: its normed rows are the embedding rows through
    the C layers and the final norm (its own weight, here random) to rounding, and its
    logits of the last rows are bit for bit the head's product on those normed rows."""
    model = blocks_model()
    transformer = model.transformer
    kernel = c_layers(model)
    tokens, positions = torch.tensor([3, 17, 60]), torch.tensor([5, 6, 7])
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    weight = transformer.norm.weight
    original = weight.detach().clone()

    def caches() -> list:
        return transformer.setup_caches(64)

    try:
        with torch.no_grad():
            weight.copy_(torch.rand(weight.shape, generator=torch.Generator().manual_seed(2)) + 0.5)
        hidden = kernel.forward(transformer, tokens, positions, caches(), 5, mask)
        x = transformer.tok_embeddings.weight[tokens].detach()
        cos, sin = transformer.rope_cos[positions], transformer.rope_sin[positions]
        layers = kernel(x, PassInputs(cos, sin, torch.tensor([5, 8]), mask), caches())
        expected = torch.rms_norm(layers, weight.shape, weight.detach(), transformer.norm.eps)
        assert (hidden - expected).abs().max().item() < 1e-5 * expected.abs().max().item()
        logits = kernel.forward(transformer, tokens, positions, caches(), 5, mask, rows=2)
        assert torch.equal(logits, transformer.logits(hidden[1:]))
    finally:
        with torch.no_grad():
            weight.copy_(original)
