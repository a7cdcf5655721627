"""Recursive rejection verification: kernel = reference draw for draw; the reference's rule
is ``verispec.verifiers.RecursiveRejection``'s and its output law is the target's."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DETERMINISTIC, IID, DraftTree, WithoutReplacement
from verispec.kernels import ops, reference
from verispec.kernels.reference import IID_CODE, WITHOUT_REPLACEMENT_CODE
from verispec.verifiers.recursive import RecursiveRejection

LAWS = ("deterministic", "iid", "without_replacement", "mixed")


def _random_case(kind: str, n: int, vocab: int, g: torch.Generator, parents: list[int]):  # type: ignore[no-untyped-def]
    """A tree whose stochastic rows' children are real draws from their law, target probs, coins."""
    shape = DraftTree.from_parents([0] * n, parents)
    tokens = [0] * n
    laws: list = []
    for row in range(n + 1):
        kids = shape.children[row]
        if not kids:
            laws.append(None)
            continue
        draft = torch.softmax(2 * torch.randn(vocab, generator=g, dtype=torch.float64), 0)
        law_kind = kind if kind != "mixed" else LAWS[row % 3]
        if law_kind == "iid":
            drawn = torch.multinomial(draft, len(kids), replacement=True, generator=g)
            laws.append(IID(draft))
        elif law_kind == "without_replacement":
            drawn = torch.multinomial(draft, len(kids), replacement=False, generator=g)
            laws.append(WithoutReplacement(draft))
        else:
            drawn = torch.randperm(vocab, generator=g)[: len(kids)]
            laws.append(DETERMINISTIC)
        for node, token in zip(kids, drawn.tolist(), strict=True):
            tokens[node] = token
    tree = DraftTree.from_parents(tokens, parents, laws)
    probs = torch.softmax(2 * torch.randn(n + 1, vocab, generator=g, dtype=torch.float64), -1)
    return tree, probs


@pytest.mark.parametrize("kind", LAWS)
def test_kernel_equals_reference_draw_for_draw(triton_backend, device, make_parents, kind) -> None:  # type: ignore[no-untyped-def]
    """For each law, on 6 random trees of 1-12 nodes over V = 300 (two vocabulary tiles), each
    with 3 sets of uniform draws, the kernel's verdict equals the reference's exactly."""
    g = torch.Generator().manual_seed(LAWS.index(kind))
    for _ in range(6):
        n = 1 + int(torch.randint(0, 12, (), generator=g))
        tree, probs = _random_case(kind, n, 300, g, make_parents(n, g, chain_bias=0.5))
        for _ in range(3):
            uniforms = torch.rand(n + 1, generator=g, dtype=torch.float64)
            expected = _reference(tree, probs, uniforms)
            assert ops.rejection_verify(tree, probs.to(device), uniforms) == expected


def _reference(tree: DraftTree, probs: torch.Tensor, uniforms: torch.Tensor):  # type: ignore[no-untyped-def]
    return ops.rejection_verify(tree, probs, uniforms, kernels="torch")


def test_kernel_equals_reference_when_the_residual_runs_out(triton_backend, device) -> None:
    """A target one rounding unit away from the IID draft, and a coin just below 1, reject the
    only child and leave the residual without mass; kernel and reference both restart from
    the target and draw the same extra token."""
    target = torch.tensor(
        [[0.4721868683988603, 0.1141586728203003, 0.4136544587808395], [1 / 3, 1 / 3, 1 / 3]],
        dtype=torch.float64,
    )
    draft = torch.tensor([0.4721868683988601, 0.1141586728203003, 0.4136544587808395])
    tree = DraftTree.from_parents([1], [-1], IID(draft.double()))
    for extra_coin in (0.05, 0.5, 0.95):
        uniforms = torch.tensor([1 - 2**-53, extra_coin], dtype=torch.float64)
        expected = _reference(tree, target, uniforms)
        assert expected.accepted == ()
        assert ops.rejection_verify(tree, target.to(device), uniforms) == expected


