"""End-to-end tests of verispec/models/hf.py in the decoding loop: greedy is token-identical
to transformers' own ``generate``."""

from __future__ import annotations

import pytest
import torch

from verispec import SpeculativeDecoder
from verispec.core import DecodeState, DraftTree, StepOutcome
from verispec.models import HFModel, tiny_llama
from verispec.verifiers import Greedy

V = 64
NEW_TOKENS = 24


class OracleTreeDrafter:
    """A deterministic test drafter that knows the true greedy continuation.

    Each step it proposes a random-shaped tree: a spine following the true continuation (at a
    random depth, sometimes with one wrong token to force a rejection mid-way), wrong siblings
    at every level, and the true child placed at a random rank among its siblings (so side
    branches are accepted). Randomness comes from its own seeded ``torch.Generator``.
    """

    needs_draft_model = False

    def __init__(self, expected: list[int], vocab_size: int, seed: int) -> None:
        self.expected = expected  # prompt + greedy continuation
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)

    def _randint(self, high: int) -> int:
        return int(torch.randint(high, (1,), generator=self.generator))

    def begin(self, state: DecodeState) -> None:
        pass

    def propose(self, state: DecodeState) -> DraftTree:
        truth = self.expected[len(state.tokens) : len(state.tokens) + 5]
        depth = min(self._randint(5), len(truth))
        if depth and self._randint(4) == 0:  # corrupt one spine token
            level = self._randint(depth)
            truth = list(truth)
            truth[level] = (truth[level] + 1 + self._randint(self.vocab_size - 1)) % self.vocab_size
        tokens: list[int] = []
        parents: list[int] = []
        parent = -1
        for level in range(depth):
            siblings = [(truth[level] + 1 + j) % self.vocab_size for j in range(self._randint(3))]
            rank = self._randint(len(siblings) + 1)
            spine_index = -1
            for position, token in enumerate([*siblings[:rank], truth[level], *siblings[rank:]]):
                tokens.append(token)
                parents.append(parent)
                if position == rank:
                    spine_index = len(tokens) - 1
                elif self._randint(2):  # a wrong sibling sometimes gets a child of its own
                    tokens.append(self._randint(self.vocab_size))
                    parents.append(len(tokens) - 2)
            parent = spine_index
        return DraftTree.from_parents(tokens, parents) if tokens else DraftTree.empty()

    def observe(self, outcome: StepOutcome) -> None:
        pass


class RecordingGreedy(Greedy):
    """Greedy that counts accepted draft tokens and accepted nodes that are not first children."""

    def __init__(self) -> None:
        self.accepted = 0
        self.side_branches = 0

    def verify(self, tree, target_logits, sampling=None, generator=None):  # type: ignore[no-untyped-def]
        verdict = super().verify(tree, target_logits, sampling, generator)
        self.accepted += len(verdict.accepted)
        for node in verdict.accepted:
            siblings = tree.children[int(tree.parents[node]) + 1]
            self.side_branches += int(siblings[0] != node)
        return verdict


def _hf_greedy(model: HFModel, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.hf_model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return [int(t) for t in out[0, len(prompt) :]]


@pytest.fixture(scope="module")
def model() -> HFModel:
    wrapped = tiny_llama(vocab_size=V, num_layers=2, seed=5)
    wrapped.hf_model.generation_config.eos_token_id = None  # both sides decode to the end
    return wrapped


def _prompts(count: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(123)
    lengths = torch.randint(1, 12, (count,), generator=generator).tolist()
    return [torch.randint(0, V, (n,), generator=generator).tolist() for n in lengths]


@pytest.mark.parametrize("with_drafter", [False, True])
def test_greedy_matches_transformers_generate(model: HFModel, with_drafter: bool) -> None:
    """At temperature 0, plain decoding and oracle-tree drafting with Greedy produce exactly
    transformers' greedy tokens for many random prompts."""
    verifier = RecordingGreedy()
    for index, prompt in enumerate(_prompts(30)):
        expected = _hf_greedy(model, prompt, NEW_TOKENS)
        drafter = OracleTreeDrafter([*prompt, *expected], V, seed=index) if with_drafter else None
        decoder = SpeculativeDecoder(model, drafter, verifier)
        result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, eos_token_ids=[])
        assert result.tokens == expected, f"prompt {index}: {prompt}"
    if with_drafter:  # the drafts were really used, side branches included
        assert verifier.accepted > 50
        assert verifier.side_branches > 10
