"""docs/transformers.rst's lists of ``generate`` options checked against the code.

The page lists the options ``custom_generate=verispec.speculative(...)`` honours and those it
refuses. Each option named in either list, and each option of transformers'
``GenerationConfig``, is tried on a tiny model: an option is refused (raises ConfigError
naming it) exactly when the page's refused list names it; every other one runs and returns
``generate``'s own greedy answer for the same options (where ``generate`` itself takes
them). A page that calls an accepted option refused, or leaves out one the code refuses,
fails here; so does a transformers release that adds a generation option nobody has
classified."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from streamers import RecordingStreamer

import verispec
from verispec.errors import ConfigError
from verispec.models.tiny import ByteTokenizer, tiny_llama

PAGE = Path(__file__).resolve().parents[1] / "docs" / "transformers.rst"
PROMPT = [[5, 9, 14, 5, 9, 14, 22, 5, 9]]
NEW = 8

pytestmark = pytest.mark.usefixtures("one_thread")


def listed(lead: str, text: str | None = None) -> set[str]:
    """The option names of the bullet list that follows the paragraph starting with
    ``lead`` on the page: in each bullet, the ````names```` before its first ``": "``."""
    text = PAGE.read_text(encoding="utf-8") if text is None else text
    assert lead in text, f"docs/transformers.rst has no list led by {lead!r}"
    bullets: list[str] = []
    for line in text[text.index(lead) :].splitlines()[1:]:
        if line.startswith("* "):
            bullets.append(line[2:])
        elif line.startswith("  ") and bullets:
            bullets[-1] += " " + line.strip()
        elif bullets or line.strip():
            break
    assert bullets, f"the list led by {lead!r} is empty"
    return {name for b in bullets for name in re.findall(r"``(\w+)``", b.split(": ", 1)[0])}


def honoured() -> set[str]:
    return listed("**Honoured:**")


def refused() -> set[str]:
    return listed("**Refused**")


@attrs.frozen
class Probe:
    """How to try one option: ``generate``'s keyword arguments for it (given the model),
    the error message's pattern where the code refuses it, whether ``generate`` itself
    takes the same arguments (then its greedy answer is the reference), and the keywords
    of ``speculative``."""

    kwargs: Callable[[Any], dict[str, Any]]
    match: str | None = None
    reference: bool = True
    speculative: dict[str, Any] = attrs.field(factory=dict)


def _set(**kwargs: Any) -> Callable[[Any], dict[str, Any]]:
    return lambda model: dict(kwargs)


SAMPLE = {"do_sample": True, "top_k": 1}  # sampling that keeps the argmax: greedy's answer


class _AddToThree:
    """A logits processor of one's own, a function of the prefix."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        scores[:, 3] += 5.0
        return scores


