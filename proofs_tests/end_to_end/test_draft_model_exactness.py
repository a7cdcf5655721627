"""Every draft-model drafter, through the real engine, generates exactly the target's law.

Sampling (temperatures 0.6 and 1.0): toy Markov target (order 1) and draft (order 2, a
perturbed copy of the target's table) over V = 3 tokens; each drafter with recursive
rejection sampling in float64. For each (drafter, temperature), 600 generations with
seeds 0..599 give the empirical law of the first three generated tokens, compared with
the target's enumerated joint law over the 27 sequences by a chi-square test at
alpha = 1e-3 (cells with an expected count below 5 pooled). Power check, done by hand:
declaring RSD-C's siblings IID instead of without replacement fails this test with
p-values below 1e-50 (600 runs).

Greedy (temperature 0): every drafter is token-identical to plain greedy decoding, on
the Markov pair and on a tiny float64 Llama with a self-draft (its first layer) or a
second tiny Llama as the draft.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from chi_square import law_pvalue
from markov_pair import markov_pair

from verispec import SpeculativeDecoder
from verispec.core import SamplingParams
from verispec.core.types import Drafter, LanguageModel
from verispec.drafters.chain import Chain
from verispec.drafters.dyspec import DySpec
from verispec.drafters.rsd_beam import RSDStochasticBeam
from verispec.drafters.rsd_constant import RSDConstant
from verispec.drafters.specinfer import SpecInferTree
from verispec.models.self_draft import self_draft
from verispec.verifiers import Greedy
from verispec.verifiers.recursive import RecursiveRejection

ALPHA = 1e-3
SAMPLES = 600
PROMPT = [0, 2]

DRAFTERS: dict[str, Callable[[LanguageModel], Drafter]] = {
    "chain": lambda draft: Chain(draft, k=3),
    "specinfer": lambda draft: SpecInferTree(draft, branching=(2, 2)),
    "dyspec": lambda draft: DySpec(draft, budget=6),
    "dyspec-threshold": lambda draft: DySpec(draft, threshold=0.2, budget=8),
    "rsd-c": lambda draft: RSDConstant(draft, branching=(2, 2)),
    "rsd-s": lambda draft: RSDStochasticBeam(draft, width=2, depth=3),
}


@pytest.mark.parametrize("temperature", [0.6, 1.0])
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_first_three_tokens_follow_the_target_law(name: str, temperature: float) -> None:
    """The first three generated tokens are distributed as the target's joint law
    (chi-square over 27 sequences, 600 seeded generations, alpha = 1e-3), and drafts
    are really accepted (more than 1.2 tokens per step on average)."""
    target, draft = markov_pair()
    decoder = SpeculativeDecoder(target, DRAFTERS[name](draft), RecursiveRejection(torch.float64))
    counts = torch.zeros(27)
    committed = steps = 0
    for seed in range(SAMPLES):
        result = decoder.generate(PROMPT, max_new_tokens=3, temperature=temperature, seed=seed)
        a, b, c = result.tokens[:3]
        counts[9 * a + 3 * b + c] += 1
        committed += sum(s.committed for s in result.steps)
        steps += result.num_steps
    law = target.sequence_probs(PROMPT, 3, SamplingParams(temperature=temperature)).reshape(-1)
    assert float(counts[law == 0].sum()) == 0
    assert law_pvalue(counts, law) > ALPHA
    assert committed / steps > 1.2


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_is_token_identical_on_the_markov_pair(name: str) -> None:
    """At temperature 0 the drafter's output equals plain greedy decoding (3 prompts,
    24 tokens), with the Greedy verifier and with recursive rejection."""
    target, draft = markov_pair()
    for prompt in ([0], [2, 1], [1, 1, 0]):
        plain = SpeculativeDecoder(target, None, Greedy()).generate(prompt, max_new_tokens=24)
        for verifier in (Greedy(), RecursiveRejection(torch.float64)):
            decoder = SpeculativeDecoder(target, DRAFTERS[name](draft), verifier)
            assert decoder.generate(prompt, max_new_tokens=24).tokens == plain.tokens


@pytest.fixture(scope="module")
def llama_pair() -> dict[str, tuple[LanguageModel, LanguageModel]]:
    from verispec.models import tiny_llama

    target = tiny_llama(vocab_size=64, num_layers=2, seed=0, std=0.5)
    other = tiny_llama(vocab_size=64, num_layers=1, seed=1, std=0.5)
    return {"self-draft": (target, target.self_draft(1)), "second-model": (target, other)}


@pytest.mark.parametrize("pair", ["self-draft", "second-model"])
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_is_token_identical_on_a_tiny_llama(
    name: str, pair: str, llama_pair: dict[str, tuple[LanguageModel, LanguageModel]]
) -> None:
    """At temperature 0 the drafter's output equals plain greedy decoding of a tiny float64
    Llama (2 prompts, 20 tokens), with a self-draft or a second tiny model as the draft."""
    target, draft = llama_pair[pair]
    accepted = 0
    for prompt in ([3, 17, 5], [60, 2, 2, 9, 31]):
        decoder = SpeculativeDecoder(target, DRAFTERS[name](draft), Greedy())
        result = decoder.generate(prompt, max_new_tokens=20, eos_token_ids=())
        plain = SpeculativeDecoder(target, None, Greedy()).generate(
            prompt, max_new_tokens=20, eos_token_ids=()
        )
        assert result.tokens == plain.tokens
        accepted += sum(step.accepted for step in result.steps)
    assert accepted > 0  # the drafts were used, not all rejected


@pytest.fixture(scope="module")
def smollm2(default_model: tuple) -> tuple[LanguageModel, LanguageModel, list[int], list[int]]:
    model, tokenizer = default_model
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three uses of a paperclip."}],
        add_generation_prompt=True,
    )
    ids = list(prompt["input_ids"]) if hasattr(prompt, "keys") else list(prompt)
    plain = SpeculativeDecoder(model, None, Greedy()).generate(ids, max_new_tokens=16)
    return model, self_draft(model), ids, plain.tokens


@pytest.mark.slow
@pytest.mark.parametrize("name", ["chain", "specinfer", "dyspec", "rsd-c", "rsd-s"])
def test_greedy_is_token_identical_on_smollm2(
    name: str, smollm2: tuple[LanguageModel, LanguageModel, list[int], list[int]]
) -> None:
    """At temperature 0 the drafter, with SmolLM2's default self-draft (24 of 30 layers),
    generates exactly SmolLM2's greedy continuation (16 tokens) while drafts are accepted."""
    model, draft, prompt, plain = smollm2
    result = SpeculativeDecoder(model, DRAFTERS[name](draft), Greedy()).generate(
        prompt, max_new_tokens=16
    )
    assert result.tokens == plain
    assert sum(step.accepted for step in result.steps) > 0
