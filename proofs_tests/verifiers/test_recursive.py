"""Tests of verispec/verifiers/recursive.py: the verifier as the decoder calls it.

Sampled audits run the real code path (float32 residuals, a seeded torch.Generator)
10^5 times per case and compare the output with the processed target law by
``scipy.stats.chisquare`` at ALPHA = 1e-3 per case (fixed seeds, so every run gives
the same verdict; seven cases, family-wise level at most 7e-3 under the null). The
10^5 draws of one case go through ``sample_verdicts``, which is ``verify``'s own code
path shared across samples (``verify`` is ``sample_verdicts`` with one sample; a test
below checks they consume the generator identically).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare
from strategies import draft_trees, logit_rows

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DETERMINISTIC, IID, DraftTree, WithoutReplacement
from verispec.errors import ConfigError, NonFiniteLogitsError, TreeStructureError
from verispec.verifiers import Greedy, RecursiveRejection

ALPHA = 1e-3
SAMPLES = 100_000
POWER_P_VALUE = 1e-12  # a wrong rule must be rejected by a wide margin


def chi_square_p_value(observed: Counter, expected: dict, samples: int) -> float:
    """Chi-square p-value of ``observed`` counts against ``expected`` probabilities.

    Outcomes of expected probability 0 must never be observed (asserted); outcomes
    whose expected count is below 5 are pooled into one bin.
    """
    impossible = [key for key in observed if expected.get(key, 0.0) == 0.0]
    assert not impossible, f"outcomes of target probability 0 were sampled: {impossible[:5]}"
    obs, exp, pooled_obs, pooled_exp = [], [], 0, 0.0
    for key, prob in expected.items():
        if prob == 0.0:
            continue
        if prob * samples < 5:
            pooled_obs += observed.get(key, 0)
            pooled_exp += prob * samples
        else:
            obs.append(observed.get(key, 0))
            exp.append(prob * samples)
    if pooled_exp > 0:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    total = sum(exp)
    exp = [e * sum(obs) / total for e in exp]  # float64 rounding only
    return float(chisquare(obs, exp).pvalue)


def gumbel_top_k(probs: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """Sequential draws without replacement (Gumbel-top-k), Shape: (S, k) for probs (S, V)."""
    uniforms = torch.rand(probs.shape, generator=generator, dtype=torch.float64)
    keys = probs.log() - (-uniforms.log()).log()
    return keys.topk(k, dim=-1).indices  # sorted by key: the order of sequential draws


def first_token_counts(
    target_logits_row: torch.Tensor,
    sampling: SamplingParams,
    kind: str,
    draft_probs: torch.Tensor | None,
    k: int,
    seed: int,
    fixed: list[int] | None = None,
    law_kind: str | None = None,
) -> Counter:
    """Sample the first committed token SAMPLES times through the real verifier.

    Children are drawn per sample (vectorised) under ``kind`` ("fixed", "iid", "wor");
    the tree is labelled with ``law_kind`` (default: the law that matches ``kind``).
    """
    gen = torch.Generator().manual_seed(seed)
    if kind == "fixed":
        assert fixed is not None
        children = torch.tensor([fixed]).expand(SAMPLES, k)
    else:
        assert draft_probs is not None
        probs = draft_probs.double().expand(SAMPLES, -1)
        if kind == "iid":
            children = torch.multinomial(probs, k, replacement=True, generator=gen)
        else:
            children = gumbel_top_k(probs, k, gen)
    law_kind = law_kind or {"fixed": "deterministic", "iid": "iid", "wor": "wor"}[kind]
    law = {
        "deterministic": lambda: DETERMINISTIC,
        "iid": lambda: IID(draft_probs),
        "wor": lambda: WithoutReplacement(draft_probs),
    }[law_kind]()
    vocab_size = target_logits_row.shape[-1]
    leaf_logits = torch.zeros(k, vocab_size)  # rows of the children: unused by this count
    logits = torch.cat([target_logits_row[None], leaf_logits])  # (k + 1, V)
    verifier = RecursiveRejection()
    counts: Counter = Counter()
    unique, multiplicity = torch.unique(children, dim=0, return_counts=True)
    for seq, count in zip(unique.tolist(), multiplicity.tolist(), strict=True):
        tree = DraftTree.from_parents(seq, [-1] * k, law)
        verdicts = verifier.sample_verdicts(tree, logits, sampling, gen, count)
        counts.update(seq[v.accepted[0]] if v.accepted else v.extra_token for v in verdicts)
    return counts


def committed(tokens: list[int], verdict) -> list[int]:
    return [tokens[i] for i in verdict.accepted] + [verdict.extra_token]


def _case_logits(vocab_size: int, seed: int, scale: float = 1.5) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(scale * torch.randn(vocab_size, generator=gen) for _ in range(2))


FIRST_TOKEN_CASES = [
    # (name, kind, V, k, sampling)
    ("deterministic top-3", "fixed", 6, 3, SamplingParams(temperature=0.8, top_k=5)),
    ("iid k=3", "iid", 6, 3, SamplingParams(temperature=1.0)),
    ("without replacement k=3", "wor", 6, 3, SamplingParams(temperature=0.7, top_p=0.95)),
]


@pytest.mark.parametrize(
    ("name", "kind", "vocab_size", "k", "sampling"),
    FIRST_TOKEN_CASES,
    ids=[c[0] for c in FIRST_TOKEN_CASES],
)
def test_sampled_first_token_follows_the_target(name, kind, vocab_size, k, sampling) -> None:
    """10^5 verdicts of the real float32 path pass chi-square against the processed target."""
    target_logits, draft_logits = _case_logits(vocab_size, seed=len(name))
    target = sampling.probs(target_logits, torch.float64)
    draft = sampling.probs(draft_logits, torch.float32)
    fixed = draft.topk(k).indices.tolist()
    counts = first_token_counts(target_logits, sampling, kind, draft, k, seed=1, fixed=fixed)
    expected = dict(enumerate(target.tolist()))
    assert chi_square_p_value(counts, expected, SAMPLES) > ALPHA


def _bigram(vocab_size: int, seed: int, sampling: SamplingParams):
    gen = torch.Generator().manual_seed(seed)
    logits = 1.5 * torch.randn(vocab_size + 1, vocab_size, generator=gen)  # row V: the start
    return logits, sampling.probs(logits, torch.float64), sampling.probs(logits, torch.float32)


def test_sampled_two_level_tree_joint_law() -> None:
    """A WoR root row over IID child rows: the first two committed tokens follow q0(a) Q(a, b)."""
    vocab_size, sampling = 4, SamplingParams(temperature=0.9, min_p=0.05)
    target_logits, target, _ = _bigram(vocab_size, 7, sampling)
    _, _, draft = _bigram(vocab_size, 8, sampling)
    start = vocab_size
    gen = torch.Generator().manual_seed(2)
    root = gumbel_top_k(draft[start].double().expand(SAMPLES, -1), 2, gen)  # (S, 2)
    below = torch.multinomial(
        draft[root.reshape(-1)].double(), 2, replacement=True, generator=gen
    ).reshape(SAMPLES, 4)  # children of root child 0, then of root child 1
    trees = torch.cat([root, below], dim=1)  # (S, 6) tokens in node order
    parents = [-1, -1, 0, 0, 1, 1]
    verifier = RecursiveRejection()
    counts: Counter = Counter()
    unique, multiplicity = torch.unique(trees, dim=0, return_counts=True)
    singles: list[int] = []
    for tokens, count in zip(unique.tolist(), multiplicity.tolist(), strict=True):
        laws = [WithoutReplacement(draft[start]), IID(draft[tokens[0]]), IID(draft[tokens[1]])]
        tree = DraftTree(tokens, parents, laws + [None] * 4)
        logits = target_logits[[start, *tokens]]  # (7, V): row i + 1 scores after node i
        for verdict in verifier.sample_verdicts(tree, logits, sampling, gen, count):
            out = committed(tokens, verdict)
            if len(out) >= 2:
                counts[(out[0], out[1])] += 1
            else:
                singles.append(out[0])
    # one token committed: the next step samples the target after it
    nxt = torch.multinomial(target[singles], 1, generator=gen).squeeze(1).tolist()
    counts.update(zip(singles, nxt, strict=True))
    expected = {
        (a, b): float(target[start, a] * target[a, b])
        for a in range(vocab_size)
        for b in range(vocab_size)
    }
    assert chi_square_p_value(counts, expected, SAMPLES) > ALPHA


def test_sampled_chain_joint_law_and_acceptance_rate() -> None:
    """A two-node IID chain (speculative sampling): joint law of two tokens, and the root's
    acceptance rate within 5 standard errors of 1 - TV(p, q)."""
    vocab_size, sampling = 5, SamplingParams(temperature=1.2)
    target_logits, target, _ = _bigram(vocab_size, 11, sampling)
    _, _, draft = _bigram(vocab_size, 12, sampling)
    start = vocab_size
    gen = torch.Generator().manual_seed(3)
    first = torch.multinomial(draft[start].double(), SAMPLES, replacement=True, generator=gen)
    second = torch.multinomial(draft[first].double(), 1, generator=gen).squeeze(1)
    verifier = RecursiveRejection()
    counts: Counter = Counter()
    accepted_root = 0
    singles: list[int] = []
    pairs = torch.stack([first, second], dim=1)
    unique, multiplicity = torch.unique(pairs, dim=0, return_counts=True)
    for (a, b), count in zip(unique.tolist(), multiplicity.tolist(), strict=True):
        tree = DraftTree([a, b], [-1, 0], [IID(draft[start]), IID(draft[a]), None])
        logits = target_logits[[start, a, b]]
        for verdict in verifier.sample_verdicts(tree, logits, sampling, gen, count):
            out = committed([a, b], verdict)
            accepted_root += bool(verdict.accepted)
            if len(out) >= 2:
                counts[(out[0], out[1])] += 1
            else:
                singles.append(out[0])
    # one token committed: the next step samples the target after it
    nxt = torch.multinomial(target[singles], 1, generator=gen).squeeze(1).tolist()
    counts.update(zip(singles, nxt, strict=True))
    expected = {
        (a, b): float(target[start, a] * target[a, b])
        for a in range(vocab_size)
        for b in range(vocab_size)
    }
    assert chi_square_p_value(counts, expected, SAMPLES) > ALPHA
    rate = 1.0 - 0.5 * float((target[start] - draft[start].double()).abs().sum())
    standard_error = math.sqrt(rate * (1 - rate) / SAMPLES)
    assert abs(accepted_root / SAMPLES - rate) < 5 * standard_error


# -- the sampled audit has power: mislabelled trees through the real path -----------


def test_sampled_audit_rejects_iid_rule_on_draws_without_replacement() -> None:
    """Children drawn without replacement but labelled IID are visibly biased at 10^5 samples."""
    sampling = SamplingParams(temperature=1.0)
    target_logits, draft_logits = _case_logits(6, seed=5, scale=2.0)
    target = sampling.probs(target_logits, torch.float64)
    draft = sampling.probs(draft_logits, torch.float32)
    counts = first_token_counts(target_logits, sampling, "wor", draft, 4, seed=4, law_kind="iid")
    assert chi_square_p_value(counts, dict(enumerate(target.tolist())), SAMPLES) < POWER_P_VALUE


def test_sampled_audit_rejects_top_k_candidates_verified_as_draft_samples() -> None:
    """Top-k candidates judged as if sampled from the draft softmax are visibly biased."""
    sampling = SamplingParams(temperature=1.0)
    target_logits, draft_logits = _case_logits(6, seed=6, scale=2.0)
    target = sampling.probs(target_logits, torch.float64)
    draft = sampling.probs(draft_logits, torch.float32)
    top = draft.topk(2).indices.tolist()
    counts = first_token_counts(
        target_logits, sampling, "fixed", draft, 2, seed=5, fixed=top, law_kind="wor"
    )
    assert chi_square_p_value(counts, dict(enumerate(target.tolist())), SAMPLES) < POWER_P_VALUE


# -- the code path itself ------------------------------------------------------------


@st.composite
def mixed_law_trees(draw: st.DrawFn, vocab_size: int) -> DraftTree:
    """A tree whose rows carry random laws; draft distributions give every child mass."""
    base = draw(draft_trees(vocab_size, max_nodes=10))
    laws = []
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    for kids in base.children:
        kind = draw(st.sampled_from(["deterministic", "iid", "wor"]))
        draft = torch.rand(vocab_size, generator=gen) + 0.05
        draft = draft / draft.sum()
        if not kids:
            laws.append(None)
        elif kind == "deterministic":
            laws.append(DETERMINISTIC)
        else:
            laws.append(IID(draft) if kind == "iid" else WithoutReplacement(draft))
    return DraftTree(base.tokens, base.parents, laws)


@settings(max_examples=40)
@given(data=st.data())
def test_sample_verdicts_is_verify_repeated(data: st.DataObject) -> None:
    """``sample_verdicts(S)`` returns what S successive ``verify`` calls return, same generator."""
    vocab_size = data.draw(st.integers(2, 7))
    tree = data.draw(mixed_law_trees(vocab_size))
    logits = data.draw(logit_rows(tree.num_nodes + 1, vocab_size))
    sampling = SamplingParams(temperature=data.draw(st.sampled_from([0.5, 1.0, 2.0])))
    seed = data.draw(st.integers(0, 2**31))
    verifier = RecursiveRejection()
    batch = verifier.sample_verdicts(
        tree, logits, sampling, torch.Generator().manual_seed(seed), 25
    )
    gen = torch.Generator().manual_seed(seed)
    one_by_one = [verifier.verify(tree, logits, sampling, gen) for _ in range(25)]
    assert batch == one_by_one
    for verdict in batch:  # a verdict is a root path plus one token of the vocabulary
        path = list(verdict.accepted)
        assert path == (tree.path_to(path[-1]) if path else [])
        assert 0 <= verdict.extra_token < vocab_size


@settings(max_examples=60)
@given(data=st.data())
def test_temperature_zero_agrees_with_greedy(data: st.DataObject) -> None:
    """At temperature 0 (point masses) the verdict is Greedy's, whatever the coins."""
    vocab_size = data.draw(st.integers(2, 7))
    tree = data.draw(draft_trees(vocab_size, max_nodes=12))
    logits = data.draw(logit_rows(tree.num_nodes + 1, vocab_size))
    sampling = SamplingParams(temperature=0.0)
    expected = Greedy().verify(tree, logits)
    for dtype in (torch.float32, torch.float64):
        gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
        verdicts = RecursiveRejection(dtype).sample_verdicts(tree, logits, sampling, gen, 20)
        assert all(v == expected for v in verdicts)


