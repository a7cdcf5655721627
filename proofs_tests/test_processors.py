"""Tests of verispec/processors: what users set in ``generate`` is honoured exactly under trees.

Greedy identity with transformers' own ``generate`` (same processors) on a tiny float64
Llama, through ``custom_generate`` and through verispec's own decoder, for each built-in
processor and for combinations; structured output on the byte-level tiny model; the
refusals; pruning. The SmolLM2 tests (``slow``) repeat the identity on the real model and
check that every JSON answer parses. The laws at temperature 1 are audited in
``end_to_end/test_processor_exactness.py``.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
import torch
from transformers.generation import logits_process as lp

import verispec
from verispec import SpeculativeDecoder
from verispec.core.sampling import SamplingParams
from verispec.core.tree import DETERMINISTIC, DraftTree, WithoutReplacement
from verispec.core.types import DecodeState, GenerationParams
from verispec.custom_generate import target_for
from verispec.errors import ConfigError
from verispec.models.tiny import ByteTokenizer, tiny_llama
from verispec.processors import (
    GrammarConstraint,
    GrammarLogitsProcessor,
    TreeProcessor,
    classify,
    grammar_text,
    ll_tokenizer,
    processing_for,
)

PROMPTS = ([5, 9, 14, 5, 9, 14, 22, 5, 9], [3, 3, 7, 40, 41, 3, 7])
NEW = 24
METHODS = ("tr", "dtr:budget=16", "pld:max=10")
pytestmark = pytest.mark.usefixtures("one_thread")
OPTION_NAMES = (
    "repetition_penalty",
    "no_repeat_ngram_size",
    "bad_words_ids",
    "suppress_tokens",
    "begin_suppress_tokens",
    "sequence_bias",
    "forced_eos_token_id",
    "min_new_tokens",
    "encoder_repetition_penalty",
    "exponential_decay_length_penalty",
    "prefix_allowed_tokens_fn",
    "logits_processor",
    "combination",
)


def _plain(hf: Any, prompt: list[int], **options: Any) -> list[int]:
    ids = torch.tensor([prompt])
    out = hf.generate(ids, max_new_tokens=NEW, do_sample=False, **options)
    return out[0, len(prompt) :].tolist()


def _processor_options(hf: Any, prompt: list[int]) -> dict[str, dict[str, Any]]:
    """Each built-in processor's ``generate`` option, aimed at tokens the plain answer has."""
    base = _plain(hf, prompt)
    first, second = base[2], base[5]
    return {
        "repetition_penalty": {"repetition_penalty": 1.8},
        "no_repeat_ngram_size": {"no_repeat_ngram_size": 2},
        "bad_words_ids": {"bad_words_ids": [[first], [base[3], base[4]]]},
        "suppress_tokens": {"suppress_tokens": [first, second]},
        "begin_suppress_tokens": {"begin_suppress_tokens": [base[0]]},
        "sequence_bias": {"sequence_bias": {(first,): -20.0, (base[0], base[1]): -20.0}},
        "forced_eos_token_id": {"forced_eos_token_id": 1},
        "min_new_tokens": {"min_new_tokens": 20, "no_repeat_ngram_size": 1},
        "encoder_repetition_penalty": {"encoder_repetition_penalty": 0.3},
        "exponential_decay_length_penalty": {"exponential_decay_length_penalty": (2, 3.0)},
        "prefix_allowed_tokens_fn": {"prefix_allowed_tokens_fn": lambda b, s: list(range(8, 40))},
        "logits_processor": {
            "logits_processor": [lp.LogitNormalization(), lp.InfNanRemoveLogitsProcessor()],
            "repetition_penalty": 1.3,
        },
        "combination": {
            "repetition_penalty": 1.4,
            "no_repeat_ngram_size": 3,
            "bad_words_ids": [[first]],
            "suppress_tokens": [second],
        },
    }


