"""The greedy-identity run shared by the drafter tests that learn across prompts."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from verispec import SpeculativeDecoder
from verispec.core.types import Drafter, GenerationParams, LanguageModel
from verispec.verifiers import Greedy


def remembered_greedy_run(
    model: LanguageModel,
    drafter: Drafter,
    prompts: Sequence[list[int]],
    reference: Callable[[list[int], int], list[int]],
    max_new_tokens: int = 40,
) -> int:
    """Decode every prompt greedily with ``drafter``, assert each answer equals
    ``reference(prompt, max_new_tokens)``, remember it in the drafter's corpus for the
    next prompts, and return how many draft tokens were accepted in all."""
    decoder = SpeculativeDecoder(model, drafter, Greedy())
    config = GenerationParams(max_new_tokens=max_new_tokens, eos_token_ids=())
    accepted = 0
    for prompt in prompts:
        result = decoder.generate(prompt, config)
        assert result.tokens == reference(prompt, max_new_tokens)
        drafter.remember(result.tokens)  # type: ignore[attr-defined]
        accepted += sum(s.accepted for s in result.steps)
    return accepted
