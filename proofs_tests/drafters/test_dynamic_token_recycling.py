"""Tests of verispec/drafters/dynamic_token_recycling.py: values, optimal trees, calibration,
fusion, the budget rule inside the drafter, and exactness (greedy and sampled)."""

from __future__ import annotations

import math

import pytest
import torch
from greedy_runs import remembered_greedy_run
from scipy.stats import chisquare

from verispec import SpeculativeDecoder
from verispec.core import (
    DecodeState,
    DraftTree,
    SamplingParams,
    StepOutcome,
    Verdict,
)
from verispec.drafters.budget import LatencyTable
from verispec.drafters.dynamic_token_recycling import (
    DynamicTokenRecycling,
    _decode,
    _encode,
    code_to_score,
    score_to_code,
)
from verispec.drafters.prompt_lookup import PromptLookup
from verispec.drafters.suffix import SuffixDrafter
from verispec.drafters.suffix_corpus import SuffixCorpus
from verispec.drafters.token_recycling import row_topk_scored
from verispec.errors import ConfigError, IncompatibleModelsError
from verispec.kernels.cpu import topk as cpu_topk
from verispec.models.markov import MarkovModel
from verispec.verifiers._rules import verdict_distribution
from verispec.verifiers.recursive import RecursiveRejection


def _state(tokens: list[int], max_nodes: int = 1 << 30, seed: int = 0) -> DecodeState:
    return DecodeState(
        tokens=list(tokens),
        prompt_length=len(tokens),
        sampling=SamplingParams(),
        generator=torch.Generator().manual_seed(seed),
        max_nodes=max_nodes,
    )


def _fill(drafter: DynamicTokenRecycling, vocab: int, seed: int) -> None:
    """A random scored matrix: every row known, distinct ids, descending scores."""
    generator = torch.Generator().manual_seed(seed)
    assert drafter._ids is not None and drafter._codes is not None
    k = drafter.k
    ids = torch.stack([torch.randperm(vocab, generator=generator)[:k] for _ in range(vocab)])
    scores = torch.rand(vocab, k, generator=generator).sort(dim=1, descending=True).values
    drafter._ids[:] = torch.from_numpy(_encode(ids, drafter._ids.dtype))
    drafter._codes[:] = score_to_code(scores.clamp(min=0.01))


# -- the value of a node -------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_path_product_is_the_exact_acceptance_probability(seed: int) -> None:
    """For deterministic, distinct siblings, the verifier accepts a node with probability equal
    to the product of the target probabilities of the tokens on its path (exact enumeration of
    the verifier's law, to 1e-12), so the expected accepted length is the sum of the values."""
    generator = torch.Generator().manual_seed(seed)
    vocab = 5
    parents = [-1, -1, -1, 0, 0, 1, 3, 3, 6]
    tokens = []
    for i, parent in enumerate(parents):  # distinct siblings
        used = {tokens[j] for j in range(i) if parents[j] == parent}
        tokens.append(next(t for t in torch.randperm(vocab, generator=generator).tolist()
                           if t not in used))  # fmt: skip
    tree = DraftTree.from_parents(tokens, parents)
    target = torch.softmax(2 * torch.randn(len(parents) + 1, vocab, generator=generator,
                                           dtype=torch.float64), dim=-1)  # fmt: skip
    law = verdict_distribution(tree, target)
    for node in range(tree.num_nodes):
        exact = sum(p for (path, _), p in law.items() if node in path)
        value = 1.0
        for n in tree.path_to(node):
            row = parents[n] + 1
            value *= float(target[row, tokens[n]])
        assert math.isclose(exact, value, rel_tol=0, abs_tol=1e-12)
    expected_len = sum(p * len(path) for (path, _), p in law.items())
    assert math.isclose(expected_len, sum(
        math.prod(float(target[parents[n] + 1, tokens[n]]) for n in tree.path_to(i))
        for i in range(tree.num_nodes)), abs_tol=1e-12)  # fmt: skip


# -- the tree is the best connected tree for its budget ------------------------------------


