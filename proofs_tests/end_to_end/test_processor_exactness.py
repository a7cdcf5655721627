"""Logits processing under trees through the real engine: exact in law, and the audit has power.

Toy Markov pair (``markov_pair``: order-1 target, order-2 draft, V = 3), temperature 1,
the default verifier. Two kinds of processing, each audited for Token Recycling and
Dynamic Token Recycling (fixed candidates, the coupled rule) and for DySpec (a draft-model
tree drawn without replacement, recursive rejection):

* a **repetition penalty** of 3 (transformers' ``RepetitionPenaltyLogitsProcessor``): the
  first three tokens' law is enumerated from the target's logits processed with each
  prefix, 27 outcomes;
* a **grammar**, the regex ``(ab|b)*`` over tokens a = 0, b = 1 and end-of-sequence 2
  (llguidance): after ``a`` only ``b`` may follow; the law of the answer (up to three
  tokens, ending early at end-of-sequence) is enumerated with that mask written by hand.

600 seeded generations per case, chi-square at alpha = 1e-3 (cells with an expected count
below 5 pooled), and the drafts are really accepted (more than 1.2 tokens per step).

With the penalty, Token Recycling and Dynamic Token Recycling under the coupled rule also
give plain decoding's answer for every seed (the seeded identity keeps holding).

Power: the audits must reject two plausible wrong applications — the processor given the
*committed* prefix for every row (not the row's own path), which breaks the seeded
identity and is rejected by the chi-square audit (p = 3e-4 < alpha, with Dynamic Token
Recycling, whose deeper trees draw more tokens from node rows), and the mask applied
*after* verification to the extra token's row only, under which answers the grammar
forbids appear. (Cutting the kept path at its first forbidden
token and drawing the extra token there from the masked row is not on this list: that is
rejection sampling from the masked law, exact, and the audit rightly accepts it.)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest
import torch
from chi_square import law_pvalue
from markov_pair import markov_pair
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

import verispec.processors.tree as tree_processing
from verispec import SpeculativeDecoder
from verispec.core import SamplingParams
from verispec.core.types import DecodeState, Drafter, Verdict
from verispec.drafters import TokenRecycling
from verispec.drafters.chain import Chain
from verispec.drafters.dynamic_token_recycling import DynamicTokenRecycling
from verispec.drafters.dyspec import DySpec
from verispec.drafters.rsd_beam import RSDStochasticBeam
from verispec.drafters.specinfer import SpecInferTree
from verispec.models.markov import MarkovModel
from verispec.verifiers import default_verifier

ALPHA = 1e-3
POWER_P_VALUE = 1e-6
SAMPLES = 600
PROMPT = [0]
PENALTY = 3.0
EOS = 2
T1 = SamplingParams(temperature=1.0)

DRAFTERS: dict[str, Callable[[MarkovModel], Drafter]] = {
    "tr": lambda draft: TokenRecycling(template="8", vocab_size=3),
    "dtr": lambda draft: DynamicTokenRecycling(budget=6, vocab_size=3),
    "dyspec": lambda draft: DySpec(draft, budget=6),
}


class ABTokenizer:
    """Tokens ``a`` (0), ``b`` (1) and the end of sequence (2), for llguidance."""

    eos_token_id = EOS
    bos_token_id = None

    def __len__(self) -> int:
        return 3

    def token_bytes(self) -> list[bytes]:
        return [b"a", b"b", b"</s>"]

    def encode(self, text: str) -> list[int]:
        return ["ab".index(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join("ab"[i] for i in ids if i < 2)


def _penalised(context: list[int], logits: torch.Tensor) -> torch.Tensor:
    processor = RepetitionPenaltyLogitsProcessor(PENALTY)
    return processor(torch.tensor([context]), logits[None].clone())[0]


def _masked(context: list[int], logits: torch.Tensor) -> torch.Tensor:
    """``(ab|b)*`` written by hand: after an ``a`` of the answer only ``b`` may follow."""
    answer = context[len(PROMPT) :]
    if answer and answer[-1] == 0:
        return logits.masked_fill(torch.arange(3) != 1, float("-inf"))
    return logits


def _outcomes(length: int, eos: int | None) -> list[tuple[int, ...]]:
    """Every answer of at most ``length`` tokens (ending at ``eos`` when it comes)."""
    out = []
    for seq in itertools.product(range(3), repeat=length):
        cut = seq.index(eos) + 1 if eos is not None and eos in seq else length
        if seq[:cut] not in out:
            out.append(seq[:cut])
    return out


def _law(
    target: MarkovModel,
    process: Callable[[list[int], torch.Tensor], torch.Tensor],
    outcomes: list[tuple[int, ...]],
) -> torch.Tensor:
    """The exact probability of each outcome when every token is drawn at temperature 1
    from the target's logits processed with that token's prefix."""
    law = torch.zeros(len(outcomes), dtype=torch.float64)
    for i, seq in enumerate(outcomes):
        prob, context = 1.0, list(PROMPT)
        for token in seq:
            prob *= float(
                T1.probs(process(context, target.next_logits(context)), torch.float64)[token]
            )
            context.append(token)
        law[i] = prob
    return law


def _audit(
    decoder: SpeculativeDecoder, outcomes: list[tuple[int, ...]], **options: object
) -> tuple[torch.Tensor, float]:
    counts = torch.zeros(len(outcomes))
    committed = steps = 0
    for seed in range(SAMPLES):
        result = decoder.generate(PROMPT, max_new_tokens=3, temperature=1.0, seed=seed, **options)
        counts[outcomes.index(tuple(result.tokens))] += 1
        committed += sum(s.committed for s in result.steps)
        steps += result.num_steps
    return counts, committed / steps


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_a_repetition_penalty_keeps_the_law(name: str) -> None:
    """With ``repetition_penalty=3`` the first three tokens follow the law of the target's
    logits penalised with each prefix (27 outcomes, 600 runs, alpha = 1e-3), with drafts
    accepted (more than 1.2 tokens per step)."""
    target, draft = markov_pair()
    outcomes = _outcomes(3, None)
    decoder = SpeculativeDecoder(target, DRAFTERS[name](draft))
    counts, mat = _audit(decoder, outcomes, repetition_penalty=PENALTY)
    law = _law(target, _penalised, outcomes)
    assert law_pvalue(counts, law) > ALPHA
    assert mat > 1.2


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_a_grammar_mask_keeps_the_law(name: str) -> None:
    """With ``regex="(ab|b)*"`` every answer matches it and the answers follow the law of
    the target's logits masked at each prefix (600 runs, alpha = 1e-3), with drafts
    accepted (more than 1.2 tokens per step)."""
    target, draft = markov_pair()
    outcomes = _outcomes(3, EOS)
    decoder = SpeculativeDecoder(target, DRAFTERS[name](draft), tokenizer=ABTokenizer())
    counts, mat = _audit(decoder, outcomes, regex="(ab|b)*", eos_token_ids=[EOS])
    law = _law(target, _masked, outcomes)
    assert float(counts[law == 0].sum()) == 0  # nothing the grammar forbids, ever
    assert law_pvalue(counts[law > 0], law[law > 0]) > ALPHA
    assert mat > 1.2


@pytest.fixture
def committed_prefix_for_every_row(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The known-wrong application: every row processed with the committed tokens only."""

    def wrong(tree: object, committed: torch.Tensor) -> list:
        right = original(tree, committed)
        return [(rows, committed.expand(len(rows), -1)) for rows, _ in right]

    original = tree_processing._depth_batches
    monkeypatch.setattr(tree_processing, "_depth_batches", wrong)
    yield


