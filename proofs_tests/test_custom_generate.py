"""Tests of verispec/custom_generate.py: ``generate(custom_generate=verispec.speculative(m))``
equals transformers' greedy ``generate`` for every method, samples reproducibly, streams, and
refuses what it cannot honour."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from streamers import RecordingStreamer

import verispec
from verispec.custom_generate import SpeculativeGenerateOutput, target_for
from verispec.errors import ConfigError, IncompatibleModelsError
from verispec.models import FastModel
from verispec.models.tiny import tiny_llama
from verispec.specs import drafter_names

PROMPT = [[5, 9, 14, 5, 9, 14, 22, 5, 9]]
NEW = 24


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def byte_model() -> tuple[Any, Any]:
    """A tiny float64 Llama over the smoke byte tokenizer (V = 258) and that tokenizer."""
    from verispec.models.tiny import ByteTokenizer

    model = tiny_llama(vocab_size=258, hidden_size=32, num_layers=2, max_length=512).hf_model
    return model, ByteTokenizer()


def _ids() -> torch.Tensor:
    return torch.tensor(PROMPT)


@pytest.mark.parametrize("method", drafter_names())
def test_every_method_greedy_equals_generate(hf_model: Any, method: str) -> None:
    """For every verispec method, ``generate`` with ``custom_generate=speculative(method)`` returns
    exactly the tokens of transformers' own greedy ``generate``, on two calls in a row."""
    expected = hf_model.generate(_ids(), max_new_tokens=NEW, do_sample=False)
    assert expected.shape[1] > len(PROMPT[0]) + 8  # a real continuation, not an instant eos
    fast = verispec.speculative(method)
    for _ in range(2):  # the second call reuses the wrapped model and the learnt drafter
        out = hf_model.generate(_ids(), max_new_tokens=NEW, do_sample=False, custom_generate=fast)
        assert torch.equal(out, expected)


def test_the_adapter_runtime_is_greedy_exact_too(hf_model: Any) -> None:
    """``runtime="hf"`` (the Hugging Face adapter) gives transformers' greedy tokens as well."""
    expected = hf_model.generate(_ids(), max_new_tokens=NEW, do_sample=False)
    out = hf_model.generate(
        _ids(), max_new_tokens=NEW, custom_generate=verispec.speculative("tr", runtime="hf")
    )
    assert torch.equal(out, expected)


def test_return_dict_carries_the_acceptance_figures(hf_model: Any) -> None:
    """``return_dict_in_generate=True`` returns the sequences with MAT, steps, tree sizes and
    accepted lengths that agree with each other and with verispec's result."""
    out = hf_model.generate(
        _ids(),
        max_new_tokens=NEW,
        custom_generate=verispec.speculative("dtr:budget=16"),  # a fixed size: trees every step
        return_dict_in_generate=True,
    )
    assert isinstance(out, SpeculativeGenerateOutput)
    new = out.sequences.shape[1] - len(PROMPT[0])
    assert out.result is not None and out.result.tokens == out.sequences[0, -new:].tolist()
    assert out.num_steps == len(out.tree_sizes) == len(out.accepted_lengths) > 0
    assert out.mean_accepted_tokens == pytest.approx(
        sum(a + 1 for a in out.accepted_lengths) / out.num_steps
    )
    assert sum(out.tree_sizes) > 0  # the drafter sent trees
    figures = out.spec_decode_metrics  # vLLM's spec-decode metric names
    assert figures is not None
    assert figures["num_draft_tokens"] == sum(out.tree_sizes)
    assert figures["num_accepted_tokens"] == sum(out.accepted_lengths)
    assert figures["num_drafts"] == sum(1 for size in out.tree_sizes if size)
    per_pos = figures["num_accepted_tokens_per_pos"]
    assert per_pos == [sum(1 for a in out.accepted_lengths if a > k) for k in range(len(per_pos))]
    assert figures["mean_accepted_tokens"] == out.mean_accepted_tokens


