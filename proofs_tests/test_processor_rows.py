"""Tests of verispec/processors/tree.py row by row: each tree row is processed with its own
prefix, the path's tokens in the order the path has them.

The greedy-identity tests of ``test_processors.py`` run whole generations, where a row
whose path is read in a wrong order is rarely the one that decides a token. Here every row
of a three-level tree is compared with the processors run on that row's own prefix alone
(the committed tokens, then the path from the root, as ``generate`` would see it), for
each processor the docs accept that reads the *order* of the prefix: no-repeat n-grams,
multi-token bad words and sequence biases, ``prefix_allowed_tokens_fn``, the watermark, a
user processor, and a grammar. Each case also checks its own power: giving the path's
tokens in any other order (reversed, or any other permutation the processor can see)
changes the processed row of some node at every depth from 2 on.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from transformers.generation import logits_process as lp

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftTree
from verispec.core.types import DecodeState, GenerationParams
from verispec.models.tiny import ByteTokenizer
from verispec.processors import GrammarLogitsProcessor, TreeProcessor, processing_for

V = 64
A, B, C = 3, 4, 5  # the tree's tokens
# a prompt that repeats itself, as chat prompts with lists do: the paths' n-grams occur in it
COMMITTED = [0, A, B, 9, B, C, 10, C, A, 11, A, B, C, 12, C, B, 13, B, A, 14, A]
# every path of up to three tokens over A, B, C: 39 nodes, repeated tokens included
TREE = DraftTree.from_paths(list(itertools.product((A, B, C), repeat=3)))
DEPTHS = (2, 3)

Processors = Callable[[], list[Any]]


def _state(tokens: list[int]) -> DecodeState:
    return DecodeState(
        tokens=tokens,
        prompt_length=1,
        sampling=SamplingParams(temperature=1.0),
        generator=torch.Generator(),
    )


def _logits(rows: int, vocab: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(rows, vocab, generator=generator)


def _alone(processors: list[Any], prefix: list[int], row: torch.Tensor) -> torch.Tensor:
    """``row`` processed as ``generate`` processes a batch of one whose tokens are ``prefix``."""
    scores = row[None].clone()
    for processor in processors:
        scores = processor(torch.tensor([prefix]), scores)
    return scores[0]


def _permutations(depth: int, last_only: bool) -> list[tuple[int, ...]]:
    """Every order of ``depth`` positions but the identity; those that move the last
    position when the processor reads the last token only."""
    identity = tuple(range(depth))
    return [
        order
        for order in itertools.permutations(identity)
        if order != identity and (not last_only or order[-1] != depth - 1)
    ]


def _nodes_at(tree: DraftTree, depth: int) -> list[int]:
    return [i for i in range(tree.num_nodes) if int(tree.depth[i]) == depth]


def _order_changes_a_row(
    row_after: Callable[[list[int], int], torch.Tensor], tree: DraftTree, last_only: bool
) -> list[tuple[int, tuple[int, ...]]]:
    """The (depth, order) pairs for which *no* node of that depth has a different row when
    its path's tokens are taken in that order: the orders the case could not see."""
    blind = []
    for depth in DEPTHS:
        for order in _permutations(depth, last_only):
            seen = False
            for node in _nodes_at(tree, depth):
                path = tree.path_tokens(node)
                moved = [path[k] for k in order]
                if moved != path and not torch.equal(
                    row_after(moved, node + 1), row_after(path, node + 1)
                ):
                    seen = True
                    break
            if not seen:
                blind.append((depth, order))
    return blind


