"""The tree attention inside transformers: equal to sdpa, falls back where it must, and
decoding with every kernel on is token-identical to decoding with the references."""

from __future__ import annotations

import warnings

import pytest
import torch

from verispec import SpeculativeDecoder
from verispec.core.tree import DraftTree
from verispec.drafters import TokenRecycling
from verispec.kernels import hf_attention
from verispec.kernels.backend import use_backend
from verispec.models import HFModel, tiny_llama
from verispec.verifiers import Greedy
from verispec.verifiers.recursive import RecursiveRejection

PROMPT = [3, 17, 5, 9, 22, 41, 8, 30, 12, 7, 50, 2, 19]


def _pair(dtype: torch.dtype, device: torch.device) -> tuple[HFModel, HFModel]:
    """The same tiny Llama twice: sdpa, and the verispec attention."""
    reference = tiny_llama(dtype=dtype, device=device, seed=1)
    kernel_model = tiny_llama(dtype=dtype, device=device, seed=1)
    return reference, HFModel(kernel_model.hf_model, attention="verispec")


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_tree_and_extension_logits_equal_sdpa(triton_backend, device, dtype, tolerance) -> None:  # type: ignore[no-untyped-def]
    """A tiny Llama (4 heads over 2 KV heads) scoring a 21-node tree after a 13-token prompt,
    then growing it by 6 nodes (``extend_from``, a partial prefix mask), gives the logits of
    sdpa within the tolerance."""
    reference, kernel_model = _pair(dtype, device)
    parents = [-1, -1, 0, 0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 9, -1, 15, 16, 17, 10, 11]
    tree = DraftTree.from_parents([(7 * i + 3) % 64 for i in range(21)], parents)
    grown = DraftTree.from_parents(
        [*tree.tokens.tolist(), 1, 2, 3, 4, 5, 6], [*parents, 20, 21, 0, 15, 19, 22]
    )
    for model in (reference, kernel_model):
        model.prefill(torch.tensor(PROMPT))
    first = [m.forward_tree(tree) for m in (reference, kernel_model)]
    assert (first[0] - first[1]).abs().max().item() < tolerance
    second = [m.forward_tree(grown, extend_from=21) for m in (reference, kernel_model)]
    assert (second[0] - second[1]).abs().max().item() < tolerance