def _seeded_answers(drafter: Drafter | None, runs: int) -> list[tuple[int, ...]]:
    target, _ = markov_pair()
    decoder = SpeculativeDecoder(target, drafter)
    return [
        tuple(decoder.generate(PROMPT, max_new_tokens=6, temperature=1.0, seed=seed,
                               repetition_penalty=PENALTY).tokens)
        for seed in range(runs)
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["tr", "dtr"])
def test_the_seeded_identity_holds_with_a_processor(name: str) -> None:
    """With a repetition penalty, a drafter of fixed candidates under the coupled rule gives
    the answer plain decoding gives for the same seed (200 seeds, six tokens each)."""
    _, draft = markov_pair()
    assert _seeded_answers(DRAFTERS[name](draft), 200) == _seeded_answers(None, 200)


@pytest.mark.usefixtures("committed_prefix_for_every_row")
def test_the_audits_reject_a_processor_given_the_wrong_prefix() -> None:
    """Power: penalising every row with the committed prefix instead of its own path breaks
    the seeded identity (Token Recycling: some seed's answer differs from plain decoding's)
    and is rejected by the repetition-penalty chi-square audit (Dynamic Token Recycling,
    p < alpha)."""
    target, draft = markov_pair()
    assert _seeded_answers(DRAFTERS["tr"](draft), 200) != _seeded_answers(None, 200)
    outcomes = _outcomes(3, None)
    decoder = SpeculativeDecoder(target, DRAFTERS["dtr"](draft))
    counts, _ = _audit(decoder, outcomes, repetition_penalty=PENALTY)
    assert law_pvalue(counts, _law(target, _penalised, outcomes)) < ALPHA


