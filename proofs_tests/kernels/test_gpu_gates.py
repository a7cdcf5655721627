"""GPU gates: compiled kernels equal their references on shapes too large for the
interpreter; nothing recompiles after warm-up; decoding with every kernel on is
token-identical to greedy decoding with the PyTorch paths.

Every test is marked ``gpu`` and skips without CUDA (``scripts/gpu_check.sh`` runs them).
The smaller kernel tests beside this file also run compiled on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch

from verispec import SpeculativeDecoder
from verispec.core.tree import DETERMINISTIC, IID, DraftTree, WithoutReplacement
from verispec.drafters import PromptLookup, TokenRecycling
from verispec.drafters.templates import resolve_template
from verispec.kernels import ops, reference
from verispec.kernels.backend import kernel_module, use_backend
from verispec.models import HFModel, tiny_llama
from verispec.verifiers import Greedy, RecursiveRejection

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _random_parents(n: int, g: torch.Generator) -> list[int]:
    return [-1] + [int(torch.randint(-1, i, (), generator=g)) for i in range(1, n)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "n", "s", "d"),
    [
        (9, 3, 1, 1, 64),  # one node over one key
        (9, 3, 17, 255, 64),  # one past a tile, a prefix one short of a tile
        (9, 3, 80, 4096, 64),  # Token Recycling's tree over a long prefix: split-K on
        (32, 8, 64, 2048, 128),  # a 7B-shaped layer
        (32, 8, 200, 0, 128),  # no prefix
    ],
)
def test_tree_attention_equals_the_reference(dtype, heads, kv_heads, n, s, d) -> None:  # type: ignore[no-untyped-def]
    """Compiled tree attention equals the float64 reference within the dtype's tolerance on
    random trees with a random prefix mask, at awkward and large shapes (split over the
    prefix where the heuristic picks it), and causal (no tree mask) too."""
    g = torch.Generator().manual_seed(n + s)
    q = torch.randn(1, heads, n, d, generator=g, dtype=torch.float64)
    kp, vp = (torch.randn(1, kv_heads, s, d, generator=g, dtype=torch.float64) for _ in range(2))
    kt, vt = (torch.randn(1, kv_heads, n, d, generator=g, dtype=torch.float64) for _ in range(2))
    tmask = DraftTree.from_parents([0] * n, _random_parents(n, g)).ancestor_mask
    pmask = torch.rand(n, s, generator=g) < 0.9
    args = [t.to(CUDA, dtype) for t in (q, kp, vp, kt, vt)]
    rounded = [a.double().cpu() for a in args]  # the reference sees the kernel's inputs
    for tree_mask, prefix_mask in ((tmask, pmask), (None, None)):
        out = ops.tree_attention(
            *args,
            None if tree_mask is None else tree_mask.to(CUDA),
            prefix_mask=None if prefix_mask is None else prefix_mask.to(CUDA),
            kernels="triton",
        )
        full = torch.ones(n, n, dtype=torch.bool).tril() if tree_mask is None else tree_mask
        expected = reference.tree_attention(
            *rounded, full[None], None if prefix_mask is None else prefix_mask[None]
        )
        assert (out.double().cpu() - expected).abs().max().item() <= TOLERANCE[dtype]


def _law_tree(law: str, vocab: int, g: torch.Generator) -> tuple[DraftTree, torch.Tensor]:
    """The 80-node "2.2.2" tree whose rows draw from ``law``; target probabilities that reject
    often (a draft far from the target), so the walk runs many rejections."""
    parents = resolve_template("2.2.2", 8).parents
    shape = DraftTree.from_parents([0] * 80, parents)
    tokens, laws = [0] * 80, []
    for row in range(81):
        kids = shape.children[row]
        if not kids:
            laws.append(None)
            continue
        draft = torch.softmax(3 * torch.randn(vocab, generator=g, dtype=torch.float64), 0)
        if law == "deterministic":
            drawn, rule = torch.randperm(vocab, generator=g)[: len(kids)], DETERMINISTIC
        elif law == "iid":
            drawn, rule = torch.multinomial(draft, len(kids), True, generator=g), IID(draft)
        else:
            drawn = torch.multinomial(draft, len(kids), False, generator=g)
            rule = WithoutReplacement(draft)
        laws.append(rule)
        for node, token in zip(kids, drawn.tolist(), strict=True):
            tokens[node] = token
    tree = DraftTree.from_parents(tokens, parents, laws)
    probs = torch.softmax(3 * torch.randn(81, vocab, generator=g, dtype=torch.float64), -1)
    return tree, probs


@pytest.mark.parametrize("law", ["deterministic", "iid", "without_replacement"])
@pytest.mark.parametrize("num_warps", [1, 4, 8])
def test_rejection_verification_equals_the_reference_at_full_vocabulary(law, num_warps) -> None:  # type: ignore[no-untyped-def]
    """At V = 49,152 over the 80-node "2.2.2" tree, 30 coin sets per law, the compiled
    rejection kernel's verdict equals the reference's draw for draw with 1, 4 and 8 warps
    (with several warps a missing barrier between a store and another thread's load of the
    scratch residual shows up here as a different verdict)."""
    g = torch.Generator().manual_seed(7)
    tree, probs = _law_tree(law, 49152, g)
    codes, rows, drafts = ops.law_tensors(tree, 49152, CUDA)
    tokens, child_ptr, child_idx = ops.tree_csr(tree, CUDA)
    probs_cuda = probs.to(CUDA)
    module = kernel_module("rejection_verify")
    for _ in range(30):
        coins = torch.rand(81, generator=g, dtype=torch.float64)
        expected = ops.rejection_verify(tree, probs, coins, kernels="torch")
        out = torch.full((82,), -1, dtype=torch.long, device=CUDA)
        scratch = torch.empty(2, 49152, dtype=torch.long, device=CUDA)
        module.rejection_verify_kernel[(1,)](
            probs_cuda, drafts, rows, codes, tokens, child_ptr, child_idx, coins.to(CUDA),
            scratch[0], scratch[1], out, 80, 49152, *probs_cuda.stride(), *drafts.stride(),
            BLOCK_V=1024, num_warps=num_warps,
        )  # fmt: skip
        assert ops.unpack_verdict(out) == expected


def test_greedy_verification_equals_greedy_with_ties_across_blocks() -> None:
    """At V = 49,152 the compiled greedy kernels give ``Greedy``'s verdict on 20 random trees
    of up to 200 nodes whose logits tie across vocabulary blocks (ties go to the lowest id)."""
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        n = int(torch.randint(1, 200, (), generator=g))
        logits = torch.randn(n + 1, 49152, generator=g)
        logits[:, [5, 30000, 49151]] = logits.max() + 1  # a three-way tie in three blocks
        best = logits.argmax(-1)
        parents = _random_parents(n, g)
        tokens = [int(best[p + 1]) if i % 3 else i for i, p in enumerate(parents)]
        tree = DraftTree.from_parents(tokens, parents)
        expected = Greedy(kernels="torch").verify(tree, logits)
        assert Greedy(kernels="triton").verify(tree, logits.to(CUDA)) == expected


def test_token_recycling_and_kv_compaction_equal_the_references() -> None:
    """At V = 49,152, K = 8: the compiled expansion of "2.2.2" from 20 roots and an update of
    81 rows with repeated tokens equal the references; compacting 60 float16 caches of
    4,096 positions with overlapping, out-of-order sources too."""
    g = torch.Generator().manual_seed(5)
    t = resolve_template("2.2.2", 8)
    adjacency = torch.randint(-1, 49152, (49152, 8), generator=g, dtype=torch.int32)
    on_gpu = adjacency.to(CUDA)
    for root in torch.randint(0, 49152, (20,), generator=g).tolist():
        args = (t.parents, t.slots, t.level_starts)
        expected = reference.expand_template(adjacency, root, *args)
        assert torch.equal(
            ops.expand_template(on_gpu, root, *args, kernels="triton").cpu(), expected
        )
    rows = torch.randint(0, 30, (81,), generator=g)
    topk = torch.randint(0, 49152, (81, 8), generator=g)
    reference.update_adjacency(adjacency, rows, topk)
    ops.update_adjacency(on_gpu, rows.to(CUDA), topk.to(CUDA), kernels="triton")
    assert torch.equal(on_gpu.cpu(), adjacency)
    caches = [torch.randn(1, 3, 4096, 64, generator=g).half() for _ in range(60)]
    moved = [c.to(CUDA) for c in caches]
    source = torch.tensor([4000, 3990, 4010, 3991, 4020, 4030])
    reference.compact_kv(caches, 3990, source)
    ops.compact_kv(moved, 3990, source.to(CUDA), kernels="triton")
    assert all(torch.equal(a.cpu(), b) for a, b in zip(moved, caches, strict=True))


def _compiled_kernel_count() -> int:
    """Compiled binaries held by every kernel's cache on the current device."""
    total = 0
    for name in ("tree_attention", "greedy_verify", "rejection_verify", "token_recycling",
                 "kv_compaction"):  # fmt: skip
        module = kernel_module(name)
        for attr in dir(module):
            fn = getattr(module, attr)
            caches = getattr(fn, "device_caches", None)
            if caches:
                total += sum(len(entry[0]) for entry in caches.values())
    return total


