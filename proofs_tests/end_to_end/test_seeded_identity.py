"""Same seed, same text, whatever the drafter of fixed candidates (the coupled rule).

At temperature > 0 with top-p 0.9, ``ar`` (no drafter), prompt lookup, Token
Recycling and Dynamic Token Recycling, each through the default verifier, generate
the same tokens for the same (prompt, seed) — also on a second call, when TR's and
DTR's learnt state has changed their trees. The tiny Llama runs in float32, as a real
model would; the SmolLM2 version is marked slow. Power: under recursive rejection
the same runs are exact but do not reproduce ``ar``'s text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import verispec
from verispec.core.types import Drafter, LanguageModel
from verispec.drafters import TokenRecycling
from verispec.drafters.dynamic_token_recycling import DynamicTokenRecycling
from verispec.drafters.prompt_lookup import PromptLookup
from verispec.verifiers import RecursiveRejection

DRAFTERS: dict[str, Callable[[int], Drafter]] = {
    "pld": lambda vocab_size: PromptLookup(),
    "tr": lambda vocab_size: TokenRecycling(template="16", vocab_size=vocab_size),
    "dtr": lambda vocab_size: DynamicTokenRecycling(budget=16, vocab_size=vocab_size),
}
TEMPERATURES = (0.7, 1.0)
TOP_P = 0.9


@pytest.fixture(scope="module")
def tiny() -> LanguageModel:
    return verispec.models.tiny_llama(vocab_size=64, num_layers=2, seed=0, std=0.5)


def generate_all(
    model: LanguageModel,
    prompt: list[int],
    seeds: range,
    tokens: int,
    verifier=None,
    temperatures: tuple[float, ...] = TEMPERATURES,
) -> tuple[dict[tuple[str, float, int, int], list[int]], int]:
    """Tokens per (method, temperature, seed, call), and the draft tokens accepted."""
    out: dict[tuple[str, float, int, int], list[int]] = {}
    accepted = 0
    settings = {"max_new_tokens": tokens, "top_p": TOP_P, "eos_token_ids": []}
    for temperature in temperatures:
        ar = verispec.SpeculativeDecoder(model, None, verifier)
        for seed in seeds:
            result = ar.generate(prompt, temperature=temperature, seed=seed, **settings)
            out[("ar", temperature, seed, 0)] = result.tokens
        for name, make in DRAFTERS.items():
            decoder = verispec.SpeculativeDecoder(model, make(model.vocab_size), verifier)
            for call in range(2):  # the second call starts from the first one's learnt state
                for seed in seeds:
                    result = decoder.generate(
                        prompt, temperature=temperature, seed=seed, **settings
                    )
                    out[(name, temperature, seed, call)] = result.tokens
                    accepted += sum(step.accepted for step in result.steps)
    return out, accepted


def differing(out: dict[tuple[str, float, int, int], list[int]]) -> list[tuple]:
    return [key for key, tokens in out.items() if tokens != out[("ar", key[1], key[2], 0)]]


PROMPT = [3, 17, 5, 9, 3, 17, 5, 9, 3, 17]


def test_fixed_candidate_drafters_reproduce_plain_sampling(tiny: LanguageModel) -> None:
    """pld, tr and dtr generate ar's tokens for every (temperature, seed), on the first
    and the second call, while drafts are accepted."""
    out, accepted = generate_all(tiny, PROMPT, range(4), 32)
    assert differing(out) == []
    assert accepted > 50


def test_recursive_rejection_does_not_reproduce_plain_sampling(tiny: LanguageModel) -> None:
    """Power: with recursive rejection the drafters' texts differ from ar's for some seed."""
    out, _ = generate_all(tiny, PROMPT, range(2), 32, RecursiveRejection())
    assert len(differing(out)) > 0


@pytest.mark.slow
def test_smollm2_fixed_candidate_drafters_reproduce_plain_sampling(
    default_model: tuple[Any, Any],
) -> None:
    """On SmolLM2-135M (float32), pld, tr and dtr generate ar's 24 tokens for seeds 0-1 at
    temperature 1.0 with top-p 0.9, on two calls each, while drafts are accepted."""
    model, tokenizer = default_model
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "List the planets of the solar system, one per line."}],
        add_generation_prompt=True,
    )
    ids = list(prompt["input_ids"]) if hasattr(prompt, "keys") else list(prompt)
    out, accepted = generate_all(model, ids, range(2), 24, temperatures=(1.0,))
    assert differing(out) == []
    assert accepted > 20


def test_smollm2_the_c_draw_commits_the_torch_paths_text(
    default_model: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SmolLM2-135M (float32 rows, so ``ar``'s coupled draws run in C), each of three
    processings (top-p, top-k, min-p) commits the same 32 tokens for seeds 0-1 as the torch
    path (the kernel refused by returning None), and the C path really ran."""
    from verispec.kernels.cpu import draw as cpu_draw

    if cpu_draw.library() is None:
        pytest.skip("the C draw cannot be built on this machine")
    model, tokenizer = default_model
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a short poem about the sea."}],
        add_generation_prompt=True,
    )
    ids = list(prompt["input_ids"]) if hasattr(prompt, "keys") else list(prompt)
    decoder = verispec.SpeculativeDecoder(model, None)
    real = cpu_draw.coupled_draw
    drawn = {"in C": 0}

    def counted(*args: Any) -> int | None:
        token = real(*args)
        drawn["in C"] += token is not None
        return token

    settings = [
        {"temperature": 0.8, "top_p": 0.95},
        {"temperature": 1.0, "top_k": 50},
        {"temperature": 0.7, "min_p": 0.05},
    ]
    for setting in settings:
        for seed in range(2):
            monkeypatch.setattr(cpu_draw, "coupled_draw", counted)
            in_c = decoder.generate(ids, max_new_tokens=32, seed=seed, eos_token_ids=[], **setting)
            monkeypatch.setattr(cpu_draw, "coupled_draw", lambda *args: None)
            in_torch = decoder.generate(
                ids, max_new_tokens=32, seed=seed, eos_token_ids=[], **setting
            )
            assert in_c.tokens == in_torch.tokens, setting
    assert drawn["in C"] >= 6 * 32