def test_bare_root_samples_the_target() -> None:
    """A tree that is only the root commits one token drawn from the target (N = 0)."""
    sampling = SamplingParams(temperature=1.0)
    logits = torch.tensor([[0.0, -math.inf, 1.0]])
    verdicts = RecursiveRejection().sample_verdicts(
        DraftTree.empty(), logits, sampling, torch.Generator().manual_seed(0), 2000
    )
    assert all(v.accepted == () for v in verdicts)
    tokens = Counter(v.extra_token for v in verdicts)
    assert tokens[1] == 0 and tokens[0] > 0 and tokens[2] > tokens[0]


def test_chain_of_one_accepts_a_certain_child() -> None:
    """A one-node chain whose token carries all target mass is always accepted (N = 1)."""
    tree = DraftTree.from_parents([2], [-1], IID(torch.tensor([0.2, 0.3, 0.5])))
    logits = torch.tensor([[-math.inf, -math.inf, 0.0], [0.0, 0.0, 0.0]])
    verdicts = RecursiveRejection().sample_verdicts(
        tree, logits, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0), 100
    )
    assert all(v.accepted == (0,) for v in verdicts)


def test_verdict_follows_node_ids_not_tokens() -> None:
    """Two cousins share a token; the walk continues at the accepted node's own row.

    RSD's Algorithm 6 appends the accepted token where it means the node id (errata):
    by token, node 3's subtree and node 2's would be confused. Root children a=0, b=1;
    node 2 (token 2) under a, node 3 (token 2) under b. The target forces b, then token
    2, then a bonus that differs between the two rows.
    """
    inf = math.inf
    tree = DraftTree.from_parents([0, 1, 2, 2], [-1, -1, 0, 1], DETERMINISTIC)
    logits = torch.tensor(
        [
            [-inf, 0.0, -inf, -inf, -inf, -inf],  # root: token 1 (node 1)
            [-inf, -inf, 0.0, -inf, -inf, -inf],  # node 0
            [-inf, -inf, 0.0, -inf, -inf, -inf],  # node 1: token 2 (node 3)
            [-inf, -inf, -inf, -inf, 0.0, -inf],  # node 2's row: bonus 4 (must not be used)
            [-inf, -inf, -inf, -inf, -inf, 0.0],  # node 3's row: bonus 5
        ]
    )
    verdicts = RecursiveRejection().sample_verdicts(
        tree, logits, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0), 50
    )
    assert all(v.accepted == (1, 3) and v.extra_token == 5 for v in verdicts)