def _never() -> Any:
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Never(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    return StoppingCriteriaList([Never()])


def _filled_cache(model: Any) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model(torch.tensor([PROMPT[0][:4]]), past_key_values=cache, use_cache=True)
    return cache


def _padded() -> torch.Tensor:
    mask = torch.ones(1, len(PROMPT[0]), dtype=torch.long)
    mask[0, 0] = 0
    return mask


def _synthid() -> Any:
    from transformers import SynthIDTextWatermarkingConfig

    return SynthIDTextWatermarkingConfig(keys=[3, 5, 7], ngram_len=2)


PROBES: dict[str, Probe] = {
    # honoured: lengths, sampling, stops, outputs, the callable's own keywords
    "max_new_tokens": Probe(_set(max_new_tokens=5)),
    "max_length": Probe(_set(max_length=len(PROMPT[0]) + 6, max_new_tokens=None)),
    "do_sample": Probe(_set(**SAMPLE)),
    "temperature": Probe(_set(**SAMPLE, temperature=0.5)),
    "top_k": Probe(_set(**SAMPLE)),
    "top_p": Probe(_set(**SAMPLE, top_p=0.5)),
    "min_p": Probe(_set(**SAMPLE, min_p=0.5)),
    "eos_token_id": Probe(_set(eos_token_id=9)),
    "streamer": Probe(lambda model: {"streamer": RecordingStreamer()}),
    "return_dict_in_generate": Probe(_set(return_dict_in_generate=True)),
    "stop_strings": Probe(
        _set(stop_strings=["\n\n"]), reference=False, speculative={"tokenizer": ByteTokenizer()}
    ),
    "seed": Probe(_set(seed=5), reference=False),
    # honoured: the logits processors generate builds, and one's own
    "repetition_penalty": Probe(_set(repetition_penalty=3.0)),
    "encoder_repetition_penalty": Probe(_set(encoder_repetition_penalty=3.0)),
    "no_repeat_ngram_size": Probe(_set(no_repeat_ngram_size=2)),
    "bad_words_ids": Probe(_set(bad_words_ids=[[9]])),
    "min_length": Probe(_set(min_length=len(PROMPT[0]) + 6, eos_token_id=9)),
    "min_new_tokens": Probe(_set(min_new_tokens=6, eos_token_id=9)),
    "sequence_bias": Probe(_set(sequence_bias={(9,): -10.0})),
    "suppress_tokens": Probe(_set(suppress_tokens=[9, 14])),
    "begin_suppress_tokens": Probe(_set(begin_suppress_tokens=[9])),
    "forced_bos_token_id": Probe(_set(forced_bos_token_id=3)),
    "forced_eos_token_id": Probe(_set(forced_eos_token_id=1)),
    "exponential_decay_length_penalty": Probe(_set(exponential_decay_length_penalty=(3, 1.5))),
    "remove_invalid_values": Probe(_set(remove_invalid_values=True)),
    "renormalize_logits": Probe(_set(renormalize_logits=True)),
    "typical_p": Probe(_set(**SAMPLE, typical_p=0.5)),
    "epsilon_cutoff": Probe(_set(**SAMPLE, epsilon_cutoff=0.01)),
    "eta_cutoff": Probe(_set(**SAMPLE, eta_cutoff=0.01)),
    "top_h": Probe(_set(**SAMPLE, top_h=0.5)),
    "watermarking_config": Probe(_set(watermarking_config={"greenlist_ratio": 0.25})),
    "prefix_allowed_tokens_fn": Probe(
        _set(prefix_allowed_tokens_fn=lambda batch, ids: list(range(2, 40)))
    ),
    "logits_processor": Probe(lambda model: {"logits_processor": [_AddToThree()]}),
    # refused
    "num_beams": Probe(_set(num_beams=2), "`num_beams` must be 1"),
    "num_return_sequences": Probe(
        _set(**SAMPLE, num_return_sequences=2), "`num_return_sequences` must be 1"
    ),
    "input_ids": Probe(
        _set(inputs=torch.tensor(PROMPT * 2)), "one sequence at a time; got a batch of 2"
    ),
    "attention_mask": Probe(lambda model: {"attention_mask": _padded()}, "`attention_mask`"),
    "inputs_embeds": Probe(
        lambda model: {"inputs_embeds": model.model.embed_tokens(torch.tensor(PROMPT))},
        "`inputs_embeds`",
    ),
    "past_key_values": Probe(
        lambda model: {"past_key_values": _filled_cache(model)}, "`past_key_values`"
    ),
    "assistant_model": Probe(lambda model: {"assistant_model": model}, "`assistant_model`"),
    "prompt_lookup_num_tokens": Probe(
        _set(prompt_lookup_num_tokens=4), "`prompt_lookup_num_tokens`"
    ),
    "assistant_early_exit": Probe(_set(assistant_early_exit=1), "`assistant_early_exit`"),
    "use_mtp": Probe(_set(use_mtp=True), "`use_mtp`"),
    "penalty_alpha": Probe(_set(penalty_alpha=0.6, top_k=4), "`penalty_alpha`"),
    "dola_layers": Probe(_set(dola_layers="low"), "`dola_layers`"),
    "constraints": Probe(_set(constraints=[]), "`constraints`"),
    "force_words_ids": Probe(_set(force_words_ids=[[9]]), "`force_words_ids`"),
    "guidance_scale": Probe(_set(guidance_scale=1.5), "ClassifierFreeGuidance"),
    "negative_prompt_ids": Probe(
        _set(negative_prompt_ids=torch.tensor([[5, 9]])), "`negative_prompt_ids`"
    ),
    "SynthIDTextWatermarkingConfig": Probe(
        lambda model: {"watermarking_config": _synthid()}, "SynthIDTextWatermark"
    ),
    "encoder_no_repeat_ngram_size": Probe(
        _set(encoder_no_repeat_ngram_size=2), "EncoderNoRepeatNGram"
    ),
    "max_time": Probe(_set(max_time=10.0), "MaxTimeCriteria"),
    "stopping_criteria": Probe(
        lambda model: {"stopping_criteria": _never()}, "stopping criterion `Never`"
    ),
    "output_scores": Probe(
        _set(return_dict_in_generate=True, output_scores=True), "`output_scores`"
    ),
    "output_logits": Probe(
        _set(return_dict_in_generate=True, output_logits=True), "`output_logits`"
    ),
    "output_attentions": Probe(
        _set(return_dict_in_generate=True, output_attentions=True), "`output_attentions`"
    ),
    "output_hidden_states": Probe(
        _set(return_dict_in_generate=True, output_hidden_states=True), "`output_hidden_states`"
    ),
    "synced_gpus": Probe(_set(synced_gpus=True), "`synced_gpus=True`"),
    # neither list: they change nothing in one greedy sequence
    "early_stopping": Probe(_set(early_stopping=True)),
    "length_penalty": Probe(_set(length_penalty=2.0)),
    "diversity_penalty": Probe(_set(diversity_penalty=1.0)),
    "num_beam_groups": Probe(_set(num_beam_groups=2)),
    "use_cache": Probe(_set(use_cache=False)),
    "cache_implementation": Probe(_set(cache_implementation="static")),
    "cache_config": Probe(_set(cache_implementation="static", cache_config={"max_cache_len": 64})),
    "max_cache_len": Probe(_set(max_cache_len=64)),
    "pad_token_id": Probe(_set(pad_token_id=0)),
    "bos_token_id": Probe(_set(bos_token_id=3)),
    "decoder_start_token_id": Probe(_set(decoder_start_token_id=0)),
    "num_assistant_tokens": Probe(_set(num_assistant_tokens=3)),
    "num_assistant_tokens_schedule": Probe(_set(num_assistant_tokens_schedule="constant")),
    "assistant_confidence_threshold": Probe(_set(assistant_confidence_threshold=0.2)),
    "max_matching_ngram_size": Probe(_set(max_matching_ngram_size=3)),
    "assistant_lookbehind": Probe(_set(assistant_lookbehind=5)),
    "target_lookbehind": Probe(_set(target_lookbehind=5)),
    "assistant_ensemble_weight": Probe(_set(assistant_ensemble_weight=0.5)),
    "speculation_type": Probe(_set(speculation_type="dflash")),
    "compile_config": Probe(lambda model: {"compile_config": _compile_config()}),
    "disable_compile": Probe(_set(disable_compile=True)),
    "low_memory": Probe(_set(low_memory=True)),
    "prefill_chunk_size": Probe(_set(prefill_chunk_size=4)),
}


def _compile_config() -> Any:
    from transformers import CompileConfig

    return CompileConfig(fullgraph=False)


# GenerationConfig fields no probe tries, and why
NOT_PROBED = {
    "token_healing": "needs a real tokenizer; generate heals the prompt before the callable "
    "runs, so verispec decodes the healed prompt as generate does",
    "is_assistant": "set by transformers on an assistant model, never on the model decoding",
    "continuous_batching_config": "deprecated (5.13): continuous batching is generate's other "
    "path, which a custom_generate call never takes",
    "transformers_version": "not an option",
    "_from_model_config": "not an option",
}


@pytest.fixture(scope="module")
def model() -> Any:
    """A tiny float64 Llama over the byte vocabulary (V = 258, eos 1)."""
    return tiny_llama(vocab_size=258, hidden_size=32, num_layers=2, max_length=512).hf_model


def _run(model: Any, probe: Probe, fast: Any = None) -> torch.Tensor:
    kwargs = {"inputs": torch.tensor(PROMPT), "max_new_tokens": NEW, **probe.kwargs(model)}
    if fast is not None:
        kwargs["custom_generate"] = fast
    out = model.generate(**kwargs)
    return out.sequences if hasattr(out, "sequences") else out


def test_the_lists_name_only_options_with_a_probe() -> None:
    """Both lists are found, do not overlap, and name only options this file knows how to
    try (a new entry on the page needs a probe here)."""
    assert honoured() and refused() and not honoured() & refused()
    assert honoured() | refused() <= PROBES.keys()


def test_every_generation_config_option_is_probed() -> None:
    """Every field of transformers' ``GenerationConfig`` has a probe, or a reason not to."""
    from transformers import GenerationConfig

    fields = set(GenerationConfig().to_dict())
    assert fields - PROBES.keys() - NOT_PROBED.keys() == set()


@pytest.mark.parametrize("option", list(PROBES))
def test_an_option_is_refused_exactly_when_the_page_says(model: Any, option: str) -> None:
    """``option`` raises ConfigError naming it if the page lists it as refused; otherwise it
    runs, and where ``generate`` takes the same arguments the answer is ``generate``'s."""
    probe = PROBES[option]
    fast = verispec.speculative("ar", **probe.speculative)
    if option in refused():
        assert probe.match is not None, f"`{option}` is listed as refused: give its message"
        with pytest.raises(ConfigError, match=probe.match):
            _run(model, probe, fast)
        return
    assert probe.match is None, f"`{option}` is refused by the tests but not on the page"
    try:
        out = _run(model, probe, fast)
    except ConfigError as error:
        pytest.fail(f"`{option}` is refused ({error}) but the page does not list it as refused")
    if probe.reference:
        assert torch.equal(out, _run(model, probe))


def test_the_reader_sees_an_option_the_page_calls_refused() -> None:
    """The reader is not blind to the lists: the old page's claim that ``repetition_penalty``
    is refused, written into the refused list, is read there (and the tests above then
    fail: it is honoured, and listed so)."""
    page = PAGE.read_text(encoding="utf-8").replace(
        "* ``max_time``, ``stopping_criteria``:",
        "* ``repetition_penalty``, ``max_time``, ``stopping_criteria``:",
    )
    assert "repetition_penalty" in listed("**Refused**", page) & listed("**Honoured:**", page)