@pytest.mark.parametrize("option", OPTION_NAMES)
def test_each_processor_greedy_equals_generate(hf_model: Any, option: str) -> None:
    """For each processor ``generate`` builds (and combinations), ``custom_generate`` with
    tr, dtr and pld returns ``generate``'s own greedy tokens with the same option, on two
    prompts; the option changes the answer of at least one prompt (so it is really
    applied)."""
    changed = False
    for prompt in PROMPTS:
        options = _processor_options(hf_model, prompt)[option]
        expected = _plain(hf_model, prompt, **options)
        changed |= expected != _plain(hf_model, prompt)
        for method in METHODS:
            fast = verispec.speculative(method)
            got = _plain(hf_model, prompt, custom_generate=fast, **options)
            assert got == expected, (option, method, prompt)
    assert changed, f"{option} did not change any answer: the test would not see it ignored"


@pytest.mark.parametrize(
    "fields",
    [
        {"repetition_penalty": 1.8},
        {"no_repeat_ngram_size": 2},
        {"min_new_tokens": 20, "repetition_penalty": 1.2},
        {"bad_words_ids": [[30], [12, 13]], "suppress_tokens": [7]},
        {"logits_processor": [lp.RepetitionPenaltyLogitsProcessor(2.0)]},
    ],
)
def test_the_decoder_api_equals_generate(hf_model: Any, fields: dict[str, Any]) -> None:
    """verispec's own decoder with the processing fields of its GenerationParams returns
    ``generate``'s greedy tokens with the same options (tr and dtr, two prompts)."""
    target = target_for(hf_model)
    hf_options = dict(fields)
    if "logits_processor" in hf_options:
        hf_options["logits_processor"] = list(hf_options["logits_processor"])
    for prompt in PROMPTS:
        expected = _plain(hf_model, prompt, **hf_options)
        for method in ("tr", "dtr:budget=16"):
            decoder = SpeculativeDecoder(target, verispec.drafter(method, target=target))
            result = decoder.generate(prompt, max_new_tokens=NEW, eos_token_ids=[1], **fields)
            assert result.tokens == expected, (fields, method)


def test_the_processing_of_generation_params_is_generates_row_for_row(hf_model: Any) -> None:
    """The processing built from GenerationParams' fields (``processing_for``) gives each
    row of a chain of ``generate``'s own greedy answer exactly the scores ``generate``'s
    processors gave there (its ``output_scores``, from its raw ``output_logits``): a
    penalty of 2.0, a no-repeat n-gram size, bad words one of which is the end-of-sequence
    token (``generate`` drops that one), a minimum of new tokens and suppressed tokens."""
    prompt = PROMPTS[0]
    options: dict[str, Any] = {
        "repetition_penalty": 2.0,
        "no_repeat_ngram_size": 2,
        "bad_words_ids": [[1], [9, 14]],
        "min_new_tokens": 5,
        "suppress_tokens": [7],
    }
    out = hf_model.generate(
        torch.tensor([prompt]),
        max_new_tokens=8,
        do_sample=False,
        eos_token_id=1,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
        **options,
    )
    answer = out.sequences[0, len(prompt) :].tolist()
    processing = processing_for(
        GenerationParams(**options),
        prompt_length=len(prompt),
        tokenizer=None,
        eos_token_ids=[1],
        vocab_size=hf_model.config.vocab_size,
    )
    assert processing is not None
    chain = DraftTree.from_parents(answer[:-1], list(range(-1, len(answer) - 2)))
    got = processing.process(chain, torch.cat(out.logits), _state(prompt, 0.0))
    assert torch.equal(got, torch.cat(out.scores))


def test_sampling_with_a_processor_repeats_and_uses_the_seed(hf_model: Any) -> None:
    """Sampled decoding with a repetition penalty and a typical-p warper (applied to the
    rows, the verifier at temperature 1) repeats for a seed and differs across seeds."""
    fast = verispec.speculative("tr")
    ids = torch.tensor([PROMPTS[0]])
    options = {"do_sample": True, "repetition_penalty": 1.3, "typical_p": 0.9, "max_new_tokens": 16}
    one = hf_model.generate(ids, custom_generate=fast, seed=3, **options)
    two = hf_model.generate(ids, custom_generate=fast, seed=3, **options)
    other = [hf_model.generate(ids, custom_generate=fast, seed=s, **options) for s in (4, 5, 6)]
    assert torch.equal(one, two)
    assert any(not torch.equal(one, o) for o in other)


class _Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return scores - self.calls


class _BatchDependent:
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        out[:, input_ids[:, -1]] = -float("inf")  # bans every row's last token in all rows
        return out


