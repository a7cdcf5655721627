"""DySpec with ``budget="auto"``, through the real engine, generates exactly the target's law.

The same audit as ``test_draft_model_exactness.py`` (toy Markov target of order 1 and a
perturbed order-2 draft over V = 3 tokens, recursive rejection sampling in float64; 600
seeded generations; chi-square of the first three tokens against the target's enumerated
joint law at alpha = 1e-3), for two latency tables: a linear one (1 + 0.35 n seconds:
trees of 1 to about 13 nodes, chosen per step from the slot values) and a non-convex one
(T(1) = T(2) = 2.85 T(0)), where cutting a grown tree at its best prefix would keep the
first node only when the values drawn after it are large. Power check, done by hand:
that cut-after-growth variant (max_budget 4) scores p = 7e-4 here at temperature 1 (600
runs), and fails the root-children test of ``proofs_tests/drafters/test_dyspec_auto.py``
with p < 1e-9.
"""

from __future__ import annotations

import pytest
import torch
from chi_square import law_pvalue
from markov_pair import markov_pair

from verispec import SpeculativeDecoder
from verispec.core import SamplingParams
from verispec.drafters.budget import LatencyTable
from verispec.drafters.dyspec import DySpec
from verispec.verifiers import Greedy
from verispec.verifiers.recursive import RecursiveRejection

ALPHA = 1e-3
SAMPLES = 600
PROMPT = [0, 2]
TABLES = {
    "linear": LatencyTable([0, 64], [1.0, 1.0 + 64 * 0.35]),
    "step": LatencyTable([0, 1, 2, 3], [1.0, 2.85, 2.85, 20.0]),
}


@pytest.mark.parametrize("temperature", [0.6, 1.0])
@pytest.mark.parametrize("table", list(TABLES))
def test_first_three_tokens_follow_the_target_law(table: str, temperature: float) -> None:
    """The first three tokens generated with DySpec(budget='auto') are distributed as the
    target's joint law (chi-square over 27 sequences, 600 seeded generations, alpha =
    1e-3); the trees are not all the same size (linear table) and drafts are accepted."""
    target, draft = markov_pair()
    drafter = DySpec(draft, budget="auto", latency=TABLES[table], max_budget=16)
    decoder = SpeculativeDecoder(target, drafter, RecursiveRejection(torch.float64))
    counts = torch.zeros(27)
    committed = steps = 0
    sizes: set[int] = set()
    for seed in range(SAMPLES):
        result = decoder.generate(PROMPT, max_new_tokens=3, temperature=temperature, seed=seed)
        a, b, c = result.tokens[:3]
        counts[9 * a + 3 * b + c] += 1
        committed += sum(s.committed for s in result.steps)
        steps += result.num_steps
        sizes |= {s.tree_size for s in result.steps}
    law = target.sequence_probs(PROMPT, 3, SamplingParams(temperature=temperature)).reshape(-1)
    assert float(counts[law == 0].sum()) == 0
    assert law_pvalue(counts, law) > ALPHA
    assert committed / steps > 1.2
    assert len(sizes) >= 3 if table == "linear" else sizes == {2}


@pytest.mark.parametrize("table", [*TABLES, "dear"])
def test_greedy_is_token_identical_on_the_markov_pair(table: str) -> None:
    """At temperature 0 the auto-sized drafter's output equals plain greedy decoding
    (3 prompts, 24 tokens), with the Greedy verifier and with recursive rejection; also
    with a table where no node ever pays (T(1) = 2 T(0): empty trees, the draft idle)."""
    target, draft = markov_pair()
    dear = LatencyTable([0, 64], [1.0, 65.0])
    latency = TABLES.get(table, dear)
    for prompt in ([0], [2, 1], [1, 1, 0]):
        plain = SpeculativeDecoder(target, None, Greedy()).generate(prompt, max_new_tokens=24)
        for verifier in (Greedy(), RecursiveRejection(torch.float64)):
            drafter = DySpec(draft, budget="auto", latency=latency, max_budget=16)
            decoder = SpeculativeDecoder(target, drafter, verifier)
            assert decoder.generate(prompt, max_new_tokens=24).tokens == plain.tokens
