"""DySpec: greedy optimality by enumeration, threshold = fixed size, draw order, laws."""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable

import pytest
import torch
from scipy.stats import chi2

from verispec.core import DETERMINISTIC, DecodeState, SamplingParams, WithoutReplacement
from verispec.core.tree import DraftTree
from verispec.drafters.dyspec import DySpec
from verispec.errors import ConfigError
from verispec.models.markov import MarkovModel

PROMPT = [1, 0]


def _state(temperature: float, seed: int = 0, tokens: list[int] = PROMPT) -> DecodeState:
    return DecodeState(
        tokens=list(tokens),
        prompt_length=len(tokens),
        sampling=SamplingParams(temperature=temperature),
        generator=torch.Generator().manual_seed(seed),
    )


def _propose(drafter: DySpec, state: DecodeState) -> DraftTree:
    drafter.begin(state)
    return drafter.propose(state)


def _draft_probs(draft: MarkovModel, path: tuple[int, ...]) -> list[float]:
    """The draft's plain softmax after PROMPT + path (temperature 1)."""
    return torch.softmax(draft.next_logits([*PROMPT, *path]), -1).tolist()


def _path_value(draft: MarkovModel, path: tuple[int, ...]) -> float:
    """Product of the draft probabilities along ``path``."""
    value = 1.0
    for depth in range(len(path)):
        value *= _draft_probs(draft, path[:depth])[path[depth]]
    return value


def _proxy(draft: MarkovModel, path: tuple[int, ...]) -> float:
    """Eq. 11's estimate for the node at ``path`` in the expected-value variant: the product
    of its ancestors' draft probabilities times one minus the mass of its earlier siblings,
    the tokens its parent's draft ranks above it (a top-choice draw takes those first)."""
    probs = _draft_probs(draft, path[:-1])
    earlier = sum(p for p in probs if p > probs[path[-1]])
    return _path_value(draft, path[:-1]) * (1.0 - earlier)


def _eq11_in_tree(draft: MarkovModel, tree: DraftTree) -> float:
    """Sum over nodes of the product, along the path, of each ancestor's (1 - mass of its
    earlier siblings in the tree) * R(token), R the residual it was drawn from, times the
    node's own (1 - mass of its earlier siblings in the tree)."""
    total = 0.0
    for node in range(tree.num_nodes):
        value = 1.0
        for a in tree.path_to(node):
            parent = int(tree.parents[a])
            probs = _draft_probs(draft, tuple(tree.path_tokens(parent)) if parent >= 0 else ())
            siblings = tree.children[parent + 1]
            earlier = sum(probs[int(tree.tokens[s])] for s in siblings[: siblings.index(a)])
            value *= 1.0 - earlier
            if a != node:
                value *= probs[int(tree.tokens[a])] / (1.0 - earlier)  # R(a)
        total += value
    return total


def _best_values_by_size(
    draft: MarkovModel, depth: int, max_nodes: int, weight: Callable[..., float]
) -> list[float]:
    """Max over every connected subtree containing the root, of the complete V-ary tree cut
    at ``depth``, of the sum of ``weight`` over its nodes, for each size 0..max_nodes
    (enumeration: each subtree is visited exactly once, by extending with a later frontier
    node)."""
    vocab = draft.vocab_size
    weights: dict[tuple[int, ...], float] = {}

    def children(path: tuple[int, ...]) -> list[tuple[int, ...]]:
        if len(path) >= depth:
            return []
        kids = [(*path, t) for t in range(vocab)]
        for kid in kids:
            if kid not in weights:
                weights[kid] = weight(draft, kid)
        return kids

    best = [-math.inf] * (max_nodes + 1)

    def extend(frontier: list[tuple[int, ...]], size: int, total: float) -> None:
        if total > best[size]:
            best[size] = total
        if size == max_nodes:
            return
        for i, node in enumerate(frontier):
            extend(frontier[i + 1 :] + children(node), size + 1, total + weights[node])

    extend(children(()), 0, 0.0)
    return best