# -- bad input -----------------------------------------------------------------------

SAMPLING = SamplingParams(temperature=1.0)


def _tree(law=DETERMINISTIC) -> DraftTree:
    return DraftTree.from_parents([1, 2], [-1, -1], law)


def _verify(tree: DraftTree, logits: torch.Tensor):
    return RecursiveRejection().verify(tree, logits, SAMPLING, torch.Generator().manual_seed(0))


def test_logits_shape_must_match_the_tree() -> None:
    """Logits with the wrong number of rows, dimensions or dtype are rejected."""
    with pytest.raises(TreeStructureError, match=r"shape \(N \+ 1, V\) = \(3, V\)"):
        _verify(_tree(), torch.zeros(2, 4))
    with pytest.raises(TreeStructureError):
        _verify(_tree(), torch.zeros(3))
    with pytest.raises(TreeStructureError):
        _verify(_tree(), torch.zeros(3, 4, dtype=torch.long))


def test_tokens_must_be_in_the_vocabulary() -> None:
    """A node token >= V is a tree/model mismatch."""
    with pytest.raises(TreeStructureError, match="tokens must be < V = 2"):
        _verify(_tree(), torch.zeros(3, 2))


def test_draft_distribution_shape_must_match_the_vocabulary() -> None:
    """A row's draft distribution of the wrong width is rejected, visited or not."""
    tree = DraftTree.from_parents(
        [1, 2, 0], [-1, -1, 1], [DETERMINISTIC, None, IID(torch.ones(5) / 5), None]
    )
    with pytest.raises(TreeStructureError, match=r"row 2 must have shape \(V,\) = \(4,\)"):
        _verify(tree, torch.zeros(4, 4))