class _PerRow:
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores.scatter(1, input_ids[:, -1:], -float("inf"))


class _BatchMean:
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores + scores.mean(dim=0)  # every row reads the other rows' scores


class _FirstRowOnly:
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores[:1] - 1.0  # one row, whatever the batch


@pytest.mark.parametrize(
    ("processor", "match"),
    [
        (_Counting(), "`_Counting` gave different scores on two calls"),
        (_BatchDependent(), "`_BatchDependent` scores a row differently in a batch"),
    ],
)
def test_a_processor_that_is_not_a_function_of_the_prefix_is_refused(
    hf_model: Any, processor: Any, match: str
) -> None:
    """A user processor that keeps state across calls, or mixes rows of a batch, is
    refused with a ConfigError naming it, on its first use."""
    with pytest.raises(ConfigError, match=match):
        hf_model.generate(
            torch.tensor([PROMPTS[0]]),
            max_new_tokens=8,
            custom_generate=verispec.speculative("tr"),
            logits_processor=[processor],
        )


@pytest.mark.parametrize(
    "processor", [_BatchDependent(), _BatchMean(), _FirstRowOnly()], ids=["ids", "scores", "one"]
)
@pytest.mark.parametrize("prompt", [[0], [5, 0], PROMPTS[0]], ids=["one", "ends-0", "long"])
def test_a_processor_that_mixes_rows_is_refused_after_any_prompt(
    processor: Any, prompt: list[int]
) -> None:
    """A user processor whose rows read the other rows of the batch, through their tokens
    or through their scores, or that returns one row for a batch, is refused with a
    ConfigError naming it on its first use, whatever the prompt: one token, or one whose
    last token is 0."""
    processing = TreeProcessor([processor], None)
    tree = DraftTree.from_parents([3, 4], [-1, 0])
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    name = type(processor).__name__
    with pytest.raises(ConfigError, match=f"`{name}` scores a row differently in a batch"):
        processing.process(tree, logits, _state(prompt, 1.0))


def test_a_user_processor_of_the_prefix_is_applied(hf_model: Any) -> None:
    """A user processor that is a function of the prefix passes the probe and is applied:
    the answer equals ``generate``'s with it and never repeats a token twice in a row."""
    expected = _plain(hf_model, PROMPTS[0], logits_processor=[_PerRow()])
    got = _plain(
        hf_model,
        PROMPTS[0],
        logits_processor=[_PerRow()],
        custom_generate=verispec.speculative("dtr:budget=16"),
    )
    assert got == expected
    assert all(a != b for a, b in itertools.pairwise(got))


@pytest.mark.parametrize(
    ("processor", "match"),
    [
        (lp.SynthIDTextWatermarkLogitsProcessor, "keeps watermark state"),
        (lp.EncoderNoRepeatNGramLogitsProcessor, "encoder-decoder"),
        (lp.UnbatchedClassifierFreeGuidanceLogitsProcessor, "runs the model"),
    ],
)
def test_transformers_processors_that_keep_state_are_refused(processor: type, match: str) -> None:
    """transformers' processors that are not functions of the prefix are refused by name."""
    instance = processor.__new__(processor)  # classification needs the class only
    with pytest.raises(ConfigError, match=f"`{processor.__name__}`.*{match}"):
        classify(instance)


def test_an_unknown_transformers_processor_is_refused() -> None:
    """A transformers processor verispec does not know is refused rather than applied."""
    unknown = type("FutureLogitsProcessor", (lp.LogitsProcessor,), {"__module__": "transformers.x"})
    with pytest.raises(ConfigError, match=r"`FutureLogitsProcessor`.*not known"):
        classify(unknown())


def test_no_processing_costs_nothing() -> None:
    """A config without processing fields builds no processing (the loop is unchanged)."""
    factory = processing_for(
        GenerationParams(), prompt_length=3, tokenizer=None, eos_token_ids=[1], vocab_size=64
    )
    assert factory is None
    assert not GenerationParams(temperature=0.7, top_k=5).processes_logits