@pytest.mark.parametrize(
    ("vocab", "order", "depth", "seed"),
    [(2, 1, 4, 0), (2, 2, 4, 1), (3, 1, 4, 2), (3, 2, 4, 3), (4, 1, 3, 4), (4, 2, 4, 5)],
)
def test_greedy_tree_is_optimal_for_the_proxy(
    vocab: int, order: int, depth: int, seed: int
) -> None:
    """What is proven, for this draft table (random logits) and prompt: let v(u) be eq. 11's
    estimate for node u in the expected-value variant (draws take the residual's top token,
    so a node's earlier siblings are the tokens ranked above it): the product of the draft
    probabilities of u's ancestors times one minus its earlier siblings' mass. For every
    N = 1..8, the maximum of F(T) = sum of v(u) over all connected subtrees T containing the
    root, of the complete V-ary tree of depth <= D, with N nodes (enumerated: up to 1.4
    million subtrees for V = 4, D = 4) equals F of the tree DySpec builds at temperature 0
    with budget N and max_depth D; and the drafter's own node values add up to the same F,
    which also equals eq. 11 evaluated on the tree's actual sibling order."""
    draft = MarkovModel.random(vocab, torch.Generator().manual_seed(seed), order=order)
    best = _best_values_by_size(draft, depth, 8, _proxy)
    for size in range(1, 9):
        drafter = DySpec(draft, budget=size, max_depth=depth)
        tree = _propose(drafter, _state(0.0))
        assert tree.num_nodes == size
        assert int(tree.depth.max()) <= depth
        value = sum(_proxy(draft, tuple(tree.path_tokens(i))) for i in range(size))
        assert math.isclose(value, best[size], rel_tol=1e-12), (size, value, best[size])
        assert math.isclose(sum(drafter.node_values), value, rel_tol=1e-12)
        assert math.isclose(_eq11_in_tree(draft, tree), value, rel_tol=1e-12)


def test_greedy_tree_is_not_optimal_for_the_nodes_own_acceptance() -> None:
    """The greedy tree maximises the sum of slot values v, not the sum of the nodes' own
    acceptance estimates v R[y] (path products): a 2-token draft where it falls short."""
    draft = MarkovModel.random(2, torch.Generator().manual_seed(0), order=1)
    best = _best_values_by_size(draft, 4, 8, _path_value)
    shortfalls = []
    for size in range(1, 9):
        tree = _propose(DySpec(draft, budget=size, max_depth=4), _state(0.0))
        value = sum(_path_value(draft, tuple(tree.path_tokens(i))) for i in range(size))
        assert value <= best[size] + 1e-12
        shortfalls.append(best[size] - value)
    assert max(shortfalls) > 1e-3


def _paths(tree: DraftTree) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The tree as (path, children tokens in stored order), sorted: equal for equal trees."""
    out = []
    for row, kids in enumerate(tree.children):
        path = () if row == 0 else tuple(tree.path_tokens(row - 1))
        out.append((path, tuple(int(tree.tokens[c]) for c in kids)))
    return sorted(out)


def _row_hash_keys(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Deterministic Gumbel keys: the noise of a row depends only on the row's values."""
    rows = []
    for row in probs:
        seed = int.from_bytes(hashlib.sha256(row.numpy().tobytes()).digest()[:7], "little")
        noise = torch.empty_like(row).exponential_(generator=torch.Generator().manual_seed(seed))
        rows.append(row.log() - noise.log())
    return torch.stack(rows)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("budget", [1, 3, 7, 15, 30])
def test_threshold_tree_equals_fixed_size_tree(temperature: float, budget: int) -> None:
    """With the same draws, Algorithm 2 with threshold t strictly between the value of the
    last slot Algorithm 1 expanded and the best value left in its heap builds the same tree
    (same paths, same sibling order) as Algorithm 1 with budget m."""
    draft = MarkovModel.random(5, torch.Generator().manual_seed(9), order=2, scale=1.5)
    fixed = DySpec(draft, budget=budget)
    fixed._keys = _row_hash_keys
    tree = _propose(fixed, _state(temperature))
    last, left = fixed.node_values[-1], fixed.next_slot_value
    assert last > left
    threshold = DySpec(draft, threshold=(last + left) / 2)
    threshold._keys = _row_hash_keys
    assert _paths(_propose(threshold, _state(temperature))) == _paths(tree)


def test_popped_values_never_increase_and_are_the_eq11_estimates() -> None:
    """Algorithm 1 pops slots in non-increasing value; each node's value is the product of
    its ancestors' processed draft probabilities times one minus its earlier siblings' mass."""
    draft = MarkovModel.random(6, torch.Generator().manual_seed(2), order=1, scale=1.0)
    drafter = DySpec(draft, budget=40)
    state = _state(0.8, seed=5)
    tree = _propose(drafter, state)
    values = drafter.node_values
    assert all(a >= b for a, b in itertools.pairwise(values))

    def probs(path: list[int]) -> torch.Tensor:
        return state.sampling.probs(draft.next_logits([*PROMPT, *path]), torch.float64)

    for node in range(tree.num_nodes):
        path = tree.path_tokens(node)
        expected = 1.0
        for depth in range(len(path) - 1):
            expected *= float(probs(path[:depth])[path[depth]])
        parent = int(tree.parents[node])
        siblings = tree.children[parent + 1]
        earlier = siblings[: siblings.index(node)]
        expected *= 1.0 - float(sum(probs(path[:-1])[int(tree.tokens[s])] for s in earlier))
        assert math.isclose(values[node], expected, rel_tol=1e-9, abs_tol=1e-15)


