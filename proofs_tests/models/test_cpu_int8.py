"""Tests of the integer products (``arithmetic="int8"``, ``verispec/kernels/cpu/int8.c``).

The properties: the activations' codes are llama.cpp's Q8_1 rounding of each row; the
product is the stated sum of integer block sums, on every instruction path this CPU runs
(the portable C included) with the same bits, for any row count, row order and thread
count; a model on it decodes tree rows bit for bit as it decodes one token at a time; and
what cannot run it is refused by name before anything loads.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_references import decoded_tree_reference, draft_trees, tree_reference
from torch import nn

from verispec.core import DraftTree
from verispec.decoder import SpeculativeDecoder
from verispec.drafters.token_recycling import TokenRecycling
from verispec.errors import ConfigError
from verispec.models import FastModel, tiny_model
from verispec.models.accelerators import blocks as cpu_linear
from verispec.models.accelerators.blocks import (
    BlockLinear,
    from_panels,
    int8_path,
    int8_paths,
    kernel_status,
    quantize_activations,
    quantize_blocks,
    recover_blocks,
    to_panels,
)
from verispec.models.accelerators.c_layers import CLayers
from verispec.models.runtime import C_PROMPT_PASS_TOKENS

available, why = kernel_status()
pytestmark = pytest.mark.skipif(not available, reason=f"block kernel unavailable: {why}")
V = 64


def _linear(rows: int, cols: int, fmt: str, seed: int = 0, bias: bool = False) -> nn.Linear:
    generator = torch.Generator().manual_seed(seed)
    linear = nn.Linear(cols, rows, bias=bias)
    with torch.no_grad():
        weight = torch.randn(rows, cols, generator=generator) * 0.05
        linear.weight.copy_(quantize_blocks(weight, fmt))  # type: ignore[arg-type]
        if bias:
            linear.bias.copy_(torch.randn(rows, generator=generator))
    return linear


def _int8(linear: nn.Linear, fmt: str) -> BlockLinear:
    block = BlockLinear.from_linear(linear, (fmt,), "int8")  # type: ignore[arg-type]
    assert block is not None and block.arithmetic == "int8"
    return block


@pytest.fixture
def each_path():
    """Runs the test body once per path this CPU runs; the default path again afterwards."""
    yield int8_paths()
    int8_path("auto")


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 7, 8, 13])
@pytest.mark.parametrize("half", [False, True])
def test_panels_hold_the_blocks_and_give_them_back(fmt: str, rows: int, half: bool) -> None:
    """Regrouping a matrix's blocks into panels of eight rows (a last panel padded), with
    float32 or half scales, loses nothing: the blocks come back byte for byte, and the
    product's weight widens to the matrix bit for bit."""
    linear = _linear(rows, 96, fmt, seed=rows)
    blocks = recover_blocks(linear.weight.detach(), fmt)  # type: ignore[arg-type]
    assert blocks is not None
    panels = to_panels(blocks, fmt, rows, half)  # type: ignore[arg-type]
    assert panels is not None and panels.shape[0] == -(-rows // 8)
    block_bytes = {"q4_1": 24, "q8_0": 36}[fmt] - ({"q4_1": 4, "q8_0": 2}[fmt] if half else 0)
    assert panels.shape[1] == 96 // 32 * 8 * block_bytes
    assert torch.equal(from_panels(panels, fmt, rows, half), blocks)  # type: ignore[arg-type]
    assert torch.equal(_int8(linear, fmt).dequantized(), linear.weight.detach())


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_half_scales_are_used_only_where_every_scale_is_a_half(fmt: str) -> None:
    """llama.cpp's scales are halves, so its blocks' panels hold them in 2 bytes; a matrix
    with one scale that is no half (here a block scaled by 2**-20, below the halves' range)
    keeps float32 scales, and both widen to the matrix bit for bit."""
    linear = _linear(16, 96, fmt, seed=2)
    block = _int8(linear, fmt)
    assert block.half_scales and block.kind == {"q4_1": 12, "q8_0": 13}[fmt]
    with torch.no_grad():
        linear.weight[3, 32:64] *= 2.0**-20
    block = _int8(linear, fmt)
    assert not block.half_scales and block.kind == {"q4_1": 3, "q8_0": 4}[fmt]
    assert torch.equal(block.dequantized(), linear.weight.detach())


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_half_scale_panels_give_the_float32_scale_panels_bits(
    fmt: str, each_path: tuple[str, ...]
) -> None:
    """The same matrix's panels with half scales and with float32 scales give the same bits
    on every path, for one to 64 rows on one or two threads (the scales widen exactly)."""
    linear = _linear(44, 192, fmt, seed=12, bias=True)
    block = _int8(linear, fmt)
    assert block.half_scales
    blocks = recover_blocks(linear.weight.detach(), fmt)  # type: ignore[arg-type]
    assert blocks is not None
    wide = to_panels(blocks, fmt, 44)  # type: ignore[arg-type]
    assert wide is not None
    kind = {"q4_1": 3, "q8_0": 4}[fmt]
    x = torch.randn(64, 192, generator=torch.Generator().manual_seed(13))
    before = torch.get_num_threads()
    try:
        for path in each_path:
            int8_path(path)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for count in (1, 2, 5, 17, 64):
                    want = cpu_linear._linear(kind, x[:count], wide, 44, linear.bias.detach())
                    assert torch.equal(block.eager(x[:count]), want), (path, threads, count)
    finally:
        torch.set_num_threads(before)


def test_activation_codes_are_llama_cpp_q8_1_rounding(each_path: tuple[str, ...]) -> None:
    """Each row's codes per 32 values: d = max |x| / 127, q = round-half-even(x * (1 / d)),
    s = d * sum(q), a zero block all zeros; the same bits on every path."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(5, 128, generator=generator) * 3
    x[1, 32:64] = 0.0  # a zero block
    x[2, :32] = torch.arange(32) - 15.5  # ties at .5 after scaling are not special-cased
    blocks = x.reshape(5, 4, 32)
    d = blocks.abs().amax(-1) / 127
    inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    q = torch.round(blocks * inverse[..., None]).clamp(-127, 127)  # torch.round: half to even
    s = d * q.sum(-1)
    for path in each_path:
        int8_path(path)
        codes, scales, sums = quantize_activations(x)
        assert torch.equal(codes.reshape(5, 4, 32), q.to(torch.int8)), path
        assert torch.equal(scales, d) and torch.equal(sums, s), path


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("bias", [False, True])
def test_the_product_is_the_sum_of_integer_block_sums(fmt: str, bias: bool) -> None:
    """y = sum over blocks of (integer block sum) * d_w * d_x (+ Q4_1's minimum times s_x)
    + bias: the kernel agrees with that sum in float64 to float32 rounding, and far from
    the float32 product of the unrounded activations (it is another arithmetic)."""
    linear = _linear(20, 160, fmt, seed=5, bias=bias)
    block = _int8(linear, fmt)
    x = torch.randn(6, 160, generator=torch.Generator().manual_seed(6))
    codes, scales, sums = quantize_activations(x)
    blocks = recover_blocks(linear.weight.detach(), fmt)  # type: ignore[arg-type]
    assert blocks is not None
    raw = blocks.reshape(20, 5, -1)
    dw = raw[..., :4].contiguous().view(torch.float32).double()  # (20, 5, 1)
    if fmt == "q4_1":
        mw = raw[..., 4:8].contiguous().view(torch.float32).double()
        nib = raw[..., 8:].long()
        wq = torch.cat([nib & 15, nib >> 4], dim=-1)
    else:
        mw = torch.zeros_like(dw)
        wq = raw[..., 4:].contiguous().view(torch.int8).long()
    t = torch.einsum("nbk,mbk->mnb", wq, codes.reshape(6, 5, 32).long()).double()
    want = (t * dw[..., 0] * scales.double()[:, None, :]).sum(-1)
    want += (mw[..., 0] * sums.double()[:, None, :]).sum(-1)
    if bias:
        want += linear.bias.detach().double()
    got = block.eager(x)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, linear(x).detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("threads", [1, 2])
def test_every_path_row_count_order_and_thread_count_gives_the_same_bits(
    fmt: str, threads: int, each_path: tuple[str, ...]
) -> None:
    """One to 150 rows (past AVX2's tiles of 64, each side of every path's direct rows, four or
    eight, and Q8_0's VNNI groups of four, two and one), alone, together, in another order, on
    one or two threads and on every instruction path this CPU runs (portable C, AVX2, and the
    VNNI paths where present): every row's result has the bits of that row computed alone on
    the portable path."""
    linear = _linear(44, 192, fmt, seed=9, bias=True)  # 44: a last panel of four rows
    block = _int8(linear, fmt)
    x = torch.randn(150, 192, generator=torch.Generator().manual_seed(10))
    int8_path("portable")
    alone = torch.cat([block.eager(x[i : i + 1]) for i in range(150)])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for path in each_path:
            int8_path(path)
            for count in (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 64, 65, 150):
                assert torch.equal(block.eager(x[:count]), alone[:count]), (path, count)
            order = torch.randperm(150, generator=torch.Generator().manual_seed(11))
            assert torch.equal(block.eager(x[order]), alone[order]), path
    finally:
        torch.set_num_threads(before)


def test_bad_arithmetic_for_a_block_product_is_named() -> None:
    linear = _linear(8, 64, "q4_1")
    blocks = recover_blocks(linear.weight.detach(), "q4_1")
    assert blocks is not None
    with pytest.raises(ValueError, match="arithmetic"):
        BlockLinear("q4_1", blocks, 64, 8, None, arithmetic="int4")
    with pytest.raises(ValueError, match="int8"):
        BlockLinear("float32", linear.weight.detach(), 64, 8, None, arithmetic="int8")
    with pytest.raises(ValueError, match="'vnni9'"):
        int8_path("vnni9")


# -- the runtime on integer products ------------------------------------------------------

_MODELS: dict[tuple, FastModel] = {}


def int8_model(weights: str = "q4_1", max_length: int = 256) -> FastModel:
    """A tiny float32 Llama (width 64) on integer products."""
    key = (weights, max_length)
    if key not in _MODELS:
        hf = tiny_model(
            "llama", vocab_size=V, seed=1, dtype=torch.float32, hidden_size=64,
            max_length=max_length,
        ).hf_model  # fmt: skip
        _MODELS[key] = FastModel(hf, dtype="auto", weights=weights, arithmetic="int8")
    return _MODELS[key]


@pytest.mark.parametrize("weights", ["q4_1", "auto"])
def test_an_int8_model_runs_every_product_in_integers(weights: str) -> None:
    """arithmetic='int8' makes every product, the LM head included, an integer product (a
    dense model's matrices rounded to Q8_0 first), says so in its runtime, and keeps the
    one-row passes of the block kernel."""
    model = int8_model(weights)
    assert model.runtime == "eager+GGUF blocks+int8 products+C layers"
    assert model.dtype == torch.float32
    linears = [m for m in model.transformer.modules() if isinstance(m, nn.Linear | BlockLinear)]
    assert linears and all(isinstance(m, BlockLinear) and m.arithmetic == "int8" for m in linears)
    assert model.transformer.output.fmt == "q8_0"
    assert {m.fmt for m in linears} == ({"q4_1", "q8_0"} if weights == "q4_1" else {"q8_0"})
    assert model._shared.bucket(1) == 1


@settings(max_examples=12, deadline=None)
@given(prompt=st.lists(st.integers(0, V - 1), min_size=1, max_size=8), tree=draft_trees(V, 14))
def test_int8_tree_rows_are_bitwise_sequential(prompt: list[int], tree: DraftTree) -> None:
    """Each tree row on integer products is bit for bit the row that decoding its path one
    token at a time gives (every layer in one C call)."""
    model = int8_model()
    model.prefill(torch.tensor(prompt))
    assert torch.equal(model.forward_tree(tree), tree_reference(model, prompt, tree))


@settings(max_examples=4, deadline=None)
@given(
    prompt=st.integers(C_PROMPT_PASS_TOKENS + 1, 90).flatmap(
        lambda n: st.lists(st.integers(0, V - 1), min_size=n, max_size=n)
    ),
    tree=draft_trees(V, max_nodes=14),
)
def test_int8_tree_rows_after_a_prompt_pass(prompt: list[int], tree: DraftTree) -> None:
    """A prompt long enough for the prompt pass runs the same integer products, so tree rows
    after it still equal greedy decoding from the same prefill, bit for bit."""
    model = int8_model()
    model.prefill(torch.tensor(prompt))
    assert torch.equal(model.forward_tree(tree), decoded_tree_reference(model, prompt, tree))


def _count_prompt_passes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """``{"prompt": n}``, n counting the calls of ``CLayers.prompt_pass`` from now on."""
    calls = {"prompt": 0}
    prompt_pass = CLayers.prompt_pass

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["prompt"] += 1
        return prompt_pass(*args, **kwargs)

    monkeypatch.setattr(CLayers, "prompt_pass", counted)
    return calls


@pytest.mark.parametrize("threads", [1, 2])
def test_int8_prompt_pass_threshold(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """With integer products the prompt pass runs as one C call (``CLayers.prompt_pass``)
    from ``C_PROMPT_PASS_TOKENS`` tokens, at one thread as at two: a prompt one token shorter
    runs the tree kernels, one of that length the prompt pass."""
    threshold = C_PROMPT_PASS_TOKENS
    calls = _count_prompt_passes(monkeypatch)
    model = int8_model()
    kept = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # the last prompt token is the root, fed by the first step: a chunk of length - 1
        for length, prompt in [(threshold, False), (threshold + 1, True)]:
            calls["prompt"] = 0
            model.reset()
            generator = torch.Generator().manual_seed(length)
            model.prefill(torch.randint(0, V, (length,), generator=generator))
            assert (calls["prompt"] > 0) == prompt, (length, threads)
    finally:
        torch.set_num_threads(kept)


def test_int8_prompt_pass_in_c_equals_the_torch_prompt_pass_to_rounding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 200-token prompt prefilled by the C prompt pass leaves the cache entries and the
    root's logits of the torch prompt pass (the same integer products; norms, SiLU and the
    prompt attention computed in C) to rounding; its last layer, whose rows nobody reads,
    writes the keys and values the torch pass writes."""
    calls = _count_prompt_passes(monkeypatch)
    prompt = torch.randint(0, V, (200,), generator=torch.Generator().manual_seed(5))
    model = int8_model()
    layers = model._shared.layers
    assert layers is not None and layers.prompts
    model.reset()
    model.prefill(prompt)
    assert calls["prompt"] == 1
    root = model.forward_tree(DraftTree.empty())[0]
    caches = [(k.clone(), v.clone()) for k, v in model.kv_cache()]
    monkeypatch.setattr(layers, "prompts", False)  # the torch prompt pass
    model.reset()
    model.prefill(prompt)
    assert calls["prompt"] == 1
    torch_root = model.forward_tree(DraftTree.empty())[0]
    assert (root - torch_root).abs().max().item() < 1e-4 * torch_root.abs().max().item()
    for (k, v), (k_ref, v_ref) in zip(caches, model.kv_cache(), strict=True):
        assert (k - k_ref).abs().max().item() < 1e-4 * k_ref.abs().max().item()
        assert (v - v_ref).abs().max().item() < 1e-4 * v_ref.abs().max().item()


def test_token_recycling_on_int8_answers_as_its_own_ar() -> None:
    """Speculative decoding is exact with respect to the integer model: Token Recycling's
    80-node template gives the tokens plain decoding on the same model gives."""
    model = int8_model()
    prompt = [3, 14, 15, 9, 26, 5]
    plain = SpeculativeDecoder(model).generate(prompt, max_new_tokens=40).tokens
    recycled = SpeculativeDecoder(model, TokenRecycling(k=8)).generate(prompt, max_new_tokens=40)
    assert recycled.tokens == plain and len(plain) == 40


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"arithmetic": "int4"}, "`arithmetic` must be one of"),
        ({"arithmetic": "int8", "weights": "dense"}, "weights='dense'"),
        ({"arithmetic": "int8", "dtype": torch.bfloat16}, "dtype=torch.bfloat16"),
    ],
)
def test_int8_options_that_cannot_run_are_named(options: dict, named: str) -> None:
    hf = tiny_model("llama", vocab_size=V, seed=1, dtype=torch.float32, hidden_size=64).hf_model
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace("[", r"\[")):
        FastModel(hf, **options)


def test_the_hf_runtime_refuses_int8() -> None:
    from verispec.models.target import make_target

    hf = tiny_model("llama", vocab_size=V, seed=1, dtype=torch.float32, hidden_size=64).hf_model
    with pytest.raises(ConfigError, match="runtime='hf'"):
        make_target(hf, runtime="hf", arithmetic="int8")