def test_sampling_is_reproducible_with_a_seed(hf_model: Any) -> None:
    """Sampling runs; with ``learn_across_calls=False`` a call repeats under ``torch.manual_seed``
    and under ``seed=``, another seed gives another answer, a fresh callable (which has
    learnt nothing yet) repeats the first call of another, and a learning one repeats plain
    sampling's text call after call."""
    options = {"max_new_tokens": NEW, "do_sample": True, "temperature": 1.5, "top_k": 0}

    def sample(fast: Any, **extra: Any) -> list[int]:
        return hf_model.generate(_ids(), custom_generate=fast, **options, **extra)[0].tolist()

    forgetful = verispec.speculative("dtr", learn_across_calls=False)
    torch.manual_seed(11)
    first = sample(forgetful)
    assert len(first) > len(PROMPT[0])
    torch.manual_seed(11)
    assert sample(forgetful) == first
    assert sample(forgetful, seed=5) == sample(forgetful, seed=5)
    assert sample(forgetful, seed=5) != sample(forgetful, seed=6)
    assert sample(verispec.speculative("dtr"), seed=7) == sample(
        verispec.speculative("dtr"), seed=7
    )
    # learning across calls changes no seeded draw: the text is plain sampling's
    learning, plain = verispec.speculative("dtr"), verispec.speculative("ar")
    assert [sample(learning, seed=5) for _ in range(3)] == [sample(plain, seed=5)] * 3
    # the seed range is the decoder's and the CLI's, [0, 2**64)
    assert sample(forgetful, seed=2**64 - 1) == sample(forgetful, seed=2**64 - 1)


def test_sampling_options_reach_the_decoder(hf_model: Any) -> None:
    """``temperature``, ``top_k``, ``top_p`` and ``min_p`` of the generation config become
    verispec's sampling parameters (``top_k=1`` then samples the greedy tokens)."""
    expected = hf_model.generate(_ids(), max_new_tokens=NEW, do_sample=False)
    out = hf_model.generate(
        _ids(),
        max_new_tokens=NEW,
        do_sample=True,
        temperature=0.9,
        top_k=1,
        top_p=0.95,
        min_p=0.01,
        custom_generate=verispec.speculative("pld"),
    )
    assert torch.equal(out, expected)


def test_text_iterator_streamer_receives_the_whole_text(byte_model: tuple[Any, Any]) -> None:
    """A ``TextIteratorStreamer`` fed by a generate call in another thread yields, in pieces,
    exactly the decoded answer, and ends."""
    from transformers import TextIteratorStreamer

    model, tokenizer = byte_model
    ids = torch.tensor([tokenizer.encode("abcabcabc")])
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    outputs: list[torch.Tensor] = []

    def run() -> None:
        outputs.append(
            model.generate(
                ids,
                max_new_tokens=40,
                custom_generate=verispec.speculative("tr"),
                streamer=streamer,
            )
        )

    thread = threading.Thread(target=run)
    thread.start()
    pieces = list(streamer)  # ends when generate calls streamer.end()
    thread.join(timeout=60)
    answer = tokenizer.decode(outputs[0][0, ids.shape[1] :].tolist())
    assert answer and "".join(pieces) == answer


def test_streamer_gets_each_steps_tokens(hf_model: Any) -> None:
    """The streamer gets the prompt (from generate), then one put per step whose tokens
    concatenate to the answer, then one ``end``."""
    streamer = RecordingStreamer()
    out = hf_model.generate(
        _ids(),
        max_new_tokens=NEW,
        custom_generate=verispec.speculative("pld"),
        streamer=streamer,
        return_dict_in_generate=True,
    )
    assert streamer.puts[0] == PROMPT[0]
    assert len(streamer.puts) - 1 == out.num_steps
    assert [t for put in streamer.puts[1:] for t in put] == out.sequences[
        0, len(PROMPT[0]) :
    ].tolist()
    assert streamer.ended == 1


def test_stop_strings_with_the_tokenizer_given_to_speculative(byte_model: tuple[Any, Any]) -> None:
    """``stop_strings=`` ends the answer with the token that completes the string, with the
    tokenizer given to ``speculative``; without one, a clear error says where to give it."""
    model, tokenizer = byte_model
    ids = torch.tensor([tokenizer.encode("abcabcabc")])
    full = model.generate(ids, max_new_tokens=40, do_sample=False)
    text = tokenizer.decode(full[0, ids.shape[1] :].tolist())
    stop = text[10:12]
    out = model.generate(
        ids,
        max_new_tokens=40,
        custom_generate=verispec.speculative("ar", tokenizer=tokenizer),
        stop_strings=[stop],
    )
    answer = tokenizer.decode(out[0, ids.shape[1] :].tolist())
    assert answer.endswith(stop) and answer.count(stop) == 1 and text.startswith(answer)
    with pytest.raises(ConfigError, match=r"`stop_strings` \['x'\] need the model's tokenizer"):
        model.generate(ids, max_new_tokens=5, custom_generate=verispec.speculative("ar"),
                       stop_strings=["x"])  # fmt: skip


