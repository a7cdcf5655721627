"""The coupled rule through the real engine: exact in law, and the audit has power.

Toy Markov target (order 1, V = 3, ``markov_pair``); plain decoding (``ar``, the empty
tree) and the drafters of fixed candidates (Token Recycling, prompt lookup, Dynamic
Token Recycling) with the default verifier, which at temperature > 0 is
:class:`~verispec.verifiers.Coupled`. For each (drafter, sampling), 600 generations
with seeds 0..599 give the empirical law of the first three tokens, compared with
the target's enumerated joint law over the 27 sequences by a chi-square test at
alpha = 1e-3 (cells with an expected count below 5 pooled).

Power: the same audit must reject a coupling keyed by *tree node* (the row index)
instead of absolute position — a plausible bug, since node indices restart at every
step, so the same noise is reused across positions and the tokens become dependent.
It is rejected with p < 1e-12 for ``ar`` and for Token Recycling.

The drafters' p-values are equal to ``ar``'s: with the same seeds they generate the
same sequences, which is the seeded identity the rule exists for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from chi_square import law_pvalue
from markov_pair import markov_pair

from verispec import SpeculativeDecoder
from verispec.core import SamplingParams
from verispec.core.tree import DraftTree
from verispec.core.types import Drafter, Verdict, Verifier
from verispec.drafters import TokenRecycling
from verispec.drafters.dynamic_token_recycling import DynamicTokenRecycling
from verispec.drafters.prompt_lookup import PromptLookup
from verispec.kernels.cpu import draw as cpu_draw
from verispec.verifiers import Coupled, default_verifier, seeded_sample
from verispec.verifiers._rules import follow_target

ALPHA = 1e-3
POWER_P_VALUE = 1e-12
SAMPLES = 600
PROMPT = [0, 2, 1, 0, 2]  # repeats, so prompt lookup finds candidates

DRAFTERS: dict[str, Callable[[], Drafter | None]] = {
    "ar": lambda: None,
    "tr": lambda: TokenRecycling(template="8", vocab_size=3),
    "pld": lambda: PromptLookup(max_tokens=4, min_ngram=1, max_ngram=2),
    "dtr": lambda: DynamicTokenRecycling(budget=6, vocab_size=3),
}
SAMPLINGS = {
    "T=0.6": SamplingParams(temperature=0.6),
    "T=1,top-p=0.9": SamplingParams(temperature=1.0, top_p=0.9),
}


class NodeKeyed(Coupled):
    """A wrong coupling: the draw of row ``r`` is keyed by (seed, r), not by its position."""

    def verify(
        self,
        tree: DraftTree,
        target_logits: torch.Tensor,
        sampling: SamplingParams,
        generator: torch.Generator,
        *,
        position: int | None = None,
    ) -> Verdict:
        seed = generator.initial_seed()

        def draw(row: int, depth: int) -> int:
            return seeded_sample(sampling.probs(target_logits[row], self.dtype), seed, row)

        return follow_target(tree, draw)


class Float32Rows:
    """The Markov target with float32 rows, as a real model's on the CPU: the coupled rule
    draws them in C (:mod:`verispec.kernels.cpu.draw`); everything else is the target's."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def forward_tree(self, tree: DraftTree, **kwargs: Any) -> torch.Tensor:
        return self._target.forward_tree(tree, **kwargs).float()


def audit(
    drafter: Drafter | None,
    verifier: Verifier | None,
    sampling: SamplingParams,
    float32: bool = False,
) -> tuple:
    """(chi-square p-value of the first three tokens, tokens committed per step), with the
    target's float64 rows or (``float32``) its rows rounded to float32."""
    target, _ = markov_pair()
    decoder = SpeculativeDecoder(Float32Rows(target) if float32 else target, drafter, verifier)
    counts = torch.zeros(27)
    committed = steps = 0
    settings = {"temperature": sampling.temperature, "top_p": sampling.top_p}
    for seed in range(SAMPLES):
        result = decoder.generate(PROMPT, max_new_tokens=3, seed=seed, **settings)
        a, b, c = result.tokens[:3]
        counts[9 * a + 3 * b + c] += 1
        committed += sum(s.committed for s in result.steps)
        steps += result.num_steps
    law = target.sequence_probs(PROMPT, 3, sampling).reshape(-1)
    assert float(counts[law == 0].sum()) == 0, "a sequence of probability 0 was generated"
    return law_pvalue(counts, law), committed / steps


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_first_three_tokens_follow_the_target_law(name: str, sampling: str) -> None:
    """Under the default (coupled) verifier the first three tokens pass chi-square against
    the target's joint law (600 seeds, alpha = 1e-3); drafters really get tokens accepted."""
    params = SAMPLINGS[sampling]
    assert isinstance(default_verifier(params), Coupled)
    p_value, per_step = audit(DRAFTERS[name](), None, params)
    assert p_value > ALPHA
    if name != "ar":
        assert per_step > 1.05


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("name", ["ar", "dtr"])
def test_float32_rows_are_drawn_in_c_and_follow_the_target_law(
    name: str, sampling: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With float32 rows every draw runs in C (counted), and the first three tokens pass the
    same audit; ``dtr`` still gets drafts accepted."""
    if cpu_draw.library() is None:
        pytest.skip("the C draw cannot be built on this machine")
    drawn = {"in C": 0, "rows": 0}
    real = cpu_draw.coupled_draw

    def counted(*args: Any) -> int | None:
        token = real(*args)
        drawn["rows"] += 1
        drawn["in C"] += token is not None
        return token

    monkeypatch.setattr(cpu_draw, "coupled_draw", counted)
    p_value, per_step = audit(DRAFTERS[name](), None, SAMPLINGS[sampling], float32=True)
    assert p_value > ALPHA
    assert drawn["rows"] >= 3 * SAMPLES and drawn["in C"] == drawn["rows"]
    if name != "ar":
        assert per_step > 1.05


@pytest.mark.parametrize("name", ["ar", "tr"])
def test_the_audit_rejects_a_coupling_keyed_by_tree_node(name: str) -> None:
    """Keying the noise by tree node instead of absolute position fails the same audit
    (p < 1e-12), while the position-keyed rule passes it on the same runs' settings."""
    params = SAMPLINGS["T=0.6"]
    wrong, _ = audit(DRAFTERS[name](), NodeKeyed(), params)
    right, _ = audit(DRAFTERS[name](), Coupled(), params)
    assert wrong < POWER_P_VALUE
    assert right > ALPHA