def test_falls_back_to_sdpa_once_per_reason(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """On CPU tensors without forcing, and with a float mask when forced, the function returns
    sdpa's output exactly and warns once per reason, naming it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    monkeypatch.setattr(hf_attention, "_warned", set())
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True  # type: ignore[assignment]
    g = torch.Generator().manual_seed(0)
    query = torch.randn(1, 4, 5, 16, generator=g)
    key, value = torch.randn(2, 1, 2, 9, 16, generator=g)
    mask = torch.ones(1, 1, 5, 9, dtype=torch.bool).tril(diagonal=4)
    expected = sdpa_attention_forward(module, query, key, value, mask)[0]
    with use_backend("auto"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            out = hf_attention.verispec_attention_forward(module, query, key, value, mask)[0]
            assert torch.equal(out, expected)
    assert len(caught) == 1 and "falls back to sdpa" in str(caught[0].message)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    if not _can_force():
        return
    with use_backend("triton"), pytest.warns(RuntimeWarning, match="float"):
        out = hf_attention.verispec_attention_forward(module, query, key, value, additive)[0]
    assert torch.allclose(out, expected, atol=1e-6)


def _can_force() -> bool:
    """Whether Triton can be forced on CPU tensors (the interpreter is on)."""
    from verispec.kernels.backend import interpreting

    return interpreting()


def test_greedy_decoding_with_kernels_is_token_identical(triton_backend, device) -> None:
    """Token Recycling ("16" template) on a float64 tiny Llama, 16 new tokens at temperature
    0: the Triton tree attention, KV compaction, Token Recycling and greedy kernels produce
    exactly the tokens of sdpa + the PyTorch paths."""
    reference, kernel_model = _pair(torch.float64, device)
    with use_backend("torch"):
        expected = SpeculativeDecoder(reference, TokenRecycling("16"), Greedy()).generate(
            PROMPT, max_new_tokens=16
        )
    drafter = TokenRecycling("16", kernels="triton")
    got = SpeculativeDecoder(kernel_model, drafter, Greedy(kernels="triton")).generate(
        PROMPT, max_new_tokens=16
    )
    assert got.tokens == expected.tokens
    assert got.mean_accepted_tokens == expected.mean_accepted_tokens


def test_sampled_decoding_with_kernels_is_token_identical(triton_backend, device) -> None:
    """At temperature 0.8 with the same seed, the rejection kernel (fixed point) and the
    kernels' attention produce the tokens of sdpa + ``RecursiveRejection(float64)``."""
    reference, kernel_model = _pair(torch.float64, device)
    with use_backend("torch"):
        expected = SpeculativeDecoder(
            reference, TokenRecycling("8"), RecursiveRejection(torch.float64)
        ).generate(PROMPT, max_new_tokens=10, temperature=0.8, seed=3)
    got = SpeculativeDecoder(
        kernel_model, TokenRecycling("8"), RecursiveRejection(kernels="triton")
    ).generate(PROMPT, max_new_tokens=10, temperature=0.8, seed=3)
    assert got.tokens == expected.tokens


@pytest.mark.slow
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="on a GPU only: in Triton's interpreter the real model's 30 layers cost about a "
    "minute of the CPU suite; the kernel at SmolLM2's shape (9 heads over 3 KV heads, D = 64) "
    "is test_tree_attention's 'nine heads' case, and the adapter's generation with the "
    "kernels is test_greedy_decoding_with_kernels_is_token_identical",
)
def test_smollm2_greedy_generation_with_kernels_is_token_identical(triton_backend, device) -> None:
    """SmolLM2-135M (9 heads over 3 KV heads, D = 64), Token Recycling "8", 4 new tokens at
    temperature 0: the kernels reproduce the references' tokens."""
    from verispec.models.default import load_default_model

    model, tokenizer = load_default_model(device=device)
    prompt = tokenizer.encode("The capital of France is")
    with use_backend("torch"):
        expected = SpeculativeDecoder(model, TokenRecycling("8"), Greedy()).generate(
            prompt, max_new_tokens=4
        )
    kernel_model = HFModel(model.hf_model, attention="verispec")
    try:
        got = SpeculativeDecoder(kernel_model, TokenRecycling("8"), kernels="triton").generate(
            prompt, max_new_tokens=4
        )
    finally:
        model.hf_model.set_attn_implementation("sdpa")
    assert got.tokens == expected.tokens


def test_a_causal_pass_builds_no_square_mask() -> None:
    """A prefill (no mask, causal) of 4096 queries gets no (Q, Q) tree mask and no tile
    table from the adapter: the kernel compares positions itself (building one would hold
    16 M booleans plus a 64 M-byte padded table)."""
    tree_mask, prefix_mask, states, _, _ = hf_attention._tables(
        None, True, 4096, 4096, 64, torch.float16, torch.device("cpu")
    )
    assert tree_mask is None and prefix_mask is None and states == (None, None)


def test_tree_attention_is_switched_on_only_where_triton_runs(triton_backend, device) -> None:  # type: ignore[no-untyped-def]
    """``tree_attention_where_supported`` leaves a model's attention alone by default (sdpa
    is faster at the adapter's sizes, on CUDA too) and where PyTorch is asked for, and where
    Triton is asked for, runs the block with the "verispec" attention and restores the
    previous one after."""
    model = tiny_llama(dtype=torch.float32, device=device, seed=2).hf_model
    before = model.config._attn_implementation
    with use_backend("auto"), hf_attention.tree_attention_where_supported(model) as switched:
        assert not switched and model.config._attn_implementation == before
    with use_backend("torch"), hf_attention.tree_attention_where_supported(model) as switched:
        assert not switched and model.config._attn_implementation == before
    with use_backend("triton"), hf_attention.tree_attention_where_supported(model) as switched:
        assert switched and model.config._attn_implementation == "verispec"
    with hf_attention.tree_attention_where_supported(model, kernels="triton") as switched:
        assert switched and model.config._attn_implementation == "verispec"
    assert model.config._attn_implementation == before