def test_bad_processing_settings_name_the_argument() -> None:
    """Bad processing settings raise ConfigError naming the argument and what is allowed."""
    cases = [
        ({"repetition_penalty": 0}, "`repetition_penalty` must be"),
        ({"bad_words_ids": [[]]}, "`bad_words_ids` must be a non-empty list"),
        ({"logits_processor": [3]}, "`logits_processor` must be a list of logits processors"),
        ({"regex": "a", "grammar": "start: 'a'"}, "at most one of `json_schema`"),
        ({"json_schema": 3}, "`json_schema` must be a JSON schema"),
        ({"regex": ""}, "`regex` must be a non-empty string"),
    ]
    for fields, match in cases:
        with pytest.raises(ConfigError, match=match):
            GenerationParams(**fields)
    with pytest.raises(ConfigError, match="needs the model's tokenizer"):
        processing_for(
            GenerationParams(regex="a+"),
            prompt_length=1,
            tokenizer=None,
            eos_token_ids=[1],
            vocab_size=64,
        )
    with pytest.raises(ConfigError, match="does not compile"):
        GrammarConstraint(
            ll_tokenizer(ByteTokenizer(), 258, [1]), grammar_text(grammar="start: ("), 258, 1
        )


# -- structured output on the byte-level tiny model ----------------------------------------


@pytest.fixture(scope="module")
def byte_model() -> tuple[Any, ByteTokenizer]:
    model = tiny_llama(vocab_size=258, hidden_size=32, num_layers=2, max_length=512).hf_model
    return model, ByteTokenizer()


@pytest.mark.parametrize(
    "constraint",
    [
        {"regex": r"(yes|no|maybe), [a-c]{2,4}\."},
        {"json_schema": {"type": "object", "properties": {"n": {"type": "integer"}},
                         "required": ["n"], "additionalProperties": False}},
        {"grammar": 'start: item ("+" item)*\nitem: /[0-9]/ | "(" start ")"'},
    ],
)  # fmt: skip
def test_structured_output_greedy_equals_generate_and_parses(
    byte_model: tuple[Any, ByteTokenizer], constraint: dict[str, Any]
) -> None:
    """With a regex, a JSON schema or a Lark grammar, tr, dtr and pld return the greedy
    tokens of ``generate`` with the same constraint as a logits processor, and the answer
    follows the constraint whenever it ends with the end-of-sequence token."""
    hf, tokenizer = byte_model
    ids = torch.tensor([tokenizer.encode("Answer: ")])
    plain = GrammarLogitsProcessor(tokenizer, vocab_size=258, **constraint)
    expected = hf.generate(ids, max_new_tokens=40, do_sample=False, logits_processor=[plain])
    for method in METHODS:
        fast = verispec.speculative(method, tokenizer=tokenizer, **constraint)
        out = hf.generate(ids, max_new_tokens=40, do_sample=False, custom_generate=fast)
        assert torch.equal(out, expected), method
    answer = expected[0, ids.shape[1] :].tolist()
    if answer[-1] == tokenizer.eos_token_id:
        text = tokenizer.decode(answer)
        if "regex" in constraint:
            assert re.fullmatch(constraint["regex"], text)
        if "json_schema" in constraint:
            assert isinstance(json.loads(text)["n"], int)


def test_structured_output_needs_a_tokenizer() -> None:
    """``speculative(..., regex=...)`` without a tokenizer is refused at once."""
    with pytest.raises(ConfigError, match="needs the model's tokenizer"):
        verispec.speculative("tr", regex="a+")


def _state(tokens: list[int], temperature: float) -> DecodeState:
    return DecodeState(
        tokens=tokens,
        prompt_length=1,
        sampling=SamplingParams(temperature=temperature),
        generator=torch.Generator(),
    )


