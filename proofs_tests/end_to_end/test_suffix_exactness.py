"""Suffix drafting, alone and fused into DTR, through the real engine, generates exactly the
target's law.

The audit of ``test_draft_model_exactness.py`` (the Markov pair's order-1 target over
V = 3 tokens, recursive rejection sampling in float64, 600 seeded generations,
chi-square of the first three tokens against the target's enumerated joint law at
alpha = 1e-3, cells below 5 expected pooled) for the model-free drafters that retrieve
from a corpus. Each generation's output is remembered in the corpus before the next one,
so the drafter's state (corpus, calibration, DTR's matrix) differs from run to run,
shaped by earlier random outputs: the law must hold whatever that state is.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from chi_square import law_pvalue
from markov_pair import markov_pair

from verispec import SpeculativeDecoder
from verispec.core import SamplingParams
from verispec.core.types import Drafter
from verispec.drafters.dynamic_token_recycling import DynamicTokenRecycling
from verispec.drafters.suffix import SuffixDrafter
from verispec.verifiers import Greedy
from verispec.verifiers.recursive import RecursiveRejection

ALPHA = 1e-3
SAMPLES = 600
PROMPT = [0, 2, 0, 2, 1, 0, 2]

DRAFTERS: dict[str, Callable[[], Drafter]] = {
    "suffix": lambda: SuffixDrafter(budget=6),
    "dtr-suffix": lambda: DynamicTokenRecycling(6, k=2, suffix=True),
}


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_first_three_tokens_follow_the_target_law(name: str, temperature: float) -> None:
    """The first three generated tokens are distributed as the target's joint law
    (chi-square over 27 sequences, 600 seeded generations, alpha = 1e-3) while every
    output joins the corpus, and drafts are accepted (more than 1.2 tokens per step)."""
    target, _ = markov_pair()
    drafter = DRAFTERS[name]()
    decoder = SpeculativeDecoder(target, drafter, RecursiveRejection(torch.float64))
    counts = torch.zeros(27)
    committed = steps = 0
    for seed in range(SAMPLES):
        result = decoder.generate(PROMPT, max_new_tokens=3, temperature=temperature, seed=seed)
        a, b, c = result.tokens[:3]
        counts[9 * a + 3 * b + c] += 1
        committed += sum(s.committed for s in result.steps)
        steps += result.num_steps
        drafter.remember(result.tokens)  # type: ignore[attr-defined]
    law = target.sequence_probs(PROMPT, 3, SamplingParams(temperature=temperature)).reshape(-1)
    assert float(counts[law == 0].sum()) == 0
    assert law_pvalue(counts, law) > ALPHA
    assert committed / steps > 1.2


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_is_token_identical_on_the_markov_pair(name: str) -> None:
    """At temperature 0 the drafter's output equals plain greedy decoding (3 prompts,
    24 tokens, each output remembered), with the Greedy verifier and recursive rejection."""
    target, _ = markov_pair()
    for verifier in (Greedy(), RecursiveRejection(torch.float64)):
        drafter = DRAFTERS[name]()
        for prompt in ([0], [2, 1], [1, 1, 0]):
            plain = SpeculativeDecoder(target, None, Greedy()).generate(prompt, max_new_tokens=24)
            result = SpeculativeDecoder(target, drafter, verifier).generate(
                prompt, max_new_tokens=24
            )
            assert result.tokens == plain.tokens
            drafter.remember(result.tokens)  # type: ignore[attr-defined]
