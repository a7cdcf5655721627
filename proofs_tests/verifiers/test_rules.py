"""Exact-law audits of verispec/verifiers/_rules.py: every acceptance rule reproduces the target.

Two computations in float64, compared with the target to 1e-12:

* the independent reference (``reference_rules.py``, no verispec code) enumerates every
  draw and integrates every coin, for every child count the law allows;
* the library's own arithmetic (``row_output_law``, ``verdict_distribution``) is summed
  over every draw sequence, and agrees with the reference child sequence by child
  sequence.

Hypothesis examples (profile ``verispec``: derandomised): see ``MAX_EXAMPLES``.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from reference_rules import DETERMINISTIC as REF_DETERMINISTIC
from reference_rules import IID as REF_IID
from reference_rules import WOR as REF_WOR
from reference_rules import Draws, max_error, output_laws
from strategies import distribution_pairs, distributions, vocab_sizes

from verispec.core.tree import DETERMINISTIC, IID, DraftTree, WithoutReplacement
from verispec.errors import NonFiniteLogitsError, TreeStructureError
from verispec.verifiers._rules import (
    RowRejection,
    row_acceptance,
    row_output_law,
    sample_index,
    verdict_distribution,
)

TOL = 1e-12
MAX_EXAMPLES = {"reference": 200, "library": 50, "row": 150, "chain": 100, "joint": 30}
LIBRARY_SEQUENCES = 120  # library enumeration: child counts with at most this many sequences


def as_tuple(t: torch.Tensor) -> tuple[float, ...]:
    return tuple(float(x) for x in t.tolist())


def support_size(dist: torch.Tensor) -> int:
    return int((dist > 0).sum())


def draw_sequences(kind: str, draft: tuple[float, ...], k: int):
    """Every sequence of k children under ``kind`` with its probability (float64)."""
    tokens = [t for t, w in enumerate(draft) if w > 0]
    if kind == "iid":
        for seq in itertools.product(tokens, repeat=k):
            yield seq, math.prod(draft[t] for t in seq)
        return
    for seq in itertools.permutations(tokens, k):
        prob = 1.0
        for i, t in enumerate(seq):
            prob *= draft[t] / math.fsum(w for u, w in enumerate(draft) if u not in seq[:i])
        yield seq, prob


def library_law(target: torch.Tensor, law, kind: str, draft: tuple[float, ...], k: int):
    out = torch.zeros_like(target)
    for seq, prob in draw_sequences(kind, draft, k):
        out += prob * row_output_law(target, law, seq)
    return out


def sequence_count(kind: str, support: int, k: int) -> int:
    return support**k if kind == "iid" else math.perm(support, k)


# -- the independent reference: every law, every child count ------------------------


@settings(max_examples=MAX_EXAMPLES["reference"])
@given(data=st.data())
def test_reference_deterministic_exact_for_every_candidate_count(data: st.DataObject) -> None:
    """Point-mass candidates judged by r_i(c_i) emit exactly q for 0..V candidates."""
    size = data.draw(vocab_sizes())
    target = as_tuple(data.draw(distributions(size)))
    candidates = tuple(data.draw(st.permutations(range(size))))
    laws = output_laws(target, Draws("fixed", tokens=candidates), REF_DETERMINISTIC, size)
    for k, law in enumerate(laws):
        assert max_error(law, target) < TOL, (k, law, target)


@settings(max_examples=MAX_EXAMPLES["reference"])
@given(data=st.data())
def test_reference_iid_exact_for_every_child_count(data: st.DataObject) -> None:
    """Multi-round rejection on i.i.d. draws emits exactly q for 1..V+2 children."""
    size = data.draw(vocab_sizes())
    target, draft = (as_tuple(t) for t in data.draw(distribution_pairs(size)))
    laws = output_laws(target, Draws("iid", draft), REF_IID, size + 2)
    for k, law in enumerate(laws):
        assert max_error(law, target) < TOL, (k, law, target)


@settings(max_examples=MAX_EXAMPLES["reference"])
@given(data=st.data())
def test_reference_without_replacement_exact_for_every_child_count(data: st.DataObject) -> None:
    """Recursive rejection on draws without replacement emits exactly q for 1..|supp p|."""
    size = data.draw(vocab_sizes())
    target, draft = (as_tuple(t) for t in data.draw(distribution_pairs(size)))
    event(f"V={size}, children up to {sum(w > 0 for w in draft)}")
    laws = output_laws(target, Draws("wor", draft), REF_WOR, sum(w > 0 for w in draft))
    for k, law in enumerate(laws):
        assert max_error(law, target) < TOL, (k, law, target)


@pytest.mark.parametrize("size", [7, 8])
@pytest.mark.parametrize("seed", range(3))
def test_reference_full_support_every_child_count(size: int, seed: int) -> None:
    """Full-support pairs at V = 7, 8 (rare under hypothesis): every law, every child count."""
    gen = torch.Generator().manual_seed(seed)
    target, draft = (
        as_tuple(torch.rand(size, generator=gen, dtype=torch.float64).softmax(0)) for _ in range(2)
    )
    checks = [
        (Draws("fixed", tokens=tuple(range(size))), REF_DETERMINISTIC, size),
        (Draws("iid", draft), REF_IID, size + 2),
        (Draws("wor", draft), REF_WOR, size),
    ]
    for draws, rule, max_children in checks:
        for k, law in enumerate(output_laws(target, draws, rule, max_children)):
            assert max_error(law, target) < TOL, (rule.name, k)


# -- the library's arithmetic --------------------------------------------------------


@settings(max_examples=MAX_EXAMPLES["library"])
@given(data=st.data(), kind=st.sampled_from(["iid", "wor"]))
def test_library_exact_law_summed_over_every_draw(data: st.DataObject, kind: str) -> None:
    """row_output_law (float64) averaged over every draw sequence equals q, per child count."""
    size = data.draw(vocab_sizes())
    target, draft = data.draw(distribution_pairs(size))
    law = IID(draft) if kind == "iid" else WithoutReplacement(draft)
    support = support_size(draft)
    max_k = support + 1 if kind == "iid" else support
    counts = [
        k for k in range(1, max_k + 1) if sequence_count(kind, support, k) <= LIBRARY_SEQUENCES
    ]
    for k in counts:
        out = library_law(target, law, kind, as_tuple(draft), k)
        assert float((out - target).abs().max()) < TOL, (k, out, target)


@settings(max_examples=MAX_EXAMPLES["library"])
@given(data=st.data())
def test_library_deterministic_exact_for_every_candidate_count(data: st.DataObject) -> None:
    """row_output_law for k distinct point-mass candidates equals q, k = 0..V."""
    size = data.draw(vocab_sizes())
    target = data.draw(distributions(size))
    candidates = data.draw(st.permutations(range(size)))
    for k in range(size + 1):
        out = row_output_law(target, DETERMINISTIC, candidates[:k])
        assert float((out - target).abs().max()) < TOL, (k, out, target)


@settings(max_examples=MAX_EXAMPLES["row"])
@given(data=st.data(), kind=st.sampled_from(["deterministic", "iid", "wor"]))
def test_library_row_law_matches_reference_child_by_child(data: st.DataObject, kind: str) -> None:
    """For any fixed child sequence, the library's conditional output law is the reference's."""
    size = data.draw(vocab_sizes())
    target, draft = data.draw(distribution_pairs(size))
    support = [t for t in range(size) if draft[t] > 0]
    if kind == "deterministic":
        children = data.draw(st.lists(st.integers(0, size - 1), max_size=size + 2))
        law, rule, assumed = DETERMINISTIC, REF_DETERMINISTIC, None
    elif kind == "iid":
        children = data.draw(st.lists(st.sampled_from(support), min_size=1, max_size=size + 2))
        law, rule, assumed = IID(draft), REF_IID, as_tuple(draft)
    else:
        children = data.draw(st.permutations(support))
        children = children[: data.draw(st.integers(1, len(children)))]
        law, rule, assumed = WithoutReplacement(draft), REF_WOR, as_tuple(draft)
    ours = row_output_law(target, law, children)
    reference = output_laws(
        as_tuple(target), Draws("fixed", assumed, tuple(children)), rule, len(children)
    )[-1]
    assert max_error(ours.tolist(), reference) < TOL


# -- acceptance rate -----------------------------------------------------------------


@settings(max_examples=MAX_EXAMPLES["chain"])
@given(data=st.data())
def test_chain_acceptance_rate_is_one_minus_total_variation(data: st.DataObject) -> None:
    """A one-child IID row accepts with probability sum_c p(c) a(c) = 1 - TV(p, q), exactly."""
    size = data.draw(vocab_sizes())
    target, draft = data.draw(distribution_pairs(size))
    rate = 0.0
    for token in range(size):
        if draft[token] > 0:
            (accept,), _ = row_acceptance(target, IID(draft), [token])
            rate += float(draft[token]) * accept
    total_variation = 0.5 * float((target - draft).abs().sum())
    assert abs(rate - (1.0 - total_variation)) < TOL


# -- a two-level tree: the joint law -------------------------------------------------


def _children_sequences(kind: str, draft: torch.Tensor, k: int, fixed: list[int]):
    if kind == "deterministic":
        return [(tuple(fixed[:k]), 1.0)]
    return list(draw_sequences(kind, as_tuple(draft), k))


def _law(kind: str, draft: torch.Tensor):
    if kind == "deterministic":
        return DETERMINISTIC
    return IID(draft) if kind == "iid" else WithoutReplacement(draft)


@settings(max_examples=MAX_EXAMPLES["joint"])
@given(data=st.data())
def test_two_level_tree_joint_law_of_three_tokens(data: st.DataObject) -> None:
    """Over every draw of a two-level tree, the committed tokens follow the target's joint law.

    Target and draft are bigram models (start law and transition matrix). The verdict
    commits 1 to 3 tokens; the rest of the first three is completed from the target,
    as the next steps would (each exact by the one-row audits). The law of the first
    three tokens must be q0(t1) Q(t1, t2) Q(t2, t3).
    """
    size = data.draw(st.integers(2, 4))
    kinds = ["deterministic", "iid", "wor"]
    root_kind, child_kind = data.draw(st.sampled_from(kinds)), data.draw(st.sampled_from(kinds))
    start_target, start_draft = data.draw(distribution_pairs(size))
    rows = [data.draw(distribution_pairs(size)) for _ in range(size)]
    trans_target = torch.stack([r[0] for r in rows])  # (V, V)
    trans_draft = torch.stack([r[1] for r in rows])
    fixed = data.draw(st.permutations(range(size)))
    max_root = size if root_kind != "wor" else support_size(start_draft)
    k_root = data.draw(st.integers(1, min(2, max_root)))
    k_child = data.draw(st.integers(1, 2))

    options = []  # (root children, probability, options of each root child's children)
    for root_tokens, root_prob in _children_sequences(root_kind, start_draft, k_root, fixed):
        per_child = []
        for token in root_tokens:
            draft = trans_draft[token]
            k = min(k_child, support_size(draft)) if child_kind == "wor" else k_child
            per_child.append(_children_sequences(child_kind, draft, k, fixed))
        options.append((root_tokens, root_prob, per_child))
    assume(sum(math.prod(len(c) for c in per_child) for *_, per_child in options) <= 800)
    joint = torch.zeros(size, size, size, dtype=torch.float64)
    for root_tokens, root_prob, per_child in options:
        for combo in itertools.product(*per_child):
            tokens, parents = list(root_tokens), [-1] * len(root_tokens)
            laws = [_law(root_kind, start_draft)] + [None] * len(root_tokens)
            prob = root_prob
            for i, (child_tokens, child_prob) in enumerate(combo):
                prob *= child_prob
                laws[i + 1] = (
                    _law(child_kind, trans_draft[root_tokens[i]]) if child_tokens else None
                )
                tokens += child_tokens
                parents += [i] * len(child_tokens)
                laws += [None] * len(child_tokens)
            tree = DraftTree(tokens, parents, laws)
            rows_probs = torch.stack([start_target] + [trans_target[t] for t in tokens])
            for (path, extra), p in verdict_distribution(tree, rows_probs).items():
                seq = [tokens[n] for n in path] + [extra]
                weight = prob * p
                if len(seq) == 1:
                    joint[seq[0]] += weight * trans_target[seq[0]][:, None] * trans_target
                elif len(seq) == 2:
                    joint[seq[0], seq[1]] += weight * trans_target[seq[1]]
                else:
                    joint[seq[0], seq[1], seq[2]] += weight
    expected = start_target[:, None, None] * trans_target[:, :, None] * trans_target[None, :, :]
    assert float((joint - expected).abs().max()) < TOL


# -- a residual without mass, and bad input ------------------------------------------


@pytest.mark.parametrize("law_kind", ["iid", "wor"])
def test_residual_without_mass_restarts_from_the_target(law_kind: str) -> None:
    """Forcing the probability-0 rejection when draft = target gives the target, not NaN."""
    target = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    law = IID(target.clone()) if law_kind == "iid" else WithoutReplacement(target.clone())
    walk = RowRejection(target, law, [0, 1])
    assert walk.acceptance_probability() == 1.0
    walk.reject()  # a coin can never do this: u < 1 always
    assert walk.restarts == 1
    # restarted from r = q: IID judges token 1 against p, WoR against p without token 0
    assert walk.acceptance_probability() == (1.0 if law_kind == "iid" else 0.5)
    assert torch.equal(walk.residual(), target)


def test_a_child_below_the_fixed_point_is_judged_as_the_coin_judges_it() -> None:
    """A drawn child whose draft probability (1e-17) is positive but below the fixed
    point's resolution has draft weight 0: every coin accepts it where the residual is
    positive, and its acceptance probability (the audits' exact law) says so too."""
    target = torch.tensor([0.5, 0.5], dtype=torch.float64)
    walk = RowRejection(target, IID(torch.tensor([1 - 1e-17, 1e-17], dtype=torch.float64)), [1])
    assert walk.ratios()[0] == 0.0  # p: the child's draft weight, rounded to 0
    assert all(walk.accepts(u) for u in (0.0, 0.5, 1 - 2**-53))
    assert walk.acceptance_probability() == 1.0


def test_deterministic_residual_without_mass_samples_the_target() -> None:
    """Rejecting every candidate that carries all the target mass falls back to the target."""
    target = torch.tensor([0.0, 0.5, 0.5, 0.0], dtype=torch.float32)
    walk = RowRejection(target, DETERMINISTIC, [1, 2])
    walk.reject()
    assert walk.acceptance_probability() == 1.0  # 0.5 / 0.5
    walk.reject()
    assert torch.equal(walk.residual(), target)


def test_sample_index_is_the_inverse_cdf() -> None:
    """On a grid of uniforms the sampled indices have the exact frequencies; zeros never occur."""
    weights = torch.tensor([0.0, 0.25, 0.0, 0.5, 0.25, 0.0])
    grid = 4096
    counts = [0] * 6
    for j in range(grid):
        counts[sample_index(weights, (j + 0.5) / grid)] += 1
    assert counts == [0, 1024, 0, 2048, 1024, 0]
    assert sample_index(weights, 1.0 - 2.0**-53) == 4
    assert sample_index(weights, 0.0) == 1


@pytest.mark.parametrize("law_cls", [IID, WithoutReplacement])
def test_zero_draft_probability_on_a_drawn_token_is_an_error(law_cls) -> None:
    """A child the draft distribution gives probability 0 could not have been drawn."""
    draft = torch.tensor([0.5, 0.5, 0.0])
    with pytest.raises(TreeStructureError, match=r"token 2\).*draft probability 0"):
        RowRejection(torch.full((3,), 1 / 3), law_cls(draft), [0, 2])


def test_repeated_sibling_without_replacement_is_an_error() -> None:
    """Draws without replacement cannot repeat a token."""
    draft = torch.tensor([0.5, 0.5, 0.0])
    with pytest.raises(TreeStructureError, match="repeats an earlier sibling"):
        RowRejection(torch.full((3,), 1 / 3), WithoutReplacement(draft), [1, 1])


def test_bad_draft_distributions_are_errors() -> None:
    """Wrong shape, NaN and negative draft distributions raise clear errors."""
    target = torch.full((3,), 1 / 3)
    with pytest.raises(TreeStructureError, match=r"shape \(V,\) = \(3,\)"):
        RowRejection(target, IID(torch.full((4,), 0.25)), [0])
    with pytest.raises(NonFiniteLogitsError):
        RowRejection(target, IID(torch.tensor([0.5, float("nan"), 0.5])), [0])
    with pytest.raises(TreeStructureError, match="non-negative"):
        RowRejection(target, IID(torch.tensor([0.7, -0.2, 0.5])), [0])