def _custom_criteria() -> Any:
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Never(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    return StoppingCriteriaList([Never()])


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"num_beams": 2}, "`num_beams` must be 1"),
        ({"do_sample": True, "num_return_sequences": 2}, "`num_return_sequences` must be 1"),
        ({"guidance_scale": 1.5}, "UnbatchedClassifierFreeGuidanceLogitsProcessor"),
        ({"prompt_lookup_num_tokens": 4}, "`prompt_lookup_num_tokens` must be None"),
        ({"return_dict_in_generate": True, "output_scores": True}, "`output_scores` must be"),
        ({"max_time": 10.0}, "MaxTimeCriteria"),
        ({"stopping_criteria": "custom"}, "stopping criterion `Never`"),
        ({"assistant_model": "self"}, "`assistant_model` is not supported"),
        ({"seed": -1}, r"`seed` must be an integer in \[0, 2\*\*64\)"),
        ({"seed": 2**64}, r"`seed` must be an integer in \[0, 2\*\*64\)"),
        ({"stop_strings": [""]}, "`stop_strings` must not contain an empty string"),
    ],
)
def test_unsupported_options_raise_a_clear_error(hf_model: Any, options: dict, match: str) -> None:
    """An option verispec cannot honour exactly raises ConfigError naming it."""
    options = dict(options)
    if options.get("assistant_model") == "self":
        options["assistant_model"] = hf_model
    if options.get("stopping_criteria") == "custom":
        options["stopping_criteria"] = _custom_criteria()
    with pytest.raises(ConfigError, match=match):
        hf_model.generate(
            _ids(), max_new_tokens=5, custom_generate=verispec.speculative("tr"), **options
        )


def test_batches_and_padding_raise_a_clear_error(hf_model: Any) -> None:
    """A batch of two prompts, and one prompt with padding, are refused with what is allowed."""
    fast = verispec.speculative("tr")
    batch = torch.tensor([PROMPT[0], PROMPT[0]])
    with pytest.raises(ConfigError, match="one sequence at a time; got a batch of 2"):
        hf_model.generate(batch, max_new_tokens=5, custom_generate=fast)
    mask = torch.ones_like(_ids())
    mask[0, 0] = 0
    with pytest.raises(ConfigError, match="`attention_mask` must be all ones"):
        hf_model.generate(_ids(), attention_mask=mask, max_new_tokens=5, custom_generate=fast)