def test_zero_draft_probability_on_a_drawn_child() -> None:
    """A child its row's draft distribution could not have drawn is a clear error."""
    tree = _tree(WithoutReplacement(torch.tensor([0.5, 0.5, 0.0, 0.0])))
    with pytest.raises(TreeStructureError, match=r"token 2\).*draft probability 0"):
        _verify(tree, torch.zeros(3, 4))


def test_row_with_children_needs_a_law() -> None:
    """A row that has children but no proposal law cannot be verified."""
    tree = DraftTree(torch.tensor([1]), torch.tensor([-1]), (None, None))
    with pytest.raises(TreeStructureError, match="no proposal law"):
        _verify(tree, torch.zeros(2, 3))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_logits_raise(bad: float) -> None:
    """NaN or +inf in a visited row raises instead of sampling garbage."""
    logits = torch.zeros(3, 4)
    logits[0, 1] = bad
    with pytest.raises(NonFiniteLogitsError):
        _verify(_tree(), logits)


@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_num_samples_must_be_a_positive_integer(bad) -> None:
    """sample_verdicts needs at least one sample."""
    with pytest.raises(ConfigError, match="num_samples"):
        RecursiveRejection().sample_verdicts(
            _tree(), torch.zeros(3, 4), SAMPLING, torch.Generator(), bad
        )


def test_residual_dtype_must_be_float32_or_float64() -> None:
    """Only float32 and float64 residuals are offered."""
    with pytest.raises(ConfigError, match="residual_dtype"):
        RecursiveRejection(torch.float16)