def test_children_are_stored_in_draw_order_when_the_heap_interleaves() -> None:
    """Each row's children are a prefix of that row's draw order (its Gumbel-top-k order),
    although nodes of different parents are interleaved in the node list."""
    draft = MarkovModel.random(5, torch.Generator().manual_seed(3), order=2, scale=0.7)
    drafter = DySpec(draft, budget=24)
    drafter._keys = _row_hash_keys
    state = _state(1.0)
    tree = _propose(drafter, state)
    interleaved = False
    for row, kids in enumerate(tree.children):
        if not kids:
            continue
        path = [] if row == 0 else tree.path_tokens(row - 1)
        probs = state.sampling.probs(draft.next_logits([*PROMPT, *path]), torch.float64)
        order = _row_hash_keys(probs[None], state.generator)[0].argsort(descending=True)
        assert [int(tree.tokens[c]) for c in kids] == order[: len(kids)].tolist()
        interleaved |= list(kids) != list(range(kids[0], kids[0] + len(kids)))
        law = tree.laws[row]
        assert isinstance(law, WithoutReplacement)
        assert torch.allclose(law.draft_probs, probs, atol=0, rtol=1e-12)
    assert interleaved


def test_root_children_follow_sequential_without_replacement() -> None:
    """The i-th child of the root, given the earlier ones and that an i-th was drawn, is
    distributed as the draft with the earlier children removed (pooled chi-square over
    histories, 1,500 proposals with budget 3, alpha = 1e-3)."""
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.7, 0.2, 0.1]], dtype=torch.float64)
    draft = MarkovModel.from_probs(probs)
    drafter = DySpec(draft, budget=3)
    state = _state(1.0, seed=8, tokens=[0])
    drafter.begin(state)
    root = probs[0].tolist()
    groups: dict[tuple[int, ...], dict[int, int]] = {}
    for _ in range(1500):
        tree = drafter.propose(state)
        kids = [int(tree.tokens[c]) for c in tree.children[0]]
        for i, kid in enumerate(kids):
            cell = groups.setdefault(tuple(kids[:i]), {})
            cell[kid] = cell.get(kid, 0) + 1
        draft.commit([], 0)
        draft.prefill(torch.tensor([0]))
    stat, dof = 0.0, 0
    for history, cell in groups.items():
        total, left = sum(cell.values()), 1.0 - sum(root[h] for h in history)
        expected = {t: root[t] / left * total for t in range(3) if t not in history}
        assert set(cell) <= set(expected)
        if len(expected) > 1 and min(expected.values()) >= 5:
            stat += sum((cell.get(t, 0) - e) ** 2 / e for t, e in expected.items())
            dof += len(expected) - 1
    assert dof >= 3
    assert chi2.sf(stat, dof) > 1e-3


def test_threshold_variant_calls_the_draft_once_per_level() -> None:
    """Algorithm 2 feeds each level in one draft call."""
    draft = MarkovModel.random(5, torch.Generator().manual_seed(1), order=2)
    drafter = DySpec(draft, threshold=0.05)
    state = _state(0.0)
    drafter.begin(state)
    before = len(draft.call_log)
    tree = drafter.propose(state)
    calls = draft.call_log[before:]
    inner_depths = {int(tree.depth[p]) for p in tree.parents.tolist() if p >= 0}
    assert len(calls) == 1 + len(inner_depths)  # the root, then one per expanded level
    assert all(law is None or law is DETERMINISTIC for law in tree.laws)


def test_fixed_size_calls_the_draft_at_most_once_per_node() -> None:
    """Algorithm 1 with lazy child distributions feeds each node at most once and calls the
    draft far fewer times than it adds nodes."""
    draft = MarkovModel.random(8, torch.Generator().manual_seed(4), order=1, scale=1.5)
    drafter = DySpec(draft, budget=32)
    state = _state(0.6, seed=1)
    drafter.begin(state)
    before_calls, before_fed = len(draft.call_log), draft.tokens_fed
    tree = drafter.propose(state)
    assert tree.num_nodes == 32
    assert draft.tokens_fed - before_fed <= 1 + 32
    assert len(draft.call_log) - before_calls < 32


def test_max_depth_caps_the_tree() -> None:
    """No node is deeper than max_depth."""
    draft = MarkovModel.random(3, torch.Generator().manual_seed(0), scale=3.0)
    tree = _propose(DySpec(draft, budget=30, max_depth=2), _state(1.0))
    assert int(tree.depth.max()) <= 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"budget": 0},
        {"budget": -4},
        {"threshold": 0.0},
        {"threshold": 1.0},
        {"threshold": -0.2},
        {"threshold": 1.5},
        {"threshold": True},
        {"budget": 8, "max_depth": 0},
    ],
)
def test_bad_parameters(kwargs: dict) -> None:
    """A budget must be an integer >= 1, a threshold in (0, 1), one of them given."""
    draft = MarkovModel.random(3, torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError):
        DySpec(draft, **kwargs)
