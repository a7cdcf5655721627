"""End to end: drafters + the default verifier through SpeculativeDecoder on a tiny Llama.

At temperatures 0.7 and 1.0 the first two generated tokens over many seeds must
follow the target's joint law, enumerated from the model itself (chi-square,
ALPHA = 1e-3, fixed seeds), under the default verifier (the coupled rule for these
trees of fixed candidates) and under recursive rejection. At temperature 0 the
output must be token-identical to plain greedy decoding. Drafters: Token Recycling
(deterministic candidates, lossless here at any temperature), and a drafter written
below whose root row lists every token of the vocabulary, so the target mass is fully
covered and the deterministic residual runs out of mass (the case of
docs/exactness.rst's zero-residual lemma).

The tiny model runs in float64 (exact comparisons); the verifiers keep float32
target rows and residuals (their defaults). Torch is pinned to one thread here: tiny
matrices on a shared 2-core machine are ~10x faster single-threaded.
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

import pytest
import torch
from scipy.stats import chisquare

import verispec
from verispec.core.sampling import SamplingParams
from verispec.core.tree import DETERMINISTIC, DraftTree
from verispec.core.types import DecodeState, StepOutcome
from verispec.drafters import TokenRecycling
from verispec.models.tiny import tiny_llama
from verispec.verifiers import Coupled, Greedy, RecursiveRejection

ALPHA = 1e-3
VOCAB_SIZE = 12
PROMPT = [3, 5, 7]
SEEDS = 1000  # generations per temperature


pytestmark = pytest.mark.usefixtures("one_thread")  # proofs_tests/conftest.py


@pytest.fixture(scope="module")
def model():
    return tiny_llama(
        vocab_size=VOCAB_SIZE, hidden_size=16, num_layers=1, max_length=64, seed=3, std=0.5
    )


class FullCoverage:
    """Deterministic drafter: every token below the root, two fixed tokens below each."""

    needs_draft_model: ClassVar[bool] = False

    def begin(self, state: DecodeState) -> None:
        pass

    def propose(self, state: DecodeState) -> DraftTree:
        v = VOCAB_SIZE
        paths = [[(5 * t + 1) % v] for t in range(v)]  # a permutation of the vocabulary
        paths += [[c, (c + 1) % v] for (c,) in paths] + [[c, (c + 4) % v] for (c,) in paths]
        return DraftTree.from_paths(paths, DETERMINISTIC)

    def observe(self, outcome: StepOutcome) -> None:
        pass


def target_joint_law(model, sampling: SamplingParams) -> dict[tuple[int, int], float]:
    """P(t1, t2) of the target after PROMPT, enumerated with the model itself."""

    def next_probs(ids: list[int]) -> torch.Tensor:
        model.reset()
        model.prefill(torch.tensor(ids))
        return sampling.probs(model.forward_tree(DraftTree.empty())[0], torch.float64)

    first = next_probs(PROMPT)
    law = {}
    for a in range(VOCAB_SIZE):
        second = next_probs([*PROMPT, a])
        for b in range(VOCAB_SIZE):
            law[(a, b)] = float(first[a] * second[b])
    model.reset()
    return law


def chi_square_p_value(observed: Counter, expected: dict, samples: int) -> float:
    impossible = [key for key in observed if expected.get(key, 0.0) == 0.0]
    assert not impossible, f"outcomes of target probability 0 were generated: {impossible}"
    obs, exp, pooled_obs, pooled_exp = [], [], 0, 0.0
    for key, prob in expected.items():
        if prob * samples < 5:
            pooled_obs += observed.get(key, 0)
            pooled_exp += prob * samples
        else:
            obs.append(observed.get(key, 0))
            exp.append(prob * samples)
    obs.append(pooled_obs)
    exp.append(pooled_exp)
    exp = [e * sum(obs) / sum(exp) for e in exp]
    return float(chisquare(obs, exp).pvalue)


def first_two_tokens(decoder, temperature: float) -> tuple[Counter, int]:
    counts: Counter = Counter()
    accepted = 0
    for seed in range(SEEDS):
        result = decoder.generate(
            PROMPT, max_new_tokens=2, temperature=temperature, seed=seed, eos_token_ids=[]
        )
        counts[tuple(result.tokens)] += 1
        accepted += sum(step.accepted for step in result.steps)
    return counts, accepted


RULES = {"coupled": (None, Coupled), "recursive": (RecursiveRejection(), RecursiveRejection)}


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_token_recycling_first_two_tokens_follow_the_target(
    model, temperature: float, rule: str
) -> None:
    """TR + the default (coupled) or the recursive verifier: the first two tokens over
    1000 seeds pass chi-square."""
    verifier, kind = RULES[rule]
    decoder = verispec.SpeculativeDecoder(model, TokenRecycling(), verifier)
    assert isinstance(decoder.verifier_for(SamplingParams(temperature=temperature)), kind)
    counts, accepted = first_two_tokens(decoder, temperature)
    assert accepted > SEEDS // 10  # the drafts were really verified, not all rejected
    expected = target_joint_law(model, SamplingParams(temperature=temperature))
    assert chi_square_p_value(counts, expected, SEEDS) > ALPHA


@pytest.mark.parametrize("rule", list(RULES))
def test_full_coverage_drafter_first_two_tokens_follow_the_target(model, rule: str) -> None:
    """A root row covering the whole vocabulary (zero residual for the recursive rule)
    keeps the law exact under either rule."""
    decoder = verispec.SpeculativeDecoder(model, FullCoverage(), RULES[rule][0])
    counts, accepted = first_two_tokens(decoder, 1.0)
    assert accepted >= SEEDS  # some root child is always accepted
    expected = target_joint_law(model, SamplingParams(temperature=1.0))
    assert chi_square_p_value(counts, expected, SEEDS) > ALPHA


@pytest.mark.parametrize("verifier", [None, RecursiveRejection()], ids=["default", "recursive"])
@pytest.mark.parametrize("prompt", [[3, 5, 7], [1], [2, 2, 2, 2, 9, 4]])
def test_temperature_zero_is_token_identical_to_greedy(model, verifier, prompt) -> None:
    """At temperature 0, TR with either verifier generates exactly plain greedy decoding."""
    plain = verispec.SpeculativeDecoder(model, None, Greedy())
    expected = plain.generate(prompt, max_new_tokens=24, eos_token_ids=[]).tokens
    for template in ("2.2.2", "auto"):  # the published tree, and the device-sized default
        decoder = verispec.SpeculativeDecoder(model, TokenRecycling(template), verifier)
        for _ in range(2):  # the second run starts from a warm adjacency matrix
            result = decoder.generate(prompt, max_new_tokens=24, eos_token_ids=[])
            assert result.tokens == expected
        if template == "2.2.2":  # (the default's trees follow measured times)
            assert result.num_steps < 24  # drafts were accepted
