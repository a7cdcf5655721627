"""Tests of verispec/drafters/token_recycling.py: expansion, update rule, state, exactness."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from verispec import SpeculativeDecoder
from verispec.core import (
    DecodeState,
    DraftTree,
    GenerationParams,
    SamplingParams,
    StepOutcome,
    Verdict,
)
from verispec.drafters import Autoregressive, TokenRecycling
from verispec.drafters.templates import TEMPLATES
from verispec.drafters.token_recycling import row_topk
from verispec.errors import ConfigError, IncompatibleModelsError, TreeStructureError
from verispec.kernels.cpu import topk as cpu_topk
from verispec.kernels.reference import (
    expand_template,
    last_occurrence_mask,
    last_rows,
    update_adjacency,
)
from verispec.verifiers import Greedy

SMALL = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def _state(tokens: list[int]) -> DecodeState:
    return DecodeState(
        tokens=list(tokens),
        prompt_length=1,
        sampling=SamplingParams(),
        generator=torch.Generator().manual_seed(0),
    )


def _drafter_with(rows: dict[int, list[int]], vocab: int = 10, k: int = 3, **kw) -> TokenRecycling:
    drafter = TokenRecycling(SMALL, k=k, vocab_size=vocab, **kw)
    assert drafter.adjacency is not None
    for token, row in rows.items():
        drafter.adjacency[token] = torch.tensor(row, dtype=torch.int32)
    return drafter


def test_bfs_expansion_of_a_hand_built_matrix() -> None:
    """Node in slot j below token t carries adj[t, j], level by level from the root."""
    drafter = _drafter_with({5: [1, 2, 3], 1: [4, 6, 7], 2: [8, 9, 0], 4: [3, 3, 3]})
    tree = drafter.propose(_state([9, 5]))
    # nodes: [0]=1, [1]=2, [2]=3, [0,0]=4, [0,1]=6, [1,0]=8, [0,0,0]=3
    assert tree.tokens.tolist() == [1, 2, 3, 4, 6, 8, 3]
    assert tree.parents.tolist() == [-1, -1, -1, 0, 0, 1, 3]
    assert all(law is None or law.__class__.__name__ == "Deterministic" for law in tree.laws)
    assert tree.laws[0] is not None and tree.laws[3] is None  # node 2 (token 3) is a leaf


def test_unknown_slots_are_pruned_with_their_subtrees() -> None:
    """With prune_unknown, a slot whose row was never written is left out with its subtree."""
    drafter = _drafter_with({5: [1, 2, 3], 2: [8, 9, 0]})  # row 1 unknown
    tree = drafter.propose(_state([5]))
    # kept: [0]=1, [1]=2, [2]=3, [1,0]=8 ; dropped: [0,0], [0,1], [0,0,0] (below unknown row 1)
    assert tree.tokens.tolist() == [1, 2, 3, 8]
    assert tree.parents.tolist() == [-1, -1, -1, 1]
    assert tree.path_tokens(3) == [2, 8]


def test_unknown_root_row_gives_the_empty_tree() -> None:
    """Before anything is recycled for the root token, the drafter sends only the root."""
    assert TokenRecycling("8").propose(_state([3])).num_nodes == 0
    assert _drafter_with({}).propose(_state([4])).num_nodes == 0


def test_paper_cold_start_reads_unknown_as_token_zero() -> None:
    """With prune_unknown=False the full template is sent, unknown slots as token 0."""
    drafter = _drafter_with({5: [1, 2, 3]}, prune_unknown=False)
    tree = drafter.propose(_state([5]))
    assert tree.num_nodes == len(SMALL)
    assert tree.tokens.tolist() == [1, 2, 3, 0, 0, 0, 0]
    cold = TokenRecycling("8", prune_unknown=False).propose(_state([5]))
    assert cold.tokens.tolist() == [0] * 8


def test_expand_template_marks_descendants_of_unknown_rows() -> None:
    """expand_template returns -1 for an unknown slot and for every node below it."""
    drafter = _drafter_with({5: [1, -1, 3], 1: [4, 6, 7]})
    t = drafter.template
    rows = expand_template(drafter.adjacency, 5, t.parents, t.slots, t.level_starts)
    assert rows.tolist() == [5, 1, -1, 3, 4, 6, -1, -1]


def _outcome(tree: DraftTree, logits: torch.Tensor, root: int, verdict: Verdict) -> StepOutcome:
    committed = verdict.committed_tokens(tree)
    return StepOutcome(tree, logits, verdict, _state([7, root, *committed]))


def test_update_overwrites_every_scored_row_with_the_targets_topk() -> None:
    """After a step, adj[token at row r] == top-K of target_logits[r] for root and every node."""
    vocab, k = 10, 3
    drafter = TokenRecycling(SMALL, k=k, vocab_size=vocab)
    tree = DraftTree.from_parents([1, 2, 3], [-1, -1, 0])
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1))
    drafter.observe(_outcome(tree, logits, root=5, verdict=Verdict((0,), 4)))
    adj = drafter.adjacency
    assert adj is not None
    for row, token in enumerate([5, 1, 2, 3]):
        assert adj[token].tolist() == torch.topk(logits[row], k).indices.tolist()
    untouched = [t for t in range(vocab) if t not in (5, 1, 2, 3)]
    assert (adj[untouched] == -1).all()  # the extra token 4 was not scored: its row is unknown


def test_update_of_a_token_scored_twice_keeps_its_last_position() -> None:
    """A token at several scored positions gets the top-K of its last row (root, then BFS order)."""
    vocab, k = 10, 2
    drafter = TokenRecycling([[0], [1]], k=k, vocab_size=vocab)
    # root 5; node 0 = 5 again, node 1 = 2, node 2 = 2 again (a child of node 0)
    tree = DraftTree.from_parents([5, 2, 2], [-1, -1, 0])
    logits = torch.full((4, vocab), -1.0)
    for row, (a, b) in enumerate([(1, 2), (3, 4), (6, 7), (8, 9)]):
        logits[row, a], logits[row, b] = 2.0, 1.0
    drafter.observe(_outcome(tree, logits, root=5, verdict=Verdict((), 0)))
    adj = drafter.adjacency
    assert adj is not None
    assert adj[5].tolist() == [3, 4]  # row 1 (node 0) beats row 0 (the root)
    assert adj[2].tolist() == [8, 9]  # row 3 (node 2) beats row 2 (node 1)


def test_last_occurrence_mask() -> None:
    """The mask keeps exactly the last position of each distinct token."""
    tokens = torch.tensor([4, 1, 4, 2, 1, 4])
    assert last_occurrence_mask(tokens).tolist() == [False, False, False, True, True, True]


@given(st.lists(st.integers(0, 5), min_size=1, max_size=12))
def test_last_rows_are_the_mask_positions(tokens: list[int]) -> None:
    """The host form (a drafter's few rows) keeps the rows the tensor mask keeps."""
    mask = last_occurrence_mask(torch.tensor(tokens))
    assert last_rows(tokens) == mask.nonzero().squeeze(1).tolist()


@given(st.lists(st.integers(0, 5), min_size=1, max_size=12), st.integers(0, 2**31 - 1))
def test_update_adjacency_is_the_writes_in_row_order(tokens: list[int], seed: int) -> None:
    """The update leaves the matrix as writing each row's top-K in row order would (a token
    scored at several rows keeps its last row's), on a strided view of the matrix as the
    drafter passes it."""
    generator = torch.Generator().manual_seed(seed)
    top = torch.randint(0, 1000, (len(tokens), 3), generator=generator)
    adjacency = torch.full((6, 4), -1, dtype=torch.int32)
    update_adjacency(adjacency[:, :3], torch.tensor(tokens), top)
    want = torch.full((6, 4), -1, dtype=torch.int32)
    for row, token in enumerate(tokens):
        want[token, :3] = top[row].to(torch.int32)
    assert torch.equal(adjacency, want)


@pytest.mark.parametrize("c_kernel", [True, False])
@pytest.mark.parametrize("vocab", [2, 7, 4096, 49152])
def test_row_topk_matches_torch_topk(
    vocab: int, c_kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """row_topk returns the same top-K values as torch.topk, and indices that hold them,
    with the C kernel (verispec.kernels.cpu.topk) and with its torch fallback."""
    if not c_kernel:
        monkeypatch.setattr(cpu_topk, "topk_rows", lambda *args, **kwargs: None)
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn(81, vocab, generator=generator)
    logits[3] = 0.0  # a row of ties
    logits[5, :50] = 7.0  # ties at the top
    k = min(8, vocab)
    values, indices = row_topk(logits, k)
    ref = torch.topk(logits, k, dim=-1).values
    assert torch.equal(values, ref)
    assert torch.equal(logits.gather(1, indices), ref)
    assert all(len(set(r)) == k for r in indices.tolist())


def test_siblings_are_always_distinct() -> None:
    """Rows are top-K lists of distinct ids, so no two siblings carry the same token."""
    vocab = 50
    drafter = TokenRecycling("2.2.2", vocab_size=vocab)
    generator = torch.Generator().manual_seed(3)
    root = 0
    for _ in range(30):
        tree = drafter.propose(_state([root]))
        for kids in tree.children:
            toks = [int(tree.tokens[c]) for c in kids]
            assert len(toks) == len(set(toks))
        logits = torch.randn(tree.num_nodes + 1, vocab, generator=generator)
        extra = int(torch.randint(vocab, (1,), generator=generator))
        drafter.observe(_outcome(tree, logits, root=root, verdict=Verdict((), extra)))
        root = extra
    assert drafter.propose(_state([root])).num_nodes > 0


def test_state_bytes_and_dtype() -> None:
    """The matrix is int32 (V, K): 49,152 x 8 x 4 bytes = 1.5 MiB for SmolLM2's vocabulary."""
    drafter = TokenRecycling(vocab_size=49152)
    assert drafter.adjacency is not None
    assert drafter.adjacency.dtype == torch.int32
    assert drafter.state_bytes == 49152 * 8 * 4 == 1_572_864


def test_reset_forgets_and_vocabulary_mismatch_is_refused() -> None:
    """reset() makes every row unknown; a logits width unlike the matrix's raises an error."""
    drafter = _drafter_with({5: [1, 2, 3]})
    assert drafter.propose(_state([5])).num_nodes > 0
    drafter.reset()
    assert drafter.propose(_state([5])).num_nodes == 0
    tree = DraftTree.empty()
    with pytest.raises(IncompatibleModelsError, match="reset_vocabulary"):
        drafter.observe(_outcome(tree, torch.zeros(1, 11), root=5, verdict=Verdict((), 1)))
    drafter.reset_vocabulary(11)
    drafter.observe(_outcome(tree, torch.zeros(1, 11), root=5, verdict=Verdict((), 1)))


@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_bad_k_is_refused(k: object) -> None:
    """k must be a positive integer."""
    with pytest.raises(ConfigError, match="`k`"):
        TokenRecycling("8", k=k)  # type: ignore[arg-type]


def test_bad_template_is_refused_at_construction() -> None:
    """An invalid user template fails when the drafter is built, naming the path."""
    with pytest.raises(TreeStructureError, match=r"\[1, 1\] has no parent"):
        TokenRecycling([[0], [1, 1]])


# -- end to end on the tiny model ---------------------------------------------------------


def _prompts(count: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(123)
    lengths = torch.randint(1, 12, (count,), generator=generator).tolist()
    return [torch.randint(vocab, (n,), generator=generator).tolist() for n in lengths]


@pytest.mark.parametrize("template", [*sorted(TEMPLATES), "paper-cold-start"])
def test_greedy_token_identical_on_tiny_llama(tiny, greedy_reference, template: str) -> None:
    """TR + Greedy produces exactly plain greedy's tokens for 12 random prompts per template."""
    if template == "paper-cold-start":
        drafter = TokenRecycling("2.2.2", prune_unknown=False)
    else:
        drafter = TokenRecycling(template)
    decoder = SpeculativeDecoder(tiny, drafter, Greedy())
    config = GenerationParams(max_new_tokens=40, eos_token_ids=())
    accepted = 0
    for prompt in _prompts(12, tiny.vocab_size):
        result = decoder.generate(prompt, config)
        assert result.tokens == greedy_reference(prompt, 40)
        accepted += sum(s.accepted for s in result.steps)
    assert accepted > 0  # the drafts were really used, not all rejected


def test_autoregressive_drafter_is_plain_greedy(tiny, greedy_reference) -> None:
    """The empty-tree baseline commits one token per step and matches plain greedy."""
    decoder = SpeculativeDecoder(tiny, Autoregressive(), Greedy())
    prompt = [3, 9, 27]
    result = decoder.generate(prompt, max_new_tokens=20, eos_token_ids=())
    assert result.tokens == greedy_reference(prompt, 20)
    assert result.num_steps == 20 and result.mean_tree_size == 0


def test_matrix_persists_across_generate_calls(tiny) -> None:
    """A second generation starts from the first one's matrix (hot start), unless reset."""
    drafter = TokenRecycling("16")
    decoder = SpeculativeDecoder(tiny, drafter, Greedy())
    decoder.generate([5, 6, 7], max_new_tokens=30, eos_token_ids=())
    assert drafter.adjacency is not None
    snapshot = drafter.adjacency.clone()
    assert (snapshot >= 0).any()
    drafter.begin(_state([1, 2]))
    assert torch.equal(drafter.adjacency, snapshot)
    first_tree = decoder.drafter.propose(_state([5, 6, 7]))
    assert first_tree.num_nodes > 0
    drafter.reset()
    assert (drafter.adjacency == -1).all()