def test_bad_arguments_to_speculative_fail_at_once() -> None:
    """A bad spec, runtime, kernels or learn_across_calls choice raises when ``speculative``
    is called."""
    with pytest.raises(ConfigError, match="unknown method `nope`"):
        verispec.speculative("nope")
    with pytest.raises(ConfigError, match="`runtime` must be one of"):
        verispec.speculative("tr", runtime="fastest")
    with pytest.raises(ConfigError, match="`kernels` must be one of"):
        verispec.speculative("tr", kernels="cuda")
    with pytest.raises(ConfigError, match="`spec_or_drafter` must be"):
        verispec.speculative(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`learn_across_calls` must be True or False; got 1"):
        verispec.speculative("tr", learn_across_calls=1)  # type: ignore[arg-type]


def test_a_drafter_object_and_a_separate_draft_model(hf_model: Any) -> None:
    """A drafter object is used as given, and ``draft_model=`` (a transformers model of the same
    vocabulary) drafts for a draft-model method; both stay greedy-exact. A draft of another
    vocabulary is refused."""
    expected = hf_model.generate(_ids(), max_new_tokens=NEW, do_sample=False)
    drafter = verispec.drafters.PromptLookup()
    out = hf_model.generate(
        _ids(), max_new_tokens=NEW, custom_generate=verispec.speculative(drafter)
    )
    assert torch.equal(out, expected)
    small = tiny_llama(vocab_size=64, hidden_size=32, num_layers=1, seed=3).hf_model
    out = hf_model.generate(
        _ids(),
        max_new_tokens=NEW,
        custom_generate=verispec.speculative("chain", draft_model=small),
    )
    assert torch.equal(out, expected)
    other = tiny_llama(vocab_size=80, hidden_size=32, num_layers=1).hf_model
    with pytest.raises(IncompatibleModelsError, match="vocabulary"):
        hf_model.generate(
            _ids(),
            max_new_tokens=5,
            custom_generate=verispec.speculative("chain", draft_model=other),
        )


def test_the_wrapped_model_is_built_once_and_rebuilt_when_weights_change() -> None:
    """``target_for`` returns the same fast-runtime model on every call, and a new one after a
    weight is modified in place."""
    model = tiny_llama(vocab_size=64, hidden_size=32, num_layers=1).hf_model
    first = target_for(model)
    assert isinstance(first, FastModel) and target_for(model) is first
    with torch.no_grad():
        model.lm_head.weight.mul_(1.0)
    assert target_for(model) is not first


def _bump_token(model: Any, kind: str) -> None:
    """Make token 7 the greedy choice everywhere (its LM-head row plus 50), by ``kind`` of
    edit; ``"one value"`` changes a single weight by 1e-3 through ``.data`` instead."""
    head = model.lm_head.weight
    bumped = head.detach().clone()
    bumped[7] += 50.0
    if kind == ".data":
        head.data[7] += 50.0
    elif kind == "copy_ under no_grad":
        with torch.no_grad():
            head.copy_(bumped)
    elif kind == "load_state_dict":
        state = {name: value.clone() for name, value in model.state_dict().items()}
        state["lm_head.weight"] = bumped
        model.load_state_dict(state)
    elif kind == "parameter replaced":
        model.lm_head.weight = torch.nn.Parameter(bumped)
    elif kind == "to(dtype)":
        model.to(torch.float32)
    else:
        model.model.layers[0].mlp.down_proj.weight.data[0, 0] += 1e-3


@pytest.mark.parametrize(
    "kind",
    [".data", "copy_ under no_grad", "load_state_dict", "parameter replaced", "to(dtype)",
     "one value"],
)  # fmt: skip
def test_the_next_generation_uses_edited_weights(kind: str) -> None:
    """After a first call built the wrapped model, any edit of the weights (through ``.data``,
    which the version counter misses, ``copy_`` under ``no_grad``, ``load_state_dict``, a
    replaced parameter, a cast, one value) makes the next call rebuild it and return
    ``generate``'s tokens for the edited model (which differ from before, but for the
    cast and the one value)."""
    model = tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, max_length=512).hf_model
    fast = verispec.speculative("ar")
    before = model.generate(_ids(), max_new_tokens=NEW, do_sample=False, custom_generate=fast)
    first = target_for(model)
    _bump_token(model, kind)
    expected = model.generate(_ids(), max_new_tokens=NEW, do_sample=False)
    if kind not in ("to(dtype)", "one value"):
        assert not torch.equal(expected, before)
    out = model.generate(_ids(), max_new_tokens=NEW, do_sample=False, custom_generate=fast)
    assert torch.equal(out, expected)
    assert target_for(model) is not first


@pytest.fixture(scope="module")
def smollm2_chat(default_model: tuple[Any, Any]) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """SmolLM2-135M (float32, transformers), a chat prompt's ids and its greedy ``generate``."""
    model, tokenizer = default_model
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "List the planets of the solar system."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    return model.hf_model, ids, model.hf_model.generate(ids, max_new_tokens=48, do_sample=False)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["tr", "dtr", "pld", "dyspec"])
def test_smollm2_greedy_equals_generate(
    smollm2_chat: tuple[Any, torch.Tensor], method: str
) -> None:
    """On SmolLM2-135M (float32), ``custom_generate=speculative(method)`` returns transformers'
    greedy tokens for a chat prompt."""
    hf, ids, expected = smollm2_chat
    out = hf.generate(ids, max_new_tokens=48, custom_generate=verispec.speculative(method))
    assert torch.equal(out, expected)