def _pair(dtype: torch.dtype) -> tuple[HFModel, HFModel]:
    """The same tiny Llama twice (4 heads of D = 64: a real head size), sdpa and verispec."""
    make = dict(dtype=dtype, device=CUDA, seed=4, max_length=512, hidden_size=256)
    reference_model, kernel_model = tiny_llama(**make), tiny_llama(**make)
    return reference_model, HFModel(kernel_model.hf_model, attention="verispec")


PROMPT = [3, 17, 5, 9, 22, 41, 8, 30, 12, 7, 50, 2, 19, 3, 17, 5, 9]


def test_no_recompile_after_warm_up() -> None:
    """After two warm-up generations of Token Recycling with every kernel on (greedy, then
    sampled), three more from longer prompts (so every length, offset and cache stride
    differs) compile nothing new: the kernel caches hold as many binaries before as after.
    float32, whose attention tiles do not depend on the number of queries (16-bit inputs
    compile once per tile bucket: N <= 16, <= 64, > 64)."""
    _, model = _pair(torch.float32)
    decoder = SpeculativeDecoder(model, TokenRecycling("16", kernels="triton"), kernels="triton")
    decoder.generate(PROMPT, max_new_tokens=48)
    decoder.generate(PROMPT * 2, max_new_tokens=48, temperature=0.8)
    warm = _compiled_kernel_count()
    assert warm > 0
    for repeat, temperature in ((3, 0.0), (5, 0.8), (7, 0.0)):
        decoder.generate(PROMPT * repeat, max_new_tokens=64, temperature=temperature)
    assert _compiled_kernel_count() == warm


