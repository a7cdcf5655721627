"""Micro-benchmarks on the CPU: tree construction, drafting time, tree masks,
verification, KV commit.

Sizes are the embedded model's: vocabulary V = 49,152; trees of N = 80 nodes (Token
Recycling's published "2.2.2" template); a SmolLM2-shaped random model (30 layers,
3 key/value heads of 64) for the KV cache. Run::

    .venv/bin/python -m pytest benchmarks/test_micro.py

pytest-benchmark prints min / median / max per case; nothing here asserts a time.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from verispec.bench.methods import METHODS
from verispec.bench.runner import make_context
from verispec.core import IID, DecodeState, DraftTree, SamplingParams, WithoutReplacement
from verispec.decoder import SpeculativeDecoder
from verispec.specs import parse_method
from verispec.verifiers import Coupled, Greedy, RecursiveRejection

V = 49152
N = 80
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=1.0)


def _prompt(length: int = 256, seed: int = 0) -> list[int]:
    """A prompt with repeats (a 64-token block four times), so prompt lookup finds matches."""
    generator = torch.Generator().manual_seed(seed)
    block = torch.randint(V, (64,), generator=generator).tolist()
    return (block * (length // 64 + 1))[:length]


def _state(tokens: list[int], sampling: SamplingParams) -> DecodeState:
    return DecodeState(
        tokens=list(tokens),
        prompt_length=len(tokens),
        sampling=sampling,
        generator=torch.Generator().manual_seed(0),
    )


@pytest.fixture(scope="module")
def tr_tree() -> DraftTree:
    """An 80-node Token Recycling tree over a fully populated random adjacency matrix."""
    from verispec.drafters import TokenRecycling

    drafter = TokenRecycling(template="2.2.2", vocab_size=V)
    adjacency = drafter.adjacency
    assert adjacency is not None
    generator = torch.Generator().manual_seed(1)
    adjacency.copy_(torch.randint(V, adjacency.shape, generator=generator, dtype=torch.int32))
    tree = drafter.propose(_state([5], GREEDY))
    assert tree.num_nodes == N
    return tree


def _logits_accepting(tree: DraftTree, depth: int, seed: int = 2) -> torch.Tensor:
    """Random float32 logits, Shape: (N + 1, V), whose argmax follows the first-child path."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(tree.num_nodes + 1, V, generator=generator)
    row = 0
    for _ in range(depth):
        if not tree.children[row]:
            break
        child = tree.children[row][0]
        logits[row, int(tree.tokens[child])] = 50.0
        row = child + 1
    return logits


# -- 1. tree construction per drafter --------------------------------------------------

_DRAFTER_SPECS = [
    "tr:template=8",
    "tr:template=16",
    "tr:template=32",
    "tr",
    "pld",
    "dtr",
    "suffix",
    "dtr:suffix=true",
    "chain",
    "specinfer",
    "dyspec",
    "rsdc",
    "rsds",
]


@pytest.mark.parametrize("spec_text", _DRAFTER_SPECS)
def test_tree_construction(benchmark: Any, shaped_model: Any, spec_text: str) -> None:
    """Time one ``propose`` of each drafter after a short warm generation (V = 49,152)."""
    spec = parse_method(spec_text, METHODS)
    reason = METHODS[spec.name].availability()
    if reason is not None:
        pytest.skip(reason)
    context = make_context(shaped_model, None)
    drafter = METHODS[spec.name].build(context, spec.params).drafter
    prompt = _prompt()
    warm = SpeculativeDecoder(shaped_model, drafter).generate(prompt, max_new_tokens=8)
    adjacency = getattr(drafter, "adjacency", None)
    if spec.name == "tr" and adjacency is not None:  # a full tree, not the cold-start one
        generator = torch.Generator().manual_seed(1)
        adjacency.copy_(torch.randint(V, adjacency.shape, generator=generator, dtype=torch.int32))
    sampling = SAMPLED if drafter.needs_draft_model else GREEDY
    state = _state(prompt + warm.tokens, sampling)
    if drafter.needs_draft_model:
        tree = benchmark.pedantic(
            drafter.propose, args=(state,), setup=lambda: drafter.begin(state), rounds=5
        )
    else:
        drafter.begin(state)
        tree = benchmark(drafter.propose, state)
    benchmark.extra_info["nodes"] = tree.num_nodes