def _all_values(drafter: DynamicTokenRecycling, root: int, depth: int) -> dict[tuple, float]:
    """Value of every node of the full expansion to ``depth`` (brute force, no beam)."""
    ids, scores = drafter.adjacency()  # type: ignore[misc]
    rates = drafter.tr_calibration.rates()
    out: dict[tuple, float] = {}
    frontier: list[tuple[tuple, int, float]] = [((), root, 1.0)]
    for d in range(1, depth + 1):
        nxt = []
        for path, token, value in frontier:
            for j in range(drafter.k):
                if scores[token, j] <= 0:
                    continue
                cell = drafter.tr_calibration.cells(torch.tensor(d), scores[token, j])
                v = value * float(rates[cell])
                child = int(ids[token, j])
                out[(*path, child)] = v
                nxt.append(((*path, child), child, v))
        frontier = nxt
    return out


@pytest.mark.parametrize(("budget", "seed"), [(1, 0), (4, 1), (7, 2), (12, 3), (20, 4)])
def test_tree_is_the_top_budget_nodes_of_the_full_expansion(budget: int, seed: int) -> None:
    """The beam finds exactly the `budget` most valuable nodes of the full K-ary expansion and
    they form a connected tree; so no connected tree of that size has a larger value sum (the
    expected accepted length), since no set of that size does."""
    vocab, k = 6, 3
    drafter = DynamicTokenRecycling(budget, k=k, fusion=False, max_depth=5, vocab_size=vocab)
    _fill(drafter, vocab, seed)
    tree = drafter.propose(_state([0, 2]))
    got = {tuple(tree.path_tokens(i)): float(drafter.last_values[i]) for i in range(len(tree))}
    full = _all_values(drafter, 2, 5)
    best = sorted(full.values(), reverse=True)[:budget]
    assert len(got) == budget
    assert sorted(got.values(), reverse=True) == pytest.approx(best, rel=1e-12)
    for path, value in got.items():
        assert full[path] == pytest.approx(value, rel=1e-12)
        assert len(path) == 1 or path[:-1] in got  # connected


def test_siblings_are_in_value_order_and_parents_come_first() -> None:
    """Nodes are sorted by depth then value; each node's value is below its parent's."""
    drafter = DynamicTokenRecycling(16, k=4, fusion=False, vocab_size=20)
    _fill(drafter, 20, 5)
    tree = drafter.propose(_state([3]))
    values = drafter.last_values.tolist()
    for i, parent in enumerate(tree.parents.tolist()):
        assert parent < i
        if parent >= 0:
            assert values[i] < values[parent]
    for kids in tree.children:
        assert [values[c] for c in kids] == sorted((values[c] for c in kids), reverse=True)


def test_tree_does_not_depend_on_the_steps_coins() -> None:
    """Two proposals from the same state with different generators give the same tree."""
    drafter = DynamicTokenRecycling(16, k=4, vocab_size=20)
    _fill(drafter, 20, 6)
    context = [1, 2, 3, 1, 2, 3, 1, 2]
    drafter.begin(_state(context))
    a = drafter.propose(_state(context, seed=1))
    b = drafter.propose(_state(context, seed=999))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)


def test_unknown_root_and_zero_budget_give_the_empty_tree() -> None:
    """Before anything is recycled (and with no context match) the tree is only the root."""
    assert DynamicTokenRecycling(8, fusion=False).propose(_state([1, 2])).num_nodes == 0
    drafter = DynamicTokenRecycling(0, k=4, vocab_size=20)
    _fill(drafter, 20, 0)
    assert drafter.propose(_state([4])).num_nodes == 0
    drafter = DynamicTokenRecycling(8, k=4, vocab_size=20)
    _fill(drafter, 20, 0)
    assert drafter.propose(_state([4], max_nodes=3)).num_nodes == 3


# -- the scored matrix and its update ------------------------------------------------------


def _outcome(tree: DraftTree, logits: torch.Tensor, root: int, verdict: Verdict) -> StepOutcome:
    committed = verdict.committed_tokens(tree)
    return StepOutcome(tree, logits, verdict, _state([7, root, *committed]))


