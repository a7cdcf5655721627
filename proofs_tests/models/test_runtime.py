"""Tests of verispec/models/runtime.py: the fast runtime's own parts.

The ``LanguageModel`` protocol (tree attention, extend_from, commit, errors) is tested for
both models in test_sequence.py; the decoder module against transformers in test_llama.py.
Here: every architecture's tree pass against its own sequential decoding (float64), the
bit-for-bit row invariance that makes greedy decoding token-identical by construction,
prepacking, bfloat16, self-drafts, long prompts, choices and errors, and SmolLM2.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_references import (
    decoded_tree_reference,
    draft_trees,
    sequential_logits,
    tree_reference,
)
from torch import nn

from verispec import SpeculativeDecoder
from verispec.core import DraftTree
from verispec.errors import ConfigError, UnsupportedModelError
from verispec.kernels.cpu.features import bf16_supported, default_dtype
from verispec.kernels.dtypes import auto_dtype
from verispec.models import FastModel, HFModel, tiny_model
from verispec.models.accelerators.blocks import holds_blocks, kernel_status, quantize_blocks
from verispec.models.accelerators.c_attention import CAttention, cpu_attention_available
from verispec.models.accelerators.onednn import PackedLinear
from verispec.models.accelerators.probe import row_invariant_kernels
from verispec.models.default import make_target
from verispec.verifiers import Greedy

EXACT = 1e-9
V = 64
prompts = st.lists(st.integers(0, V - 1), min_size=1, max_size=8)

_MODELS: dict[tuple, FastModel] = {}


def fast(
    architecture: str = "llama",
    dtype: torch.dtype = torch.float64,
    hidden_size: int = 32,
    max_length: int = 256,
    **kwargs: object,
) -> FastModel:
    """A tiny random model of ``architecture`` (4 heads over 2 key/value heads) on the runtime,
    cached per arguments."""
    key = (architecture, dtype, hidden_size, max_length, tuple(sorted(kwargs.items())))
    if key not in _MODELS:
        source_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        hf = tiny_model(
            architecture,
            vocab_size=V,
            seed=1,
            dtype=source_dtype,
            hidden_size=hidden_size,
            max_length=max_length,
        ).hf_model
        _MODELS[key] = FastModel(hf, dtype=dtype, **kwargs)  # type: ignore[arg-type]
    return _MODELS[key]


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "mistral"])
@settings(max_examples=8)
@given(prompt=prompts, tree=draft_trees(V, max_nodes=10))
def test_tree_forward_equals_sequential_architectures(
    architecture: str, prompt: list[int], tree: DraftTree
) -> None:
    """On tiny float64 Llama, Qwen2 (query/key/value biases) and Mistral, every row of one tree
    pass equals decoding its path one token at a time, to 1e-9."""
    model = fast(architecture)
    model.prefill(torch.tensor(prompt))
    logits = model.forward_tree(tree)
    assert (logits - tree_reference(model, prompt, tree)).abs().max().item() < EXACT


def _invariant_dtypes() -> list[torch.dtype]:
    return [torch.float32, *([torch.bfloat16] if bf16_supported() else [])]


@pytest.mark.parametrize("attention", ["auto", "torch"])
@pytest.mark.parametrize("dtype", _invariant_dtypes(), ids=str)
@settings(max_examples=15)
@given(prompt=prompts, tree=draft_trees(V, max_nodes=14))
def test_tree_rows_are_bitwise_sequential(
    dtype: torch.dtype, attention: str, prompt: list[int], tree: DraftTree
) -> None:
    """With prepacked float32 or bfloat16 weights, each tree row is bit for bit the row that
    decoding its path one token at a time gives, side branches included (where this machine's
    kernels are row-invariant at the model's shapes, as FastModel.row_invariant checks; head
    dim 16 here: MKL's products with 8 columns are not), with the attention in C (where it
    builds) and as torch operators."""
    model = fast(dtype=dtype, hidden_size=64, attention=attention)
    if not model.row_invariant:
        pytest.skip(f"this machine's {dtype} kernels are not row-invariant (see docs/runtime)")
    c_attention = "+C attention" if model._shared.find(CAttention) else ""
    assert model.runtime == "eager+oneDNN" + c_attention
    assert bool(c_attention) == (attention == "auto" and cpu_attention_available(16))
    model.prefill(torch.tensor(prompt))
    logits = model.forward_tree(tree)
    assert torch.equal(logits, tree_reference(model, prompt, tree))


# Prompts that put the tree across the value product's first and second block boundaries
# (slots 128 and 256), where the tree's slots and sequential decoding's slots of a key fall
# in different blocks, or the padded attention length differs (256 against 384).
straddling_prompts = st.one_of(st.integers(100, 127), st.integers(236, 260)).flatmap(
    lambda n: st.lists(st.integers(0, V - 1), min_size=n, max_size=n)
)


@pytest.mark.parametrize("attention", ["auto", "torch"])
@pytest.mark.parametrize("dtype", _invariant_dtypes(), ids=str)
@settings(max_examples=10, deadline=None)
@given(prompt=straddling_prompts, tree=draft_trees(V, max_nodes=30))
def test_tree_rows_are_bitwise_sequential_across_value_blocks(
    dtype: torch.dtype, attention: str, prompt: list[int], tree: DraftTree
) -> None:
    """Where the tree straddles slot 128 or 256, each tree row is still bit for bit the row
    that greedy decoding computes (prompt prefilled, path decoded one token at a time), with
    either attention."""
    model = fast(dtype=dtype, hidden_size=64, max_length=512, attention=attention)
    if not model.row_invariant:
        pytest.skip(f"this machine's {dtype} kernels are not row-invariant (see docs/runtime)")
    model.prefill(torch.tensor(prompt))
    logits = model.forward_tree(tree)
    assert torch.equal(logits, decoded_tree_reference(model, prompt, tree))


def test_a_deep_chain_across_a_value_block_is_bitwise_sequential() -> None:
    """A 12-node chain with 8 siblings of its first node, after a 120-token prompt (the
    chain's nodes sit in slots 129-140 while greedy decoding has them in 121-132): every row
    equals greedy decoding bit for bit, in float32."""
    model = fast(dtype=torch.float32, hidden_size=64)
    assert model.row_invariant, "this machine's float32 kernels are not row-invariant"
    prompt = [(7 * i) % V for i in range(120)]
    parents = [-1] * 9 + [0] + list(range(9, 19))
    tree = DraftTree.from_parents([(3 * i + 1) % V for i in range(len(parents))], parents)
    model.prefill(torch.tensor(prompt))
    assert torch.equal(model.forward_tree(tree), decoded_tree_reference(model, prompt, tree))


def test_probe_detects_row_dependent_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """row_invariant_kernels reports False when products' rows depend on the row count: here
    the projections replaced by MKL's float32 product, which is not row-invariant."""
    import verispec.models.accelerators.probe as invariance

    def mkl_forward(self: PackedLinear, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight)

    def init(self: PackedLinear, linear: torch.nn.Linear) -> None:
        torch.nn.Module.__init__(self)
        self.weight = linear.weight.detach()

    monkeypatch.setattr(PackedLinear, "forward", mkl_forward)
    monkeypatch.setattr(PackedLinear, "__init__", init)
    monkeypatch.setattr(invariance, "_INVARIANT", {})
    assert row_invariant_kernels(torch.float32) is False


def _row_count_bmm(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``torch.bmm`` made row-dependent on purpose: from 8 rows on, every result moves to the
    next float up (what a kernel that switches its tiling at some row count does)."""

    def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = real(a, b)
        return out.nextafter(torch.full_like(out, math.inf)) if a.shape[-2] >= 8 else out

    return bmm


def _ordered_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A batched product row-invariant by construction: element-wise products added over the
    inner dimension in order, each output computed alone whatever the row count."""
    out = a[..., :, :1] * b[..., :1, :]
    for k in range(1, a.shape[-1]):
        out = out + a[..., :, k : k + 1] * b[..., k : k + 1, :]
    return out


@pytest.mark.parametrize("head_dim", [8, 64])
def test_probe_detects_row_dependent_attention(
    monkeypatch: pytest.MonkeyPatch, head_dim: int
) -> None:
    """row_invariant_kernels reports False when the attention's batched products give a row
    other bits for some row counts (``torch.bmm`` made so on purpose), and True when they are
    row-invariant by construction (the projections' check left out): its verdict follows the
    products, not the CPU it runs on."""
    import verispec.models.accelerators.probe as invariance

    monkeypatch.setattr(invariance, "can_prepack", lambda device, dtype: False)
    monkeypatch.setattr(invariance, "_INVARIANT", {})
    monkeypatch.setattr(torch, "bmm", _row_count_bmm(torch.bmm))
    assert row_invariant_kernels(head_dim=head_dim, widths=(32,), groups=2) is False
    monkeypatch.setattr(invariance, "_INVARIANT", {})
    monkeypatch.setattr(torch, "bmm", _ordered_bmm)
    assert row_invariant_kernels(head_dim=head_dim, widths=(32,), groups=2) is True


def test_probe_agrees_with_the_model_it_describes() -> None:
    """Where the probe calls the tiny head-dim-8 model's kernels row-invariant, its tree rows
    equal decoding each path one token at a time bit for bit; where it does not (MKL's batched
    products at 8 columns on some CPUs), the rows still agree to rounding."""
    model = fast(dtype=torch.float32)
    prompt = [3, 9, 27, 17, 5]
    tree = DraftTree.from_parents([5, 6, 7, 8, 9, 10], [-1, 0, 0, 2, -1, 4])
    model.prefill(torch.tensor(prompt))
    logits = model.forward_tree(tree)
    reference = tree_reference(model, prompt, tree)
    if model.row_invariant:
        assert torch.equal(logits, reference)
    else:
        assert (logits - reference).abs().max().item() < 1e-5


def test_close_to_transformers_float32() -> None:
    """In float32 with prepacked weights, a tree pass matches the Hugging Face adapter's
    sequential logits to 1e-4 (different kernels sum in different orders)."""
    model = fast(dtype=torch.float32)
    reference = HFModel(model.hf_model)
    prompt, tree = [3, 9, 27, 17], DraftTree.from_parents([5, 6, 7, 8], [-1, 0, 0, 2])
    model.prefill(torch.tensor(prompt))
    logits = model.forward_tree(tree)
    assert (logits - tree_reference(reference, prompt, tree)).abs().max().item() < 1e-4


def test_prepacking_changes_kernels_not_results() -> None:
    """The plain nn.Linear forward (prepack=False) and the prepacked one agree to 1e-5."""
    packed = fast(dtype=torch.float32, attention="torch")
    plain = fast(dtype=torch.float32, prepack=False, attention="torch")
    assert plain.runtime == "eager" and packed.runtime == "eager+oneDNN"
    assert not any(isinstance(m, PackedLinear) for m in plain.transformer.modules())
    tree = DraftTree.from_parents([1, 2, 3], [-1, 0, -1])
    rows = []
    for model in (packed, plain):
        model.prefill(torch.tensor([4, 5, 6]))
        rows.append(model.forward_tree(tree))
    assert (rows[0] - rows[1]).abs().max().item() < 1e-5


@pytest.mark.skipif(not bf16_supported(), reason="oneDNN multiplies no bfloat16 here (no AVX-512)")
def test_bfloat16_weights_float32_activations() -> None:
    """bfloat16 weights keep activations and the cache in float32, return float32 logits,
    and stay within bfloat16 rounding of the float32 model."""
    bf16, fp32 = fast(dtype=torch.bfloat16), fast(dtype=torch.float32)
    assert bf16.dtype == torch.bfloat16 and bf16.transformer.compute_dtype == torch.float32
    rows = []
    for model in (bf16, fp32):
        model.prefill(torch.tensor([4, 5, 6]))
        rows.append(model.forward_tree(DraftTree.from_parents([1, 2], [-1, 0])))
        assert model.kv_cache()[0][0].dtype == torch.float32
    assert rows[0].dtype == torch.float32
    assert (rows[0] - rows[1]).abs().max().item() < 0.05 * rows[1].abs().max().item()


def test_self_draft_shares_weights_and_matches_the_adapter() -> None:
    """A self-draft view runs the chosen layers over the same weights (nothing copied), with its
    own cache, and equals the Hugging Face adapter's self-draft of those layers."""
    model = fast("qwen2")
    view = model.self_draft([0])
    assert view.transformer is model.transformer and view.num_layers == 1
    model.prefill(torch.tensor([1, 2, 3]))
    view.prefill(torch.tensor([7]))
    assert model.num_committed == 3 and view.num_committed == 1  # separate caches
    reference = HFModel(model.hf_model).self_draft([0])
    tree = DraftTree.from_parents([4, 5], [-1, 0])
    view.prefill(torch.tensor([1, 2, 3]))
    reference.prefill(torch.tensor([1, 2, 3]))
    # transformers normalises in float32 even for float64 models: agreement to 1e-5
    assert (view.forward_tree(tree) - reference.forward_tree(tree)).abs().max().item() < 1e-5


def test_long_prompt_runs_in_chunks_and_grows_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1,200-token prompt in 512-token chunks (three prompt passes: the first with the fused
    attention's own causal masking, the others masked after earlier slots; past the first
    1,024-slot allocation) gives the root logits of sequential decoding, to 1e-9."""
    import verispec.models.runtime as runtime

    monkeypatch.setattr(runtime, "_PREFILL_CHUNK", 512)
    model = FastModel(tiny_model("llama", vocab_size=V, seed=1, max_length=2048).hf_model)
    ids = torch.randint(0, V, (1200,), generator=torch.Generator().manual_seed(5)).tolist()
    model.prefill(torch.tensor(ids))
    root = model.forward_tree(DraftTree.empty())[0]
    assert (root - sequential_logits(model, ids)[-1]).abs().max().item() < EXACT


def test_rows_padded_to_keep_products_row_invariant() -> None:
    """One token runs as at least two rows, and as many as make the attention products four
    rows when each key/value head serves few query heads."""
    gqa = fast()  # 4 query heads over 2 key/value heads
    assert gqa._shared.bucket(1) == 2 and gqa._shared.bucket(3) == 3
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,  # multi-head attention: G = 1
        max_position_embeddings=64,
    )
    assert FastModel(LlamaForCausalLM(config))._shared.bucket(1) == 4


def test_keep_source_false_drops_the_transformers_model() -> None:
    """keep_source=False keeps no reference to the transformers model (it is freed once the
    caller lets go of it: weak reference dead after garbage collection) and computes the same
    logits as a runtime that keeps it."""
    import gc
    import weakref

    hf = tiny_model(vocab_size=V, seed=2, dtype=torch.float32).hf_model
    kept = FastModel(hf, dtype=torch.float32)
    dropped = FastModel(hf, dtype=torch.float32, keep_source=False)
    assert kept.hf_model is hf and dropped.hf_model is None
    assert dropped.config is hf.config and dropped.eos_token_id == kept.eos_token_id
    source = weakref.ref(hf)
    del hf, kept
    gc.collect()
    assert source() is None
    tree = DraftTree.from_parents([5, 6, 7], [-1, 0, 0])
    dropped.prefill(torch.tensor([1, 2, 3]))
    logits = dropped.forward_tree(tree)
    reference = FastModel(
        tiny_model(vocab_size=V, seed=2, dtype=torch.float32).hf_model, dtype=torch.float32
    )
    reference.prefill(torch.tensor([1, 2, 3]))
    assert torch.equal(logits, reference.forward_tree(tree))
    assert "LlamaForCausalLM" in repr(dropped)
    with pytest.raises(ConfigError, match="keep_source"):
        FastModel(reference.hf_model, keep_source="no")  # type: ignore[arg-type]


def test_kv_cache_view() -> None:
    """kv_cache() gives each layer's committed keys and values, Shape: (1, Hkv, S, D), without
    the values' column of ones."""
    model = fast()
    model.prefill(torch.tensor([1, 2, 3, 4]))
    keys, values = model.kv_cache()[0]
    assert keys.shape == values.shape == (1, 2, 3, 8)


def test_dtype_and_runtime_choices() -> None:
    """dtype='auto' takes default_dtype(); the runtime string names what runs; make_target
    picks the runtime, or the adapter when asked, and says which."""
    hf = tiny_model("llama", vocab_size=V, dtype=torch.float32).hf_model
    assert FastModel(hf, dtype="auto").dtype == default_dtype("cpu")
    assert isinstance(make_target(hf, runtime="hf"), HFModel)
    chosen = make_target(hf)
    assert isinstance(chosen, FastModel) and "fast runtime" in chosen.runtime_note


@pytest.mark.parametrize(
    ("onednn_bf16", "flags", "expected"),
    [
        (True, {"avx2", "fma", "avx512f", "avx512_bf16"}, torch.bfloat16),  # Zen 5 EPYC
        (True, {"avx2", "fma", "avx512f", "amx_bf16"}, torch.bfloat16),  # AMX Xeon
        (True, {"avx2", "fma", "avx512f", "avx512_vnni"}, torch.float32),  # VNNI Xeon: emulated
        (False, {"avx2", "fma"}, torch.float32),  # AVX2-only EPYC
        (False, {"avx512_bf16"}, torch.float32),  # flag seen, but oneDNN does not use it
    ],
)
def test_default_dtype_is_bfloat16_only_where_the_cpu_multiplies_it(
    monkeypatch: pytest.MonkeyPatch, onednn_bf16: bool, flags: set[str], expected: torch.dtype
) -> None:
    """default_dtype (what dtype='auto' takes for dense weights) is bfloat16 only where the CPU
    has bfloat16 instructions and oneDNN uses them: oneDNN also reports bfloat16 on AVX-512
    CPUs that only emulate it, where float32 stays the choice. A GPU takes bfloat16."""
    import verispec.kernels.cpu.features as features

    monkeypatch.setattr(features, "bf16_supported", lambda: onednn_bf16)
    monkeypatch.setattr(features, "cpu_flags", lambda: flags)
    assert features.bf16_native() is (expected == torch.bfloat16)
    assert features.default_dtype("cpu") == expected
    assert features.default_dtype("cuda") == torch.bfloat16


def test_auto_dtype_reads_gguf_blocks_in_float32() -> None:
    """dtype='auto' on a model whose weights are Q4_1 blocks (a GGUF file's, dequantized) is
    float32 where the block kernel runs, even on a CPU with native bfloat16 (float32 then
    reads the blocks: faster, and exact), and its products are the block kernel; random
    weights keep default_dtype()."""
    hf = tiny_model("llama", vocab_size=V, dtype=torch.float32, hidden_size=64).hf_model
    assert not holds_blocks(hf)
    assert auto_dtype("cpu", blocks=holds_blocks(hf)) == default_dtype("cpu")
    with torch.no_grad():
        for module in hf.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(quantize_blocks(module.weight, "q4_1"))
    if not kernel_status()[0]:
        assert auto_dtype("cpu", blocks=holds_blocks(hf)) == default_dtype("cpu")
        return
    assert holds_blocks(hf)
    model = FastModel(hf, dtype="auto")
    assert model.dtype == torch.float32 and "GGUF blocks" in model.runtime


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": torch.int8}, "`dtype` must be one of"),
        ({"prepack": "yes"}, "`prepack` must be"),
        ({"dtype": torch.float64, "prepack": True}, "`prepack=True` needs"),
        ({"max_length": 1}, "`max_length` must be an integer >= 2"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    """Bad constructor arguments raise ConfigError naming the argument and what is allowed."""
    hf = tiny_model("llama", vocab_size=V).hf_model
    with pytest.raises(ConfigError, match=match):
        FastModel(hf, **kwargs)


def test_unsupported_model_falls_back_to_the_adapter() -> None:
    """A rotary scaling that depends on the length is refused by the runtime with a named error;
    make_target(runtime='auto') then wraps the model in the adapter and says why."""
    hf = tiny_model("llama", vocab_size=V).hf_model
    hf.model.rotary_emb.rope_type = "dynamic"
    with pytest.raises(UnsupportedModelError, match="rope_type 'dynamic'"):
        FastModel(hf)
    model = make_target(hf)
    assert isinstance(model, HFModel) and "does not cover" in model.runtime_note
    with pytest.raises(UnsupportedModelError):
        make_target(hf, runtime="fast")
    with pytest.raises(ConfigError, match="`runtime` must be one of"):
        make_target(hf, runtime="vllm")


# -- the real model (slow) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(default_model: tuple) -> tuple[FastModel, object]:
    """The session's SmolLM2 (conftest.py): ``load_default_model()``'s float32 runtime,
    which is ``FastModel(hf_model, dtype=torch.float32)`` on the transformers model it
    keeps, loaded once per worker instead of a second load here."""
    model, tokenizer = default_model
    assert isinstance(model, FastModel) and model.dtype == torch.float32, model
    return model, tokenizer


@pytest.mark.slow
def test_smollm2_greedy_equals_generate(smollm2: tuple) -> None:
    """On SmolLM2 in float32 the runtime's greedy decoding equals transformers' generate, token
    for token, for 3 prompts x 32 tokens."""
    runtime, tokenizer = smollm2
    hf_model = runtime.hf_model
    decoder = SpeculativeDecoder(runtime, None, Greedy())
    for prompt in ("What is the capital of France?", "Write a haiku.", "def fibonacci(n):"):
        ids = tokenizer.encode(prompt)
        with torch.no_grad():
            out = hf_model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=32,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )
        assert decoder.generate(ids, max_new_tokens=32).tokens == out[0, len(ids) :].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", _invariant_dtypes(), ids=str)
def test_smollm2_drafters_token_identical_to_ar(smollm2: tuple, dtype: torch.dtype) -> None:
    """On SmolLM2, at float32 and at bfloat16 (where native), Token Recycling, dynamic Token
    Recycling and prompt lookup generate exactly the runtime's own greedy tokens (at most 48
    tokens, 4 prompts: two short ones, two whose generation crosses cache slot 128 and 256),
    and each accepts drafts. Fixed tree sizes: the sizes the device picks (``auto``) are gated
    on the wall clock and may send no tree on a loaded machine (their exactness: test_gate)."""
    from verispec.drafters import DynamicTokenRecycling, PromptLookup, TokenRecycling

    runtime, tokenizer = smollm2
    # float32: the session's runtime is that model (the fixture checks it); else built here
    model = runtime if dtype == runtime.dtype else FastModel(runtime.hf_model, dtype=dtype)
    if not model.row_invariant:
        pytest.skip(f"this machine's {dtype} kernels are not row-invariant (see docs/runtime)")
    drafters = [TokenRecycling("16"), DynamicTokenRecycling(8), PromptLookup(max_tokens=10)]
    accepted = [0] * len(drafters)  # drafters keep what they learn across the prompts
    items = ", ".join(f"item {i}" for i in range(60))
    long_texts = [f"Sort these by number, largest first: {items[: n * 9]}." for n in (14, 38)]
    for text in (
        "List five fruits and their colours.",
        "Repeat: the cat sat on the mat.",
        *long_texts,
    ):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer.encode(ids)
        crossed = [b for b in (128, 256) if len(ids) < b < len(ids) + 48]
        assert len(crossed) == (text in long_texts), (len(ids), crossed)
        plain = SpeculativeDecoder(model, None, Greedy()).generate(ids, max_new_tokens=48)
        for i, drafter in enumerate(drafters):
            result = SpeculativeDecoder(model, drafter, Greedy()).generate(ids, max_new_tokens=48)
            assert result.tokens == plain.tokens, type(drafter).__name__
            accepted[i] += sum(step.accepted for step in result.steps)
    assert all(count > 0 for count in accepted), accepted


def test_a_generation_allocates_its_cache_once() -> None:
    """Decoding 1,100 tokens after a short prompt never grows the cache: the decoder reserves
    prompt + max_new_tokens (plus a tree) before the prefill, so the buffers allocated then serve
    the whole generation."""
    model = FastModel(tiny_model("llama", vocab_size=V, seed=1, max_length=2048).hf_model)
    decoder = SpeculativeDecoder(model, None, Greedy())
    allocations = []
    reserve = model._reserve

    def counting(slots: int) -> None:
        before = model._caches[0].k if model._caches else None
        reserve(slots)
        if model._caches[0].k is not before:
            allocations.append(model._caches[0].capacity)

    model._reserve = counting  # type: ignore[method-assign]
    result = decoder.generate([1, 2, 3], max_new_tokens=1100, eos_token_ids=[])
    assert len(result.tokens) == 1100
    assert len(allocations) == 1 and allocations[0] >= 3 + 1100
