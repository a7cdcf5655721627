"""Tests of the llama.cpp runner of verispec/bench/runner.py: the llama.cpp peers get the same
prompt ids, threads, greedy settings, token budget and end-of-sequence ids as every method,
from an empty cache."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import pytest
import torch

from verispec.bench.methods import METHODS
from verispec.bench.runner import BenchContext, LlamaCppRunner, llama_cpp_available
from verispec.core.types import GenerationParams
from verispec.errors import ConfigError


class FakeLlama:
    """Records how it is built and called; ``generate`` yields ``script`` one token per eval."""

    built: ClassVar[list[dict[str, Any]]] = []
    script: ClassVar[list[int]] = [7, 8, 9, 2, 10, 11]

    def __init__(self, **options: Any) -> None:
        FakeLlama.built.append(options)
        self.options = options
        self.calls: list[tuple[list[int], dict[str, Any]]] = []
        self.resets = 0
        self.seed: int | None = None

    def reset(self) -> None:
        self.resets += 1

    def set_seed(self, seed: int) -> None:
        self.seed = seed

    def eval(self, tokens: Sequence[int]) -> None:
        pass

    def generate(self, tokens: Sequence[int], **kwargs: Any) -> Iterator[int]:
        self.calls.append((list(tokens), kwargs))
        self.eval(tokens)  # the prompt
        for token in self.script:
            yield token
            self.eval([token])


class FakeLookup:
    def __init__(self, max_ngram_size: int, num_pred_tokens: int) -> None:
        self.max_ngram_size, self.num_pred_tokens = max_ngram_size, num_pred_tokens


@pytest.fixture
def context(tmp_path: Any) -> BenchContext:
    FakeLlama.built = []
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    return BenchContext(target=None, tokenizer=None, eos_token_ids=(2,), gguf=str(gguf))  # type: ignore[arg-type]


def test_plumbing_same_prompt_threads_greedy_and_stop(context: BenchContext) -> None:
    """The runner builds ``Llama`` on the context's GGUF with torch's thread count for decoding
    and prompt, feeds the prompt ids as given from an empty cache, samples greedily, stops at
    the first end-of-sequence id (kept) and counts one forward per eval."""
    threads = torch.get_num_threads()
    runner = LlamaCppRunner(context, llama_class=FakeLlama)
    result = runner.run([1, 5, 6], GenerationParams(max_new_tokens=50))
    (options,) = FakeLlama.built
    assert options["model_path"] == context.gguf
    assert options["n_threads"] == options["n_threads_batch"] == threads
    assert options["n_ctx"] % 1024 == 0 and options["n_ctx"] >= 3 + 50
    assert "draft_model" not in options and "logits_all" not in options
    llama = runner.llama
    ((prompt, kwargs),) = llama.calls
    assert prompt == [1, 5, 6] and kwargs["reset"] is True and llama.resets == 1
    assert kwargs["temp"] == 0 and kwargs["top_k"] == 1 and kwargs["repeat_penalty"] == 1.0
    assert result.tokens == (7, 8, 9, 2) and result.finish_reason == "eos"
    assert result.steps == 4 and result.committed == 4  # the prompt's eval gave the first token


def test_max_new_tokens_cuts_and_each_call_starts_empty(context: BenchContext) -> None:
    """``max_new_tokens`` ends the answer, and every call resets the cache first."""
    runner = LlamaCppRunner(context, llama_class=FakeLlama)
    for _ in range(2):
        result = runner.run([1, 5], GenerationParams(max_new_tokens=2))
        assert result.tokens == (7, 8) and result.finish_reason == "max_new_tokens"
    assert runner.llama.resets == 2 and len(FakeLlama.built) == 1


def test_prompt_lookup_and_a_longer_prompt(context: BenchContext) -> None:
    """``llama-cpp-pld`` passes ``LlamaPromptLookupDecoding(max_ngram_size, num_pred_tokens)`` as
    the draft model; a prompt longer than the context rebuilds ``Llama`` (untimed)."""
    runner = LlamaCppRunner(
        context, prompt_lookup=(3, 7), llama_class=FakeLlama, lookup_class=FakeLookup
    )
    runner.run([1] * 10, GenerationParams(max_new_tokens=4))
    lookup = FakeLlama.built[0]["draft_model"]
    assert (lookup.max_ngram_size, lookup.num_pred_tokens) == (3, 7)
    assert FakeLlama.built[0]["logits_all"] is True  # the draft's logits buffer holds n_ctx rows
    runner.run([1] * 1500, GenerationParams(max_new_tokens=4))
    assert [b["n_ctx"] for b in FakeLlama.built] == [1024, 2048]
    assert runner.setup_s > 0


def test_sampling_settings_and_seed(context: BenchContext) -> None:
    """At temperature > 0 the sampling parameters and the seed reach llama.cpp."""
    runner = LlamaCppRunner(context, llama_class=FakeLlama)
    config = GenerationParams(max_new_tokens=3, temperature=0.7, top_k=20, top_p=0.9, seed=4)
    runner.run([1], config)
    _, kwargs = runner.llama.calls[0]
    assert (kwargs["temp"], kwargs["top_k"], kwargs["top_p"]) == (0.7, 20, 0.9)
    assert runner.llama.seed == 4


def test_no_gguf_file_is_a_clear_error() -> None:
    """Without a GGUF file the peer refuses to build, saying which models have one."""
    context = BenchContext(target=None, tokenizer=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="need the target's GGUF file"):
        LlamaCppRunner(context, llama_class=FakeLlama)


def test_registry_entries_are_optional_peers() -> None:
    """Both peers are registered as optional (the ``llamacpp`` extra), not as drafters."""
    for name in ("llama-cpp", "llama-cpp-pld"):
        assert METHODS[name].extra == "llamacpp" and METHODS[name].drafter is None
    assert METHODS["llama-cpp-pld"].param("tokens").default == 10


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is not installed (optional extra: pip install 'verispec[llamacpp]')",
)
def test_llama_cpp_on_the_embedded_gguf(default_model: Any) -> None:
    """With llama-cpp-python installed, both peers answer a chat prompt of SmolLM2's GGUF file:
    plain decoding one token per forward, prompt lookup the same greedy tokens in fewer."""
    from verispec.bench.prompts import build_prompt_ids
    from verispec.bench.runner import make_context
    from verispec.models.gguf import embedded_gguf

    assert llama_cpp_available() is None
    model, tokenizer = default_model
    context = make_context(model, tokenizer, gguf=str(embedded_gguf()))
    text = "Repeat exactly: one two three four five six seven eight nine ten."
    filler = "Some context to read first. " * 100  # a prompt past 512 tokens (one batch)
    ids = build_prompt_ids(tokenizer, [{"role": "user", "content": filler + text}])
    assert len(ids) > 600
    config = GenerationParams(max_new_tokens=24, eos_token_ids=context.eos_token_ids)
    plain = LlamaCppRunner(context).run(ids, config)
    lookup = LlamaCppRunner(context, prompt_lookup=(2, 10)).run(ids, config)
    assert 0 < len(plain.tokens) <= 24 and plain.steps == len(plain.tokens)
    assert plain.text.strip()
    assert lookup.tokens == plain.tokens and lookup.steps < plain.steps