def test_update_writes_topk_ids_and_scores() -> None:
    """Every scored row gets the target's top-K ids and their softmax probabilities (small V)."""
    vocab, k = 10, 3
    drafter = DynamicTokenRecycling(4, k=k, fusion=False, vocab_size=vocab)
    tree = DraftTree.from_parents([1, 2], [-1, 0])
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(3))
    drafter.observe(_outcome(tree, logits, root=5, verdict=Verdict((), 4)))
    ids, scores = drafter.adjacency()  # type: ignore[misc]
    probs = torch.softmax(logits, -1)
    for row, token in enumerate([5, 1, 2]):
        top = torch.topk(logits[row], k)
        assert ids[token, :k].tolist() == top.indices.tolist()
        assert torch.allclose(scores[token, :k], probs[row, top.indices], rtol=1 / 30)
    assert (scores[[0, 3, 4, 6]] == 0).all()


@pytest.mark.parametrize("c_kernel", [True, False])
def test_scores_bound_the_true_probability_at_large_vocabulary(
    c_kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At V = 49,152 the block-max score is between the true probability and 64 times it,
    with the C top-k (verispec.kernels.cpu.topk) and with its torch fallback."""
    if not c_kernel:
        monkeypatch.setattr(cpu_topk, "topk_rows", lambda *args, **kwargs: None)
    logits = 3 * torch.randn(5, 49152, generator=torch.Generator().manual_seed(0))
    ids, scores = row_topk_scored(logits, 8)
    probs = torch.softmax(logits, -1).gather(1, ids)
    assert (scores >= probs * (1 - 1e-5)).all() and (scores <= 64 * probs * (1 + 1e-5)).all()


def test_state_is_compact() -> None:
    """int16 ids (offset) plus uint8 score codes: 49,152 x 8 x 3 bytes = 1.125 MiB; int32 ids
    above V = 65,536."""
    assert DynamicTokenRecycling(vocab_size=49152).state_bytes == 49152 * 8 * 3 == 1_179_648
    assert DynamicTokenRecycling(vocab_size=70000).state_bytes == 70000 * 8 * 5
    ids = torch.tensor([0, 1, 32767, 32768, 49151, 65535])
    assert _decode(torch.from_numpy(_encode(ids, torch.int16))).tolist() == ids.tolist()
    scores = torch.tensor([1.0, 0.5, 0.01, 1e-5, 1e-12])
    back = code_to_score(score_to_code(scores))
    assert torch.allclose(back[:4], scores[:4], rtol=1 / 31)  # steps of 1/16 in log
    assert back[4] > 0 and score_to_code(scores).min() == 1  # tiny scores stay known
    assert code_to_score(torch.tensor([0], dtype=torch.uint8)).item() == 0


def test_calibration_counts_only_nodes_whose_parent_was_accepted() -> None:
    """A try is a node whose parent row was accepted; a hit an accepted node."""
    drafter = DynamicTokenRecycling(8, k=2, fusion=False, decay=1.0, vocab_size=6)
    assert drafter._ids is not None and drafter._codes is not None
    drafter._ids[:] = torch.from_numpy(_encode(torch.tensor([[1, 2]] * 6), torch.int16))
    drafter._codes[:] = score_to_code(torch.tensor([[0.97, 0.01]] * 6))
    tree = drafter.propose(_state([0]))
    # nodes by depth: 1 (0.97), 2 (0.01) at depth 1; below 1: 1, 2 ...
    accepted = (0,)  # node 0 (token 1) accepted, then rejected below it
    logits = torch.zeros(tree.num_nodes + 1, 6)
    drafter.observe(_outcome(tree, logits, root=0, verdict=Verdict(accepted, 5)))
    tries = drafter.tr_calibration.tries
    hits = drafter.tr_calibration.hits
    kids_of_root = len(tree.children[0])
    kids_of_node0 = len(tree.children[1])
    assert float(tries[0].sum()) == kids_of_root
    assert float(hits[0].sum()) == 1
    assert float(tries[1].sum()) == kids_of_node0
    assert float(hits[1].sum()) == 0
    assert float(tries[2:].sum()) == 0  # grandchildren of a rejected row: not tried


def test_calibration_moves_the_estimate_toward_observed_rates() -> None:
    """A bucket that is never accepted sees its rate fall below its prior."""
    drafter = DynamicTokenRecycling(8, k=2, fusion=False, vocab_size=6)
    cell = drafter.tr_calibration.cells(torch.tensor(1), torch.tensor(0.97))
    before = float(drafter.tr_calibration.rates()[cell])
    for _ in range(20):
        drafter.tr_calibration.update(cell.reshape(1), torch.tensor([True]), torch.tensor([False]))
    assert float(drafter.tr_calibration.rates()[cell]) < 0.3 * before


# -- fusion with prompt lookup -------------------------------------------------------------


def test_fusion_adds_context_continuations_and_merges_shared_paths() -> None:
    """With an empty matrix the tree is the prompt-lookup trie; a path known to both sources
    appears once, with the larger of its two values."""
    context = [4, 7, 8, 9, 1, 4, 7, 8]  # suffix (4, 7, 8) was followed by 9 1 4 7 8
    lone = DynamicTokenRecycling(5, k=2, vocab_size=12, prompt_lookup=PromptLookup(max_ngram=3))
    lone.begin(_state(context))
    tree = lone.propose(_state(context))
    assert [tree.path_tokens(i) for i in range(len(tree))] == [
        [9],
        [9, 1],
        [9, 1, 4],
        [9, 1, 4, 7],
        [9, 1, 4, 7, 8],
    ]
    both = DynamicTokenRecycling(5, k=2, vocab_size=12, prompt_lookup=PromptLookup(max_ngram=3))
    assert both._ids is not None and both._codes is not None
    both._ids[8] = torch.from_numpy(_encode(torch.tensor([9, 3]), torch.int16))
    both._codes[8] = score_to_code(torch.tensor([0.9, 0.05]))
    both.begin(_state(context))
    tree = both.propose(_state(context))
    paths = [tuple(tree.path_tokens(i)) for i in range(len(tree))]
    assert len(paths) == len(set(paths))
    assert paths.count((9,)) == 1
    solo = DynamicTokenRecycling(5, k=2, fusion=False, vocab_size=12)
    solo._ids[8], solo._codes[8] = both._ids[8], both._codes[8]  # type: ignore[index]
    solo.propose(_state(context))
    v_tr = float(solo.last_values[0])
    v_pld = float(lone.last_values[0])
    assert float(both.last_values[paths.index((9,))]) == pytest.approx(max(v_tr, v_pld))


# -- fusion with suffix matches ---------------------------------------------------------------


def test_suffix_fusion_adds_corpus_continuations_in_place_of_prompt_lookup() -> None:
    """With suffix=True and an empty matrix the tree is the suffix candidates, including a
    continuation only the corpus knows; prompt lookup is not consulted; remember() feeds
    the corpus and reset() empties it."""
    corpus = SuffixCorpus()
    drafter = DynamicTokenRecycling(
        4, k=2, vocab_size=50, suffix=True, suffix_drafter=SuffixDrafter(corpus=corpus)
    )
    drafter.remember([30, 31, 32, 33, 34])
    context = [5, 6, 7, 30, 31]
    drafter.begin(_state(context))
    tree = drafter.propose(_state(context))
    assert [tree.path_tokens(i) for i in range(len(tree))] == [
        [32], [32, 33], [32, 33, 34]
    ]  # fmt: skip
    assert drafter.prompt_lookup.index.tokens == []  # prompt lookup never indexed the context
    drafter.reset()
    assert corpus.num_tokens == 0


def test_suffix_fusion_values_a_shared_path_by_agreement() -> None:
    """A path that both the matrix and the suffix match propose is valued with the shared
    calibrations, a path only one proposes with that source's exclusive calibration."""
    context = [4, 7, 8, 9, 1, 4, 7, 8]  # the context continues (4, 7, 8) with 9 1 4 7 8
    drafter = DynamicTokenRecycling(6, k=2, vocab_size=12, suffix=True)
    assert drafter._ids is not None and drafter._codes is not None
    drafter._ids[8] = torch.from_numpy(_encode(torch.tensor([9, 3]), torch.int16))
    drafter._codes[8] = score_to_code(torch.tensor([0.9, 0.05]))
    drafter.begin(_state(context))
    tree = drafter.propose(_state(context))
    paths = [tuple(tree.path_tokens(i)) for i in range(len(tree))]
    cells = drafter._last[1]  # type: ignore[index]  # one list of cells per tree node
    shared, alone = paths.index((9,)), paths.index((3,))
    assert sum(c >= 0 for c in cells[shared]) == 2 and sum(c >= 0 for c in cells[alone]) == 1
    tr_shared = float(drafter._shared[0].rates()[cells[shared][0]])
    suffix_shared = float(drafter._shared[2].rates()[cells[shared][2]])
    assert float(drafter.last_values[shared]) == pytest.approx(max(tr_shared, suffix_shared))
    tr_alone = float(drafter.tr_calibration.rates()[cells[alone][0]])
    assert float(drafter.last_values[alone]) == pytest.approx(tr_alone)


def test_suffix_drafter_needs_suffix_true() -> None:
    """A suffix_drafter passed without suffix=True is refused (it would be ignored)."""
    with pytest.raises(ConfigError, match="`suffix_drafter` is only used with `suffix=True`"):
        DynamicTokenRecycling(suffix_drafter=SuffixDrafter())


# -- the budget rule inside the drafter ----------------------------------------------------


def test_auto_budget_follows_the_latency_table() -> None:
    """budget='auto' sends every node when extra nodes are free, none when they are dear,
    and otherwise the prefix that maximises (1 + sum of values) / T(n)."""
    flat = LatencyTable([0, 64], [1.0, 1.0])
    steep = LatencyTable([0, 1, 64], [1.0, 100.0, 6400.0])
    for table, expect in ((flat, 10), (steep, 0)):
        drafter = DynamicTokenRecycling("auto", k=2, fusion=False, latency=table, max_budget=10,
                                        vocab_size=30)  # fmt: skip
        _fill(drafter, 30, 1)
        assert drafter.propose(_state([3])).num_nodes == expect
    mid = LatencyTable([0, 4, 64], [1.0, 1.2, 10.0])
    drafter = DynamicTokenRecycling("auto", k=2, fusion=False, latency=mid, max_budget=20,
                                    vocab_size=30)  # fmt: skip
    _fill(drafter, 30, 1)
    fixed = DynamicTokenRecycling(20, k=2, fusion=False, vocab_size=30)
    _fill(fixed, 30, 1)
    fixed.propose(_state([3]))
    values = fixed.last_values.sort(descending=True).values
    rate = [(1 + float(values[:n].sum())) / float(mid.at(n)) for n in range(21)]
    assert drafter.propose(_state([3])).num_nodes == max(range(21), key=lambda n: (rate[n], -n))


def test_auto_budget_narrows_the_beam_to_the_chosen_sizes() -> None:
    """After budget='auto' chooses no node, the next search is 8 wide (not max_budget), so a
    table that now makes every node free gets at most 8; it widens to 2 n + 8 from there
    back to max_budget, and reset() restores the full width."""
    steep = LatencyTable([0, 1, 64], [1.0, 100.0, 6400.0])
    drafter = DynamicTokenRecycling("auto", k=2, fusion=False, latency=steep, max_budget=40,
                                    vocab_size=30)  # fmt: skip
    _fill(drafter, 30, 1)
    assert drafter.propose(_state([3])).num_nodes == 0
    drafter.latency = LatencyTable([0, 64], [1.0, 1.0])  # nodes now free
    sizes = [drafter.propose(_state([3])).num_nodes for _ in range(4)]
    assert sizes[0] == 8 and sizes[1] == min(24, sizes[-1]) and sizes[-1] > 24
    drafter.latency = steep
    drafter.propose(_state([3]))
    drafter.reset()
    _fill(drafter, 30, 1)
    drafter.latency = LatencyTable([0, 64], [1.0, 1.0])
    assert drafter.propose(_state([3])).num_nodes > 8


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": -1}, "`budget`"),
        ({"budget": "big"}, "`budget`"),
        ({"k": 0}, "`k`"),
        ({"max_depth": 0}, "`max_depth`"),
        ({"decay": 0.0}, "`decay`"),
        ({"decay": "x"}, "`decay`"),
        ({"prior_strength": None}, "`prior_strength`"),
        ({"prior_strength": 0}, "`prior_strength`"),
        ({"fusion": "no"}, "`fusion`"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict, match: str) -> None:
    """Out-of-range settings raise ConfigError naming the argument."""
    with pytest.raises(ConfigError, match=match):
        DynamicTokenRecycling(**kwargs)


def test_auto_without_a_latency_table_is_refused_when_it_drafts() -> None:
    """``budget="auto"`` (the default) with no table given or bound: a clear error at the
    first ``propose`` naming the latency table, not a guessed tree size."""
    drafter = DynamicTokenRecycling(vocab_size=16)
    with pytest.raises(ConfigError, match="latency table"):
        drafter.propose(_state([3]))


def test_vocabulary_mismatch_and_reset() -> None:
    """A logits width unlike the matrix's is refused; reset() forgets matrix and calibration."""
    drafter = DynamicTokenRecycling(4, k=2, fusion=False, vocab_size=10)
    _fill(drafter, 10, 0)
    assert drafter.propose(_state([1])).num_nodes == 4
    with pytest.raises(IncompatibleModelsError, match="reset_vocabulary"):
        drafter.observe(_outcome(DraftTree.empty(), torch.zeros(1, 11), 1, Verdict((), 2)))
    drafter.reset()
    assert drafter.propose(_state([1])).num_nodes == 0


# -- exactness end to end ------------------------------------------------------------------


def _prompts(count: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(11)
    out = []
    for _ in range(count):
        piece = torch.randint(vocab, (4,), generator=generator).tolist()
        out.append(piece + torch.randint(vocab, (3,), generator=generator).tolist() + piece[:2])
    return out


@pytest.mark.parametrize("variant", ["8", "16-nofusion", "auto", "16-suffix"])
def test_greedy_token_identical_on_tiny_llama(tiny, greedy_reference, variant: str) -> None:
    """DTR + Greedy produces exactly plain greedy's tokens for 10 prompts per variant (with
    suffix fusion, each answer is remembered in the corpus for the next prompts)."""
    if variant == "16-suffix":
        drafter = DynamicTokenRecycling(16, suffix=True)
    elif variant == "auto":
        table = LatencyTable([0, 8, 64], [1.0, 1.1, 3.0])
        drafter = DynamicTokenRecycling("auto", latency=table)
    elif variant == "8":
        drafter = DynamicTokenRecycling(8)
    else:
        drafter = DynamicTokenRecycling(16, fusion=False)
    accepted = remembered_greedy_run(tiny, drafter, _prompts(10, tiny.vocab_size), greedy_reference)
    assert accepted > 0


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampled_sequences_follow_the_target_law(single_thread, temperature: float) -> None:
    """With recursive rejection sampling, the first three tokens generated with DTR (fusion on,
    matrix and calibration carried across generations) follow the Markov target's exact joint
    law: chi-square over 27 sequences, 1,000 seeded generations, alpha = 1e-3; and drafts are
    really accepted."""
    generator = torch.Generator().manual_seed(2024)
    target = MarkovModel(1.5 * torch.randn(3, 3, generator=generator, dtype=torch.float64))
    drafter = DynamicTokenRecycling(6, k=3)
    decoder = SpeculativeDecoder(target, drafter, RecursiveRejection(torch.float64))
    prompt = [0, 2, 0, 2]
    counts = torch.zeros(27)
    accepted = 0
    for seed in range(1000):
        result = decoder.generate(prompt, max_new_tokens=3, temperature=temperature, seed=seed)
        a, b, c = result.tokens[:3]
        counts[9 * a + 3 * b + c] += 1
        accepted += sum(s.accepted for s in result.steps)
    law = target.sequence_probs(prompt, 3, SamplingParams(temperature=temperature)).reshape(-1)
    expected = law * 1000
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    if float(exp[-1]) == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue > 1e-3
    assert accepted > 300
