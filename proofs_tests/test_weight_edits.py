"""Tests of the wrapped model's freshness in verispec/custom_generate.py: after an edit of the
weights that leaves sums and version counters as they were (a reordering through ``.data``,
two values swapped), the next ``custom_generate`` call rebuilds the wrapped model and
follows ``generate``; the row and column sums behind the check see every single change and
every swap, on every dtype; and ``load_default_model(max_length=...)`` caps the context of
the runtime ``custom_generate`` builds."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from saved_models import save_tiny_model

import verispec
from verispec.custom_generate import _device_marginals, _fingerprint, _marginals, target_for
from verispec.errors import ContextLengthError
from verispec.models.tiny import tiny_llama

PROMPT = [[5, 9, 14, 5, 9, 14, 22, 5, 9]]
NEW = 24

pytestmark = pytest.mark.usefixtures("one_thread")


def _ids() -> torch.Tensor:
    return torch.tensor(PROMPT)


def _swap(weight: torch.Tensor, a: tuple[int, int], b: tuple[int, int]) -> None:
    """Swap two values of ``weight`` through ``.data`` (no version counter sees it)."""
    first, second = weight.data[a].clone(), weight.data[b].clone()
    weight.data[a], weight.data[b] = second, first


def _word_sum(tensor: torch.Tensor) -> int:
    """What the check used to compare: the tensor's 64-bit words summed modulo 2**64 (its
    bytes are a multiple of 8 here), which no reordering changes."""
    import numpy as np

    words = tensor.detach().reshape(-1).view(torch.uint8).numpy().view(np.uint64)
    return int(np.add.reduce(words, dtype=np.uint64))


def _edit(model: Any, kind: str) -> None:
    if kind == "rows reversed":  # the red-team edit, on the tiny model's layer 1
        weight = model.model.layers[1].self_attn.o_proj.weight
        weight.data[:16] = weight.data[:16].flip(0).clone()
    elif kind == "two values of a row swapped":
        _swap(model.model.embed_tokens.weight, (9, 0), (9, 1))
    else:  # two values of a column
        _swap(model.model.embed_tokens.weight, (9, 0), (0, 0))


@pytest.mark.parametrize(
    "kind", ["rows reversed", "two values of a row swapped", "two values of a column swapped"]
)
def test_a_reordering_through_data_rebuilds_the_wrapped_model(kind: str) -> None:
    """A reordering edit through ``.data`` keeps every tensor's sum and version counter, yet
    changes ``generate``'s answer; the next ``custom_generate`` call, through the same
    callable and through a new one, rebuilds the wrapped model and returns ``generate``'s
    tokens for the edited weights."""
    model = tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, max_length=512).hf_model
    fast = verispec.speculative("ar")
    before = model.generate(_ids(), max_new_tokens=NEW, do_sample=False, custom_generate=fast)
    first = target_for(model)
    unseen = [(p._version, _word_sum(p)) for p in model.parameters()]
    _edit(model, kind)
    assert [(p._version, _word_sum(p)) for p in model.parameters()] == unseen
    expected = model.generate(_ids(), max_new_tokens=NEW, do_sample=False)
    assert not torch.equal(expected, before)  # the edit matters
    out = model.generate(_ids(), max_new_tokens=NEW, do_sample=False, custom_generate=fast)
    assert torch.equal(out, expected)
    again = verispec.speculative("ar")
    out = model.generate(_ids(), max_new_tokens=NEW, do_sample=False, custom_generate=again)
    assert torch.equal(out, expected)
    assert target_for(model) is not first


_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8]
_SHAPES = [(7, 12), (5, 3), (6, 5, 4), (40,), ()]  # 8-byte rows, odd rows, 3-D, 1-D, 0-D


def _random(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> Any:
    if dtype == torch.int8:
        return torch.randint(-128, 128, shape, generator=generator, dtype=torch.int8)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("shape", _SHAPES, ids=str)
def test_the_sums_see_every_single_change_and_every_swap(
    dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    """For each element, a flip of any one of its bits changes the marginals; for every pair
    of unequal elements, swapping them changes the marginals; so does a value's swap with
    its negation elsewhere (a change by the sign bit only, which a sum of 64-bit words
    weighted by position modulo 2**64 can miss); and reversing the rows (of distinct sums)."""
    generator = torch.Generator().manual_seed(3)
    tensor = _random(shape, dtype, generator)
    seen = _marginals(tensor)
    flat = tensor.reshape(-1)
    signed = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    bits = flat.view(signed[tensor.element_size()])
    top = 8 * tensor.element_size() - 1
    for i in range(flat.numel()):
        for bit in range(top + 1):
            edited = bits.clone()
            edited[i] ^= (1 << bit) if bit < top else -(1 << bit)  # the sign bit: negative
            assert _marginals(edited.view(dtype).reshape(shape)) != seen, (i, bit)
    for i in range(flat.numel()):
        for j in range(i + 1, flat.numel()):
            if torch.equal(bits[i], bits[j]):
                continue
            swapped = flat.clone()
            swapped[i], swapped[j] = flat[j], flat[i]
            assert _marginals(swapped.reshape(shape)) != seen, (i, j)
    if dtype.is_floating_point and flat.numel() > 1:
        opposite = flat.clone()
        opposite[-1] = -opposite[0]  # then swap the two: each changes by its sign bit only
        before = _marginals(opposite.reshape(shape))
        opposite[0], opposite[-1] = opposite[-1].clone(), opposite[0].clone()
        assert _marginals(opposite.reshape(shape)) != before
    if len(shape) > 1:
        assert _marginals(tensor.flip(0).contiguous()) != seen


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("shape", _SHAPES, ids=str)
def test_the_device_sums_equal_the_cpu_ones(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """The sums a GPU computes (signed integers, torch) have the bits of the CPU's (unsigned,
    numpy): run here on the CPU tensor, where they must agree."""
    tensor = _random(shape, dtype, torch.Generator().manual_seed(5))
    rows = tensor.shape[0] if tensor.ndim else 1
    row_bytes = tensor.numel() // rows * tensor.element_size()
    width = 8 if row_bytes % 8 == 0 else tensor.element_size()
    flat = tensor.reshape(-1).view(torch.uint8)
    assert _device_marginals(flat, rows, width) == _marginals(tensor)


def test_large_blocks_are_summed_like_one() -> None:
    """A tensor of more rows than one block holds (the sums are taken block by block) gets
    the sums numpy takes of the whole matrix at once."""
    import numpy as np

    tensor = torch.randn(3000, 576, generator=torch.Generator().manual_seed(1))
    words = tensor.numpy().view(np.uint64)
    assert _marginals(tensor) == (
        words.sum(axis=1, dtype=np.uint64).tobytes(),
        words.sum(axis=0, dtype=np.uint64).tobytes(),
    )


@pytest.mark.slow
def test_smollm2_the_red_team_reordering_is_seen(default_model: tuple[Any, Any]) -> None:
    """On SmolLM2-135M (the shared model, restored afterwards), reversing rows 0-255 of layer
    7's ``o_proj`` through ``.data`` changes ``generate``'s greedy answer and the check's
    fingerprint, which the check it replaced (a sum of each tensor's words) missed."""
    hf = default_model[0].hf_model
    ids = torch.tensor([default_model[1].encode("The planets of the solar system are")])
    expected = hf.generate(ids, max_new_tokens=24, do_sample=False)
    before = _fingerprint(hf)
    weight = hf.model.layers[7].self_attn.o_proj.weight
    try:
        weight.data[:256] = weight.data[:256].flip(0).clone()
        assert _fingerprint(hf) != before
        assert not torch.equal(hf.generate(ids, max_new_tokens=24, do_sample=False), expected)
    finally:
        weight.data[:256] = weight.data[:256].flip(0).clone()  # its own inverse: restored
    assert _fingerprint(hf) == before


def test_load_model_max_length_caps_custom_generate(tmp_path: Path) -> None:
    """``load_model(path, max_length=64)`` (which ``load_default_model`` is, on the embedded
    file) records the cap on the returned model's ``hf_model``:
    ``hf_model.generate(custom_generate=...)`` builds its runtime with it (a prompt that
    fills it is refused, a longer answer stops there), while an explicit
    ``target_for(max_length=...)`` still wins; without a cap the model's own context holds."""
    from verispec.models.loading import load_model

    directory = save_tiny_model(tmp_path / "tiny")
    model, _ = load_model(directory, max_length=64)
    assert model.max_length == 64
    hf = model.hf_model
    hf.generation_config.eos_token_id = None  # the answer runs into the cap, not into eos
    fast = verispec.speculative("ar")
    with pytest.raises(ContextLengthError, match="context holds 64"):
        hf.generate(torch.tensor([[5] * 64]), max_new_tokens=4, custom_generate=fast)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = hf.generate(_ids(), max_new_tokens=100, do_sample=False, custom_generate=fast)
    assert out.shape[1] == 64 + 1  # the last new token needs no slot in the cache
    assert any("generation stops there" in str(w.message) for w in caught)
    assert target_for(hf).max_length == 64
    assert target_for(hf, max_length=128).max_length == 128
    unset, _ = load_model(directory)
    assert target_for(unset.hf_model).max_length == unset.hf_model.config.max_position_embeddings