class _MaskAfterVerification:
    """The known-wrong application of a mask: verify against the unmasked rows, then mask
    only the row the extra token is drawn from and draw it again there."""

    def __init__(self, state: list[DecodeState]) -> None:
        self._state = state

    def verify(self, tree, logits, sampling, generator) -> Verdict:  # type: ignore[no-untyped-def]
        verdict = default_verifier(sampling).verify(tree, logits, sampling, generator)
        context = list(self._state[0].tokens) + [int(tree.tokens[n]) for n in verdict.accepted]
        row = verdict.accepted[-1] + 1 if verdict.accepted else 0
        probs = sampling.probs(_masked(context, logits[row]), torch.float64)
        extra = int(torch.multinomial(probs, 1, generator=generator))
        return Verdict(accepted=verdict.accepted, extra_token=extra)


class _Recording:
    """A drafter that records the decode state for the wrong verifier, then delegates."""

    needs_draft_model = False

    def __init__(self, inner: Drafter, state: list[DecodeState]) -> None:
        self._inner, self._state = inner, state

    def begin(self, state: DecodeState) -> None:
        self._state[:] = [state]
        self._inner.begin(state)

    def propose(self, state: DecodeState):  # type: ignore[no-untyped-def]
        return self._inner.propose(state)

    def observe(self, outcome) -> None:  # type: ignore[no-untyped-def]
        self._inner.observe(outcome)


def test_the_audit_rejects_a_mask_applied_after_verification() -> None:
    """Power: verifying against unmasked rows and masking only the extra token's row
    afterwards is rejected by the grammar audit (Token Recycling): answers the grammar
    forbids appear, or the law is off with p < 1e-6."""
    target, draft = markov_pair()
    outcomes = _outcomes(3, EOS)
    state: list[DecodeState] = []
    decoder = SpeculativeDecoder(
        target, _Recording(DRAFTERS["tr"](draft), state), _MaskAfterVerification(state)
    )
    counts, _ = _audit(decoder, outcomes, eos_token_ids=[EOS])
    law = _law(target, _masked, outcomes)
    forbidden = float(counts[law == 0].sum())
    assert forbidden > 0 or law_pvalue(counts[law > 0], law[law > 0]) < POWER_P_VALUE


class _Trees:
    """Records each proposed tree with the committed tokens it hangs below."""

    needs_draft_model = True

    def __init__(self, inner: Drafter) -> None:
        self._inner, self.trees = inner, []  # type: ignore[var-annotated]
        self.draft = getattr(inner, "draft", None)

    def begin(self, state: DecodeState) -> None:
        self._inner.begin(state)

    def propose(self, state: DecodeState):  # type: ignore[no-untyped-def]
        tree = self._inner.propose(state)
        self.trees.append((list(state.tokens), tree))
        return tree

    def observe(self, outcome) -> None:  # type: ignore[no-untyped-def]
        self._inner.observe(outcome)


MASKED_DRAFTERS: dict[str, Callable[[MarkovModel], Drafter]] = {
    "dyspec": lambda draft: DySpec(draft, budget=6),
    "chain": lambda draft: Chain(draft, k=3),
    "specinfer": lambda draft: SpecInferTree(draft, branching=(2, 2)),
    "rsd-s": lambda draft: RSDStochasticBeam(draft, width=2, depth=3),
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", list(MASKED_DRAFTERS))
def test_draft_model_drafters_spend_no_node_on_a_forbidden_token(
    name: str, temperature: float
) -> None:
    """Under the grammar ``(ab|b)*`` a draft-model drafter masks its own draws: no node of
    any tree is a token the grammar forbids after its path (40 generations of 6 tokens;
    nodes below an end-of-sequence node are never committed and not checked)."""
    target, draft = markov_pair()
    drafter = _Trees(MASKED_DRAFTERS[name](draft))
    decoder = SpeculativeDecoder(target, drafter, tokenizer=ABTokenizer())
    for seed in range(40):
        decoder.generate(PROMPT, max_new_tokens=6, temperature=temperature, seed=seed,
                         regex="(ab|b)*", eos_token_ids=[EOS])  # fmt: skip
    nodes = 0
    for committed, tree in drafter.trees:
        for node in range(tree.num_nodes):
            path = [int(tree.tokens[n]) for n in tree.path_to(node)]
            if EOS in path[:-1]:
                continue  # below the end of the answer: never committed, never masked
            context = committed + path[:-1]
            assert _masked(context, torch.zeros(3))[path[-1]] > -torch.inf, (committed, path)
            nodes += 1
    assert nodes > 40  # trees were sent