class _RecencyPenalty:
    """A user processor of the prefix that reads its order: the last token's score is
    lowered by 3, the one before by 2, the one before that by 1."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        weights = torch.tensor([1.0, 2.0, 3.0], dtype=scores.dtype).expand(len(scores), -1)
        return scores.scatter_add(1, input_ids[:, -3:], -weights)


def _window_allowed(batch_id: int, input_ids: torch.Tensor) -> list[int]:
    """``prefix_allowed_tokens_fn``: eight tokens chosen by the last three, in order, and
    by the prompt's index in the batch (as a batched ``generate`` with one constraint per
    prompt reads it; 0 for one prompt, whichever tree row it is called for)."""
    last = input_ids[-3:].tolist()
    start = (9 * last[0] + 3 * last[1] + last[2] + 17 * batch_id) % V
    return [(start + k) % V for k in range(8)]


@dataclass(frozen=True)
class Case:
    processors: Processors
    last_only: bool = False  # the processor reads the prefix's last token only


CASES = {
    "no_repeat_ngram_2": Case(lambda: [lp.NoRepeatNGramLogitsProcessor(2)]),
    "no_repeat_ngram_3": Case(lambda: [lp.NoRepeatNGramLogitsProcessor(3)]),
    "bad_words": Case(
        lambda: [lp.NoBadWordsLogitsProcessor([[A, B, 20], [B, A, C, 21], [C, 22]], 1)]
    ),
    "sequence_bias": Case(
        lambda: [
            lp.SequenceBiasLogitsProcessor(
                [[[A, B, 20], -4.0], [[B, A, C, 21], 3.0], [[C, A, B, 22], -2.5], [[B], 1.0]]
            )
        ]
    ),
    "prefix_allowed_tokens_fn": Case(
        lambda: [lp.PrefixConstrainedLogitsProcessor(_window_allowed, num_beams=1)]
    ),
    "watermark_lefthash": Case(
        lambda: [lp.WatermarkLogitsProcessor(V, "cpu", bias=3.0)], last_only=True
    ),
    "watermark_selfhash": Case(
        lambda: [lp.WatermarkLogitsProcessor(V, "cpu", seeding_scheme="selfhash", context_width=2)],
        last_only=True,
    ),
    "user_processor": Case(lambda: [_RecencyPenalty()]),
    "combination": Case(
        lambda: [
            lp.RepetitionPenaltyLogitsProcessor(1.5),
            lp.NoRepeatNGramLogitsProcessor(3),
            lp.NoBadWordsLogitsProcessor([[B, A, C, 21]], 1),
            lp.PrefixConstrainedLogitsProcessor(_window_allowed, num_beams=1),
            _RecencyPenalty(),
            lp.TemperatureLogitsWarper(0.7),
        ]
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_row_is_processed_with_its_own_path_in_order(name: str) -> None:
    """Every row of a three-level tree (the root's and all 39 nodes') equals the
    processors run on that row's own prefix alone — the committed tokens, then the path's
    tokens from the root down — for a processor that reads the prefix's order; and that
    order matters: for each depth from 2 on and each other order of the path's tokens the
    processor can see (reversed or any permutation; the watermark sees the last token
    only), some node's row would differ."""
    case = CASES[name]
    logits = _logits(TREE.num_nodes + 1, V)
    got = TreeProcessor(case.processors(), None).process(TREE, logits, _state(COMMITTED))

    def row_after(path: list[int], row: int) -> torch.Tensor:
        return _alone(case.processors(), COMMITTED + path, logits[row])

    assert torch.equal(got[0], row_after([], 0))
    for node in range(TREE.num_nodes):
        assert torch.equal(got[node + 1], row_after(TREE.path_tokens(node), node + 1)), node
    assert _order_changes_a_row(row_after, TREE, case.last_only) == []


def test_each_row_takes_the_grammar_state_after_its_own_path_in_order() -> None:
    """Under a regex, every row of a three-level tree (built by ``processing_for``) equals
    the row :class:`GrammarLogitsProcessor` gives for that row's own prefix alone, as in
    plain ``generate`` (the committed tokens, then the path's tokens in order); and the
    order matters: for each depth from 2 on and each other order of the path's tokens,
    some node's allowed tokens would differ."""
    tokenizer = ByteTokenizer()
    a, b, c = (ord(ch) + 2 for ch in "abc")
    # every order of a, b, c (two or three letters) continues with a letter of its own
    words = [
        "".join(order) + chr(ord("d") + k)
        for k, order in enumerate(
            [*itertools.permutations("abc", 2), *itertools.permutations("abc", 3)]
        )
    ]
    regex = "|".join(words)
    tree = DraftTree.from_paths([[a, b, c], [a, c, b], [b, a, c], [b, c, a], [c, a, b], [c, b, a]])
    committed = [0]
    processing = processing_for(
        GenerationParams(regex=regex),
        prompt_length=len(committed),
        tokenizer=tokenizer,
        eos_token_ids=[1],
        vocab_size=258,
    )
    assert processing is not None
    logits = _logits(tree.num_nodes + 1, 258)
    got = processing.process(tree, logits, _state(committed))

    def row_after(path: list[int], row: int) -> torch.Tensor:
        plain = GrammarLogitsProcessor(tokenizer, vocab_size=258, eos_token_ids=[1], regex=regex)
        plain(torch.tensor([committed]), logits[row : row + 1])  # its first call: the prompt
        return plain(torch.tensor([committed + path]), logits[row : row + 1])[0]

    assert torch.equal(got[0], row_after([], 0))
    for node in range(tree.num_nodes):
        assert torch.equal(got[node + 1], row_after(tree.path_tokens(node), node + 1)), node
    assert _order_changes_a_row(row_after, tree, last_only=False) == []