@pytest.mark.parametrize("drafter", ["tr", "pld"])
def test_greedy_decoding_with_every_kernel_is_token_identical(drafter: str) -> None:
    """On a float64 tiny Llama on the GPU, 64 greedy tokens with the Triton attention, KV
    compaction, Token Recycling and greedy kernels equal the tokens of sdpa with every
    PyTorch path, for Token Recycling and prompt lookup."""
    reference_model, kernel_model = _pair(torch.float64)

    def make(kernels: str):  # type: ignore[no-untyped-def]
        return TokenRecycling("16", kernels=kernels) if drafter == "tr" else PromptLookup()

    with use_backend("torch"):
        expected = SpeculativeDecoder(reference_model, make("torch")).generate(
            PROMPT, max_new_tokens=64
        )
    got = SpeculativeDecoder(kernel_model, make("triton"), kernels="triton").generate(
        PROMPT, max_new_tokens=64
    )
    assert got.tokens == expected.tokens
    assert got.mean_accepted_tokens == expected.mean_accepted_tokens


def test_sampled_decoding_with_the_rejection_kernel_matches_float64() -> None:
    """At temperature 0.8, the same seed, 48 tokens: the rejection kernel (fixed point) with
    the kernels' attention gives the tokens of sdpa + ``RecursiveRejection(float64)``."""
    reference_model, kernel_model = _pair(torch.float64)
    with use_backend("torch"):
        expected = SpeculativeDecoder(
            reference_model, TokenRecycling("8"), RecursiveRejection(torch.float64)
        ).generate(PROMPT, max_new_tokens=48, temperature=0.8, seed=5)
    got = SpeculativeDecoder(
        kernel_model, TokenRecycling("8", kernels="triton"), RecursiveRejection(kernels="triton")
    ).generate(PROMPT, max_new_tokens=48, temperature=0.8, seed=5)
    assert got.tokens == expected.tokens