class _ViewDraft:
    """A stand-in draft model for timing the drafters' own work: its logits are a few
    fixed random rows (float32, V = 49,152, spread like a language model's) returned as
    views, so a draft call costs a few microseconds and ``propose`` times everything
    else: distributions, draws, laws, the trees fed to the draft and the returned tree.
    Rows repeat (32 of them) so that, like a model's freshly written logits, they are
    in the CPU's cache."""

    vocab_size = V
    max_length = 1 << 20

    def __init__(self, rows: int = 32, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.logits = 2.5 * torch.randn(rows, V, generator=generator)
        self.num_committed = 0

    def prefill(self, ids: torch.Tensor) -> None:
        self.num_committed = len(ids) - 1

    def forward_tree(self, tree: DraftTree, *, extend_from: int = 0) -> torch.Tensor:
        rows = tree.num_nodes + 1 - (extend_from + 1 if extend_from else 0)
        if rows <= self.logits.shape[0]:
            return self.logits[:rows]
        return self.logits[torch.arange(rows) % self.logits.shape[0]]

    def commit(self, accepted: Any, extra_token: int) -> None:
        self.num_committed += len(accepted) + 1

    def reset(self) -> None:
        self.num_committed = 0


def _draft_model_drafter(name: str, nodes: int) -> Any:
    """The drafter ``name`` sized to ``nodes`` nodes (64: SpecInfer and RSD-C (4, 4, 4)
    cut to 64, RSD-S 8 x 8; 16: (4, 4), RSD-S 4 x 4)."""
    from verispec.drafters.chain import Chain
    from verispec.drafters.dyspec import DySpec
    from verispec.drafters.rsd_beam import RSDStochasticBeam
    from verispec.drafters.rsd_constant import RSDConstant
    from verispec.drafters.specinfer import SpecInferTree

    draft = _ViewDraft()
    branching = (4, 4, 4) if nodes == 64 else (4, 4)
    side = 8 if nodes == 64 else 4
    return {
        "chain": lambda: Chain(draft, k=nodes),
        "specinfer": lambda: SpecInferTree(draft, branching=branching, budget=nodes),
        "rsdc": lambda: RSDConstant(draft, branching=branching, budget=nodes),
        "rsds": lambda: RSDStochasticBeam(draft, width=side, depth=side),
        "dyspec": lambda: DySpec(draft, budget=nodes),
    }[name]()


@pytest.mark.parametrize("temperature", [0.6, 0.0])
@pytest.mark.parametrize("nodes", [64, 16])
@pytest.mark.parametrize("name", ["chain", "specinfer", "rsdc", "rsds", "dyspec"])
def test_drafting_time(benchmark: Any, name: str, nodes: int, temperature: float) -> None:
    """Time one ``propose`` of a draft-model drafter with a free draft model (V = 49,152,
    float32): the drafting time outside the draft calls. Run on one thread
    (``OMP_NUM_THREADS=1``) to compare with issue 4's 2 ms target."""
    drafter = _draft_model_drafter(name, nodes)
    state = _state([1, 2, 3], SamplingParams(temperature=temperature))
    drafter.begin(state)
    # every decode step allocates the target's (N + 1, V) logits, which keeps glibc from
    # returning freed trees' distributions to the OS (and re-faulting their pages) each step
    torch.empty(N + 1, V).fill_(0.0)
    tree = benchmark.pedantic(drafter.propose, args=(state,), rounds=20, warmup_rounds=2)
    assert tree.num_nodes == nodes
    benchmark.extra_info["nodes"] = tree.num_nodes


def test_token_recycling_update(benchmark: Any, tr_tree: DraftTree) -> None:
    """Time Token Recycling's matrix update after an 80-node step (top-8 of 81 x 49,152)."""
    from verispec.core import StepOutcome
    from verispec.drafters import TokenRecycling

    drafter = TokenRecycling(template="2.2.2", vocab_size=V)
    logits = _logits_accepting(tr_tree, depth=3)
    verdict = Greedy().verify(tr_tree, logits)
    state = _state([5, *verdict.committed_tokens(tr_tree)], GREEDY)
    outcome = StepOutcome(tr_tree, logits, verdict, state)
    benchmark(drafter.observe, outcome)


def _phrase_text(length: int, seed: int) -> list[int]:
    """Text-like tokens from a book of 100 fixed phrases of 2-12 tokens (ids below 5,000):
    every phrase once, then Zipf-weighted picks, so suffixes repeat as they do in prose and
    every token of the continuation has been seen before."""
    generator = torch.Generator().manual_seed(0)  # the same phrase book for every text
    phrases = [
        torch.randint(5000, (int(n),), generator=generator).tolist()
        for n in torch.randint(2, 13, (100,), generator=generator)
    ]
    weights = 1.0 / torch.arange(1, 101, dtype=torch.float64)
    draws = torch.Generator().manual_seed(seed)
    picks = torch.randperm(100, generator=draws).tolist()
    picks += torch.multinomial(weights, length, replacement=True, generator=draws).tolist()
    out: list[int] = []
    for pick in picks:
        out.extend(phrases[pick])
        if len(out) >= length:
            break
    return out[:length]


def _model_free_drafter(spec: str, corpus_tokens: int) -> Any:
    from verispec.drafters import DynamicTokenRecycling, PromptLookup
    from verispec.drafters.suffix import SuffixDrafter
    from verispec.drafters.suffix_corpus import SuffixCorpus

    corpus = SuffixCorpus()
    for seed in range(corpus_tokens // 500):
        corpus.add(_phrase_text(500, 100 + seed))
    return {
        "pld": lambda: PromptLookup(),
        "suffix": lambda: SuffixDrafter(corpus=corpus),
        "dtr": lambda: DynamicTokenRecycling(vocab_size=V),
        "dtr:suffix=true": lambda: DynamicTokenRecycling(
            vocab_size=V, suffix=True, suffix_drafter=SuffixDrafter(corpus=corpus)
        ),
    }[spec]()


@pytest.mark.parametrize("corpus_tokens", [0, 20_000])
@pytest.mark.parametrize("spec", ["pld", "suffix", "dtr", "dtr:suffix=true"])
def test_model_free_drafting_step(benchmark: Any, spec: str, corpus_tokens: int) -> None:
    """Time one decode step's drafting work of a model-free drafter, ``propose`` then
    ``observe`` (V = 49,152; DTR's observe includes its top-8 of (N + 1) x V logits), on a
    1,024-token text-like context that grows by the committed tokens; the target's output
    is a fixed continuation of the same phrase book (greedy: the tree's longest path along
    it is accepted). ``corpus_tokens``: earlier outputs in the suffix corpus. Pass
    ``--benchmark-columns=median`` and read microseconds per step."""
    from verispec.core import StepOutcome, Verdict

    if corpus_tokens and spec in ("pld", "dtr"):
        pytest.skip("no corpus")
    drafter = _model_free_drafter(spec, corpus_tokens)
    text = _phrase_text(1024 + 4000, seed=1)
    state = _state(text[:1024], GREEDY)
    logits = torch.randn(65, V, generator=torch.Generator().manual_seed(2))
    drafter.begin(state)
    for _ in range(20):  # warm: DTR's matrix and every calibration see some steps
        _drafting_step(drafter, state, text, logits, StepOutcome, Verdict)
    benchmark.pedantic(
        _drafting_step,
        args=(drafter, state, text, logits, StepOutcome, Verdict),
        rounds=300,
        warmup_rounds=5,
    )
    benchmark.extra_info["context"] = len(state.tokens)


def _drafting_step(
    drafter: Any, state: DecodeState, text: list[int], logits: torch.Tensor, *types: Any
) -> None:
    step_outcome, verdict_type = types
    tree = drafter.propose(state)
    done = len(state.tokens)
    accepted: list[int] = []
    row = 0
    while True:  # the longest path along the reference continuation
        nxt = [c for c in tree.children[row] if int(tree.tokens[c]) == text[done + len(accepted)]]
        if not nxt:
            break
        accepted.append(nxt[0])
        row = nxt[0] + 1
    verdict = verdict_type(tuple(accepted), text[done + len(accepted)])
    state.tokens.extend(verdict.committed_tokens(tree))
    drafter.observe(step_outcome(tree, logits[: tree.num_nodes + 1], verdict, state))


# -- 2. tree masks ---------------------------------------------------------------------


def test_ancestor_mask(benchmark: Any, tr_tree: DraftTree) -> None:
    """Time DraftTree.ancestor_mask for a fresh 80-node tree (it is cached per tree)."""

    def fresh() -> tuple[tuple[DraftTree], dict]:
        return (DraftTree(tr_tree.tokens, tr_tree.parents, tr_tree.laws),), {}

    mask = benchmark.pedantic(lambda tree: tree.ancestor_mask, setup=fresh, rounds=200)
    assert mask.shape == (N, N)


def test_model_attention_mask(benchmark: Any, shaped_model: Any, tr_tree: DraftTree) -> None:
    """Time the adapter's 4-D attention mask: 512 cached tokens + the 80-node tree."""
    build = getattr(shaped_model, "_attention_mask", None)
    if build is None:
        pytest.skip("the model adapter has no `_attention_mask`")
    tail = torch.cat([torch.ones(N, 1, dtype=torch.bool), tr_tree.ancestor_mask], dim=1)
    mask = benchmark(build, tail, 512, N + 1)
    assert mask.shape[-1] == 512 + N + 1


# -- 3. verification at V = 49,152 and N = 80 ------------------------------------------


def test_greedy_verify(benchmark: Any, tr_tree: DraftTree) -> None:
    """Time Greedy.verify on an 80-node tree whose argmax path is 5 nodes deep."""
    logits = _logits_accepting(tr_tree, depth=5)
    verdict = benchmark(Greedy().verify, tr_tree, logits)
    assert len(verdict.accepted) == 5


def _with_law(tree: DraftTree, law: str) -> DraftTree:
    """The same tree with every inner row drawn i.i.d. / without replacement from random p."""
    if law == "deterministic":
        return tree
    generator = torch.Generator().manual_seed(3)
    rows: list[Any] = []
    kind = IID if law == "iid" else WithoutReplacement
    for children in tree.children:
        if not children:
            rows.append(None)
            continue
        draft_probs = torch.softmax(2 * torch.randn(V, generator=generator), -1)
        draft_probs[tree.tokens[list(children)]] += 0.05  # the drawn tokens carry mass
        rows.append(kind(draft_probs / draft_probs.sum()))
    assert len(rows) == tree.num_nodes + 1
    return DraftTree(tree.tokens, tree.parents, tuple(rows))


@pytest.mark.parametrize("law", ["deterministic", "iid", "without_replacement"])
def test_stochastic_verify(benchmark: Any, tr_tree: DraftTree, law: str) -> None:
    """Time RecursiveRejection.verify at temperature 1 for each proposal law."""
    tree = _with_law(tr_tree, law)
    logits = _logits_accepting(tree, depth=5)
    verifier = RecursiveRejection()
    generator = torch.Generator().manual_seed(4)
    verdict = benchmark(verifier.verify, tree, logits, SAMPLED, generator)
    benchmark.extra_info["accepted"] = len(verdict.accepted)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_coupled_verify(benchmark: Any, tr_tree: DraftTree, top_p: float) -> None:
    """Time Coupled.verify (the default at T > 0 for fixed candidates) at temperature 1:
    one processed row and one Philox row of V uniforms per visited row."""
    logits = _logits_accepting(tr_tree, depth=5)
    sampling = SamplingParams(temperature=1.0, top_p=top_p)
    generator = torch.Generator().manual_seed(4)
    verdict = benchmark(Coupled().verify, tr_tree, logits, sampling, generator, position=100)
    benchmark.extra_info["accepted"] = len(verdict.accepted)


# -- 4. KV commit ----------------------------------------------------------------------


def test_kv_commit_side_branch(benchmark: Any, shaped_model: Any, tr_tree: DraftTree) -> None:
    """Time commit of a side branch (2nd child of the root, then its 1st child) after an
    80-node forward over 512 cached tokens, SmolLM2-shaped cache (30 x 3 x 64)."""
    model = shaped_model
    model.reset()
    model.prefill(torch.tensor(_prompt(512), dtype=torch.long))
    side = tr_tree.children[0][1]
    path = [side, tr_tree.children[side + 1][0]] if tr_tree.children[side + 1] else [side]

    def score() -> None:
        model.forward_tree(tr_tree)

    benchmark.pedantic(model.commit, args=(path, 7), setup=score, rounds=12)
    benchmark.extra_info["context"] = model.num_committed
    model.reset()