def test_pruning_drops_forbidden_candidates_and_keeps_sampled_laws() -> None:
    """Nodes the grammar forbids are dropped (with their subtrees) under fixed candidates or
    at temperature 0; under a law of draws without replacement at temperature > 0 they are
    kept (dropping them would change the law) and their rows copy their parent's
    processed row."""
    tokenizer = ByteTokenizer()
    a, b, x = (ord(c) + 2 for c in "abx")
    grammar = grammar_text(regex="a+b")
    tokens, parents = [a, x, a, b, x], [-1, -1, 0, 2, 1]

    def constraint() -> GrammarConstraint:
        return GrammarConstraint(ll_tokenizer(tokenizer, 258, [1]), grammar, 258, 1)

    fixed = DraftTree.from_parents(tokens, parents, DETERMINISTIC)
    pruned = constraint().prune(fixed, _state([0], 0.7))
    assert pruned.tokens.tolist() == [a, a, b] and pruned.parents.tolist() == [-1, 0, 1]
    through = TreeProcessor([], constraint()).prune(fixed, _state([0], 0.7))  # the decoder's call
    assert through.tokens.tolist() == [a, a, b] and through.parents.tolist() == [-1, 0, 1]
    lone = DraftTree.from_parents([x], [-1], DETERMINISTIC)  # one node, dead
    assert TreeProcessor([], constraint()).prune(lone, _state([0], 0.7)).num_nodes == 0

    law = WithoutReplacement(torch.full((258,), 1 / 258))
    drawn = DraftTree.from_parents(tokens, parents, law)
    assert constraint().prune(drawn, _state([0], 0.0)).num_nodes == 3  # greedy: dropped
    sampled = _state([0], 0.7)
    processing = TreeProcessor([], constraint())
    kept = processing.prune(drawn, sampled)
    assert kept is drawn
    logits = torch.randn(6, 258)
    out = processing.process(drawn, logits, sampled)
    allowed_root = torch.isfinite(out[0]).nonzero().flatten().tolist()
    assert allowed_root == [a]
    assert torch.equal(out[2], out[0])  # node 1 (x) is dead: its row is the root's
    assert torch.equal(out[5], out[0])  # node 4 under it too
    assert torch.isfinite(out[4]).nonzero().flatten().tolist() == [1]  # after "aab": eos


# -- SmolLM2 ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(default_model: tuple[Any, Any]) -> tuple[Any, Any]:
    model, tokenizer = default_model
    return model.hf_model, tokenizer


def _chat(tokenizer: Any, text: str) -> torch.Tensor:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]


@pytest.mark.slow
def test_smollm2_processors_greedy_equal_generate(smollm2: tuple[Any, Any]) -> None:
    """On SmolLM2-135M, tr and dtr with a repetition penalty, a no-repeat n-gram size, and
    both with bad words, return ``generate``'s greedy tokens (two chat prompts)."""
    hf, tokenizer = smollm2
    bad = tokenizer(["planets", " Earth"], add_special_tokens=False)["input_ids"]
    settings = [
        {"repetition_penalty": 1.3},
        {"no_repeat_ngram_size": 3},
        {"repetition_penalty": 1.2, "no_repeat_ngram_size": 4, "bad_words_ids": bad},
    ]
    for text in ("List the planets of the solar system.", "Write a haiku about rain."):
        ids = _chat(tokenizer, text)
        for options in settings:
            expected = hf.generate(ids, max_new_tokens=40, do_sample=False, **options)
            for method in ("tr", "dtr"):
                fast = verispec.speculative(method)
                out = hf.generate(ids, max_new_tokens=40, custom_generate=fast, **options)
                assert torch.equal(out, expected), (text, options, method)


@pytest.mark.slow
def test_smollm2_json_schema_answers_parse_and_equal_generate(smollm2: tuple[Any, Any]) -> None:
    """On SmolLM2-135M with a JSON schema, tr, dtr and pld return the greedy tokens of
    ``generate`` with the same schema as a logits processor, and every answer parses and
    has the schema's fields with their types."""
    hf, tokenizer = smollm2
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    vocab = hf.config.vocab_size
    for text in (
        "Extract the person as JSON: Maria Lopez is 34 years old.",
        "Return JSON for: the engineer Tom Baker, aged 51.",
    ):
        ids = _chat(tokenizer, text)
        plain = GrammarLogitsProcessor(tokenizer, vocab_size=vocab, json_schema=schema)
        expected = hf.generate(ids, max_new_tokens=48, do_sample=False, logits_processor=[plain])
        for method in ("tr", "dtr", "pld"):
            fast = verispec.speculative(method, tokenizer=tokenizer, json_schema=schema)
            out = hf.generate(ids, max_new_tokens=48, custom_generate=fast)
            assert torch.equal(out, expected), (text, method)
            answer = json.loads(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
            assert isinstance(answer["name"], str) and isinstance(answer["age"], int)