def _coins(n: int, seed: int) -> torch.Tensor:
    """RecursiveRejection's coins for one verdict: one row of N + 1 uniforms."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, n + 1, generator=g, dtype=torch.float64)[0]


@pytest.mark.parametrize("kind", LAWS)
def test_reference_makes_recursive_rejections_decisions(make_parents, kind) -> None:  # type: ignore[no-untyped-def]
    """With the coins ``RecursiveRejection`` draws from a seed, over 60 random trees of up to
    10 nodes (V = 7 and 50, temperature 0.7 with top-k 20), the fixed-point reference's
    verdicts equal ``RecursiveRejection(float64)``'s: same coins, same rule (the fixed point
    moves a threshold by about 1e-15, which no coin here lands on)."""
    g = torch.Generator().manual_seed(100 + LAWS.index(kind))
    sampling = SamplingParams(temperature=0.7, top_k=20)
    for trial in range(60):
        vocab = 7 if trial % 2 else 50
        n = int(torch.randint(0, 10, (), generator=g))
        tree, _ = _random_case(kind, n, vocab, g, make_parents(n, g, chain_bias=0.5))
        logits = 3 * torch.randn(n + 1, vocab, generator=g, dtype=torch.float64)
        seed = int(torch.randint(0, 2**31, (), generator=g))
        probs = sampling.probs(logits, torch.float64)
        mine = ops.rejection_verify(tree, probs, _coins(n, seed), kernels="torch")
        theirs = RecursiveRejection(torch.float64, kernels="torch").verify(
            tree, logits, sampling, torch.Generator().manual_seed(seed)
        )
        assert mine == theirs


@pytest.mark.parametrize("kind", LAWS)
def test_verifier_routes_to_the_kernel(triton_backend, device, make_parents, kind) -> None:  # type: ignore[no-untyped-def]
    """``RecursiveRejection(float64, kernels="triton")`` runs the kernel (a spy sees the
    launch) and, over 20 random trees of up to 10 nodes (V = 50, temperature 0.9), gives
    the verdicts of ``kernels="torch"`` from the same seeds."""
    launched = []
    real = ops.kernel_module

    def spy(name: str):  # type: ignore[no-untyped-def]
        launched.append(name)
        return real(name)

    g = torch.Generator().manual_seed(200 + LAWS.index(kind))
    sampling = SamplingParams(temperature=0.9)
    kernel_rule = RecursiveRejection(torch.float64, kernels="triton")
    torch_rule = RecursiveRejection(torch.float64, kernels="torch")
    for _ in range(20):
        n = int(torch.randint(1, 10, (), generator=g))
        tree, _ = _random_case(kind, n, 50, g, make_parents(n, g, chain_bias=0.5))
        logits = 3 * torch.randn(n + 1, 50, generator=g, dtype=torch.float64)
        seed = int(torch.randint(0, 2**31, (), generator=g))
        launched.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ops, "kernel_module", spy)
            mine = kernel_rule.verify(tree, logits.to(device), sampling, _seeded(seed))
        assert launched == ["rejection_verify"]
        assert mine == torch_rule.verify(tree, logits, sampling, _seeded(seed))


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("kind", ["iid", "without_replacement", "deterministic"])
def test_reference_output_law_is_the_target(kind: str) -> None:
    """Fresh draft children every trial (drawn from the law) and fresh coins: the first
    committed token's empirical law over 3,000 trials matches the target's (chi-square,
    alpha = 1e-3, V = 4, a root with three children)."""
    g = torch.Generator().manual_seed(7)
    target = torch.tensor([[0.1, 0.2, 0.3, 0.4]] + [[0.25] * 4] * 3, dtype=torch.float64)
    draft = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    code = {"iid": IID_CODE, "without_replacement": WITHOUT_REPLACEMENT_CODE}.get(kind, 1)
    laws = torch.tensor([code, 0, 0, 0])
    child_ptr, child_idx = reference.children_csr(torch.tensor([-1, -1, -1]))
    counts = torch.zeros(4)
    trials = 3000
    for _ in range(trials):
        if kind == "deterministic":
            kids = torch.tensor([3, 0, 1])
        else:
            kids = torch.multinomial(draft, 3, replacement=kind == "iid", generator=g)
        coins = torch.rand(4, generator=g, dtype=torch.float64)
        packed = reference.rejection_verify(
            target, draft[None], torch.zeros(4, dtype=torch.long), laws, kids, child_ptr,
            child_idx, coins,
        )  # fmt: skip
        first = int(kids[packed[2]]) if int(packed[0]) else int(packed[1])
        counts[first] += 1
    assert chisquare(counts.numpy(), (target[0] * trials).numpy()).pvalue > 1e-3


@pytest.mark.parametrize("law_kind", ["deterministic", "iid", "without_replacement"])
def test_a_coin_of_zero_never_accepts_a_child_of_target_probability_zero(law_kind: str) -> None:
    """The acceptance test is strict (``u * p < r``), as the kernel's: a coin of exactly
    0 on a child the target gives probability 0 rejects it, and the extra token is one
    of positive probability."""
    target = torch.tensor([0.0, 0.6, 0.4], dtype=torch.float64)
    draft = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    law = {
        "deterministic": DETERMINISTIC,
        "iid": IID(draft),
        "without_replacement": WithoutReplacement(draft),
    }[law_kind]
    tree = DraftTree.from_parents([0], [-1], law)
    coins = torch.tensor([[0.0, 0.5]], dtype=torch.float64)  # the child's, the extra token's
    ((accepted, extra),) = reference.tree_rejection_walk(tree, lambda row: target, coins)
    assert accepted == [] and target[extra] > 0


def test_a_repeated_candidate_is_never_accepted_after_its_token_was_rejected() -> None:
    """Fixed candidates may repeat a token; once the first copy is rejected the token's
    residual is 0, so even a coin of exactly 0 rejects the second copy."""
    target = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64)
    tree = DraftTree.from_parents([1, 1], [-1, -1], DETERMINISTIC)
    coins = torch.tensor([[0.9, 0.0, 0.5]], dtype=torch.float64)  # rejects the first copy
    ((accepted, extra),) = reference.tree_rejection_walk(tree, lambda row: target, coins)
    assert accepted == [] and extra == 2  # the residual is the point mass on token 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_rows_masses_are_exact_integer_sums_for_narrow_targets(dtype: torch.dtype) -> None:
    """For float32 and float16 targets (fixed-point weights held as float32), a row's
    mass is the exact integer sum of its weights, as the kernel's int64 sum is: each
    candidate's residual ratio ``r`` is its weight over that exact sum."""
    generator = torch.Generator().manual_seed(3)
    target = torch.rand(1000, generator=generator).to(dtype)
    target = (target / target.sum()).to(dtype)
    weights = reference.fixed_point(target)
    exact = sum(int(w) for w in weights.tolist())
    candidates = [7, 500, 999]
    row = reference.RejectionRow(target, reference.law_code(DETERMINISTIC), None, candidates)
    assert row.residual_mass == exact
    assert row.ratios()[1] == float(weights[7]) / exact
