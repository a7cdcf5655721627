"""Tests of verispec/models/llama.py: the decoder module against transformers, and conversion."""

from __future__ import annotations

import pytest
import torch

from verispec.errors import UnsupportedModelError
from verispec.models import tiny_model
from verispec.models.llama import ModelArgs, Pass, Transformer, from_hf

V = 64


def _causal(model: Transformer, ids: list[int]) -> torch.Tensor:
    """One causal pass from an empty cache: logits of every position, Shape: (len(ids), V).

    The pass attends to 128 slots: the n new ones (causally), then empty ones (masked)."""
    n = len(ids)
    caches = model.setup_caches(128)
    causal = torch.ones(n, n, dtype=torch.bool).tril_()
    with torch.no_grad():
        hidden = model(
            Pass(torch.tensor(ids), torch.arange(n), caches, torch.tensor([0, 128]), causal)
        )
        return model.logits(hidden)


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_matches_transformers_forward(architecture: str, dtype: torch.dtype) -> None:
    """A causal pass equals transformers' forward for Llama, Qwen2 and Mistral: to 1e-5 in
    float64 (transformers' RMSNorm computes in float32 even for float64 models) and 1e-4 in
    float32."""
    hf = tiny_model(architecture, vocab_size=V, seed=3, dtype=dtype).hf_model
    ids = [5, 17, 3, 60, 2, 9, 31]
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0]
    got = _causal(from_hf(hf, max_positions=64), ids)
    assert got.dtype == dtype
    assert (got - expected).abs().max().item() < (1e-5 if dtype == torch.float64 else 1e-4)


def test_conversion_fuses_projections_and_folds_the_scale() -> None:
    """wqkv holds the query rows times 1/sqrt(D) then the key and value rows (with Qwen2's
    biases likewise); w13 holds gate then up; tied embeddings stay one tensor."""
    hf = tiny_model("qwen2", vocab_size=V, seed=4).hf_model
    model = from_hf(hf, max_positions=64)
    attn, mlp = hf.model.layers[0].self_attn, hf.model.layers[0].mlp
    scale = model.args.head_dim**-0.5
    wqkv = model.layers[0].attention.wqkv
    assert torch.equal(wqkv.weight[:32], attn.q_proj.weight * scale)
    assert torch.equal(wqkv.weight[32:48], attn.k_proj.weight)
    assert torch.equal(wqkv.bias[48:], attn.v_proj.bias)
    w13 = model.layers[0].feed_forward.w13.weight
    assert torch.equal(w13, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    hf.config.tie_word_embeddings = True
    tied = from_hf(hf, max_positions=64)
    assert tied.output.weight is tied.tok_embeddings.weight


def test_model_args_from_config() -> None:
    """ModelArgs reads heads, key/value heads, head dim, widths, epsilon and biases."""
    args = ModelArgs.from_hf_config(tiny_model("qwen2", vocab_size=V).hf_model.config)
    assert (args.vocab_size, args.dim, args.n_layers) == (V, 32, 2)
    assert (args.n_heads, args.n_kv_heads, args.head_dim, args.hidden_dim) == (4, 2, 8, 64)
    assert args.qkv_bias and not args.o_bias and not args.mlp_bias


def test_unsupported_configs_are_named() -> None:
    """Another architecture or activation raises UnsupportedModelError naming it."""
    config = tiny_model("llama", vocab_size=V).hf_model.config
    config.model_type = "gpt2"
    with pytest.raises(UnsupportedModelError, match="model_type 'gpt2'"):
        ModelArgs.from_hf_config(config)
    config.model_type, config.hidden_act = "llama", "gelu"
    with pytest.raises(UnsupportedModelError, match="hidden_act='silu'; got 'gelu'"):
        ModelArgs.from_hf_config(config)


def test_rope_rounds_as_the_rotate_half_expression() -> None:
    """The rotary embedding, computed with half-width temporaries, gives the bits of
    ``x * cos + rotate_half(x) * sin`` as separate float32 operations (transformers' form)."""
    from verispec.models.llama import _rope

    generator = torch.Generator().manual_seed(11)
    x = torch.randn(37, 5, 64, generator=generator)
    cos, sin = torch.randn(37, 64, generator=generator), torch.randn(37, 64, generator=generator)
    rotated = torch.cat([-x[..., 32:], x[..., :32]], dim=-1)
    assert torch.equal(_rope(x, cos, sin), x * cos[:, None] + rotated * sin[:, None])


def test_prompt_feed_forward_in_row_chunks_equals_one_product(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prompt pass's feed-forward, run in chunks of 7 rows with ``silu(gate) * up`` in
    place, equals the tree pass's single product of all 40 rows, and leaves its input
    untouched."""
    import verispec.models.llama as llama

    hf = tiny_model("llama", vocab_size=V, seed=6, dtype=torch.float32).hf_model
    ffn = from_hf(hf, max_positions=64).layers[0].feed_forward
    x = torch.randn(40, ffn.w13.in_features, generator=torch.Generator().manual_seed(2))
    before = x.clone()
    with torch.no_grad():
        whole = ffn(x, llama.PassKind.TREE)
        monkeypatch.setattr(llama, "PROMPT_MLP_ROWS", 7)
        chunked = ffn(x, llama.PassKind.PROMPT)
    assert torch.equal(x, before)
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)
