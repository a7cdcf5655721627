"""Host wrappers of the kernels: validate, allocate, build the grid, dispatch.

Every function here takes ``kernels="auto" | "triton" | "torch"`` and asks
:func:`verispec.kernels.backend.backend_for` which implementation runs: by default its
Triton kernel on CUDA (or under Triton's interpreter when forced) and its PyTorch twin
from :mod:`verispec.kernels.reference` elsewhere; a forced kernel that cannot run
raises :class:`~verispec.errors.KernelUnavailableError` saying why. Launches happen
with the tensors' own CUDA device current, so models split over GPUs work.
Results stay on the device: the verification functions return a packed int64
tensor (``[num_accepted, extra_token, path..., -1...]``) and only
:func:`unpack_verdict` syncs, once.

Shape glossary: B batch, N tree nodes, V vocabulary, S prefix, H heads, D head dim,
K candidates per token.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from verispec.core.tree import IID, Deterministic, DraftTree, WithoutReplacement
from verispec.core.types import Verdict
from verispec.errors import KernelUnavailableError, TreeStructureError
from verispec.kernels import reference
from verispec.kernels._attention_host import (
    attention_blocks,
    attention_warps,
    launch_tree_attention,
    prefix_splits,
    tree_attention,
    triton_cdiv,
)
from verispec.kernels.backend import backend_for, interpreting, kernel_module, launch_device

__all__ = [
    "attention_blocks",
    "attention_warps",
    "prefix_splits",
    "compact_kv",
    "expand_template",
    "greedy_verify",
    "graph_kernels_unavailable",
    "greedy_verify_packed",
    "launch_tree_attention",
    "law_tensors",
    "rejection_verdicts",
    "rejection_verify",
    "rejection_verify_packed",
    "state_device",
    "tree_attention",
    "tree_csr",
    "unpack_verdict",
    "update_adjacency",
]


def graph_kernels_unavailable(device: torch.device | str) -> str | None:
    """Why the graphed runtime's Triton kernels (:mod:`verispec.kernels.graph_ops`: the
    static attention, the batch-invariant products and norms) cannot run on ``device``, or
    ``None`` where they can (CUDA with Triton, or the CPU under the interpreter)."""
    try:
        backend_for("graphed runtime", device, "triton")
    except KernelUnavailableError as error:
        return str(error)
    return None


def _pow2(n: int, floor: int = 1) -> int:
    return max(floor, 1 << max(0, n - 1).bit_length())


def _fail(message: str) -> TreeStructureError:
    return TreeStructureError(message)


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host metadata to ``device`` without a stream synchronisation."""
    return t.to(device, non_blocking=True)


# -- tree structure and verdicts --------------------------------------------------------


def tree_csr(tree: DraftTree, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``(tokens, child_ptr, child_idx)`` on ``device`` and the largest child count (host)."""
    child_ptr, child_idx = reference.children_csr(tree.parents)
    return _to(tree.tokens, device), _to(child_ptr, device), _to(child_idx, device)


def _max_children(tree: DraftTree) -> int:
    return max((len(kids) for kids in tree.children), default=0)


def unpack_verdict(packed: torch.Tensor) -> Verdict:
    """Turn a packed verdict ``[num_accepted, extra_token, path...]`` into a Verdict (one sync)."""
    values = packed.tolist()
    return Verdict(tuple(values[2 : 2 + values[0]]), int(values[1]))


def _check_rows(tree: DraftTree, rows: torch.Tensor, name: str) -> None:
    if rows.dim() != 2 or rows.shape[0] != tree.num_nodes + 1 or not rows.is_floating_point():
        raise _fail(
            f"`{name}` must be a float tensor of shape (N + 1, V) = ({tree.num_nodes + 1}, V); "
            f"got {rows.dtype} {tuple(rows.shape)}."
        )
    if tree.num_nodes and int(tree.tokens.max()) >= rows.shape[1]:
        raise _fail(f"tree tokens must be < V = {rows.shape[1]}; got {int(tree.tokens.max())}.")


# -- greedy verification ----------------------------------------------------------------


def greedy_verify_packed(
    target_logits: torch.Tensor,
    tokens: torch.Tensor,
    child_ptr: torch.Tensor,
    child_idx: torch.Tensor,
    max_children: int,
    *,
    kernels: str = "auto",
) -> torch.Tensor:
    """Greedy verification on device tensors (no host sync); int64 packed verdict (N + 2,)."""
    if backend_for("greedy verification", target_logits.device, kernels) == "torch":
        return reference.greedy_verify(target_logits, tokens, child_ptr, child_idx)
    import triton.language as tl

    module = kernel_module("greedy_verify")
    rows, vocab = target_logits.shape
    best = torch.empty(rows, dtype=torch.long, device=target_logits.device)
    block_v = min(1024, _pow2(vocab, 16)) if not interpreting() else min(256, _pow2(vocab, 16))
    acc = tl.float64 if target_logits.dtype == torch.float64 else tl.float32
    out = torch.full((tokens.numel() + 2,), -1, dtype=torch.long, device=target_logits.device)
    with launch_device(target_logits.device):
        module.row_argmax_kernel[(rows,)](
            target_logits, best, vocab, *target_logits.stride(), BLOCK_V=block_v, ACC_DTYPE=acc
        )
        module.greedy_verify_kernel[(1,)](
            best, tokens, child_ptr, child_idx, out, BLOCK_C=_pow2(max_children, 16)
        )
    return out


def greedy_verify(
    tree: DraftTree, target_logits: torch.Tensor, *, kernels: str = "auto"
) -> Verdict:
    """``verispec.verifiers.Greedy``'s verdict, computed by the kernels (one host sync).

    Args:
        target_logits: float, Shape: (N + 1, V). Row 0 the root, row i + 1 node i.
        kernels: ``"auto"``, ``"triton"`` or ``"torch"`` (:mod:`verispec.kernels.backend`).
    """
    _check_rows(tree, target_logits, "target_logits")
    if backend_for("greedy verification", target_logits.device, kernels) == "torch":
        accepted, extra = reference.tree_greedy_walk(tree, target_logits)
        return Verdict(tuple(accepted), extra)
    tokens, child_ptr, child_idx = tree_csr(tree, target_logits.device)
    packed = greedy_verify_packed(
        target_logits, tokens, child_ptr, child_idx, _max_children(tree), kernels="triton"
    )
    return unpack_verdict(packed)


# -- recursive rejection verification ---------------------------------------------------


def law_tensors(
    tree: DraftTree, vocab_size: int, device: torch.device, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(law_codes (N + 1,), draft_row (N + 1,), draft_probs (M, V))`` for the kernels.

    Raises:
        TreeStructureError: a row with children has no law, or a draft has the wrong shape.
    """
    codes: list[int] = []
    rows: list[int] = []
    drafts: list[torch.Tensor] = []
    for row, law in enumerate(tree.laws):
        has_children = bool(tree.children[row])
        if law is None or not has_children:
            if has_children:
                raise _fail(f"row {row} has children but no proposal law.")
            codes.append(0)
            rows.append(0)
        elif isinstance(law, Deterministic):
            codes.append(reference.DETERMINISTIC_CODE)
            rows.append(0)
        elif isinstance(law, IID | WithoutReplacement):
            if law.draft_probs.shape != (vocab_size,):
                raise _fail(
                    f"`draft_probs` of row {row} must have shape ({vocab_size},); "
                    f"got {tuple(law.draft_probs.shape)}."
                )
            codes.append(
                reference.IID_CODE if isinstance(law, IID) else reference.WITHOUT_REPLACEMENT_CODE
            )
            rows.append(len(drafts))
            drafts.append(law.draft_probs.to(device=device, dtype=dtype))
    stacked = (
        torch.stack(drafts) if drafts else torch.zeros(1, vocab_size, dtype=dtype, device=device)
    )
    codes_t = _to(torch.tensor(codes, dtype=torch.long), device)
    return codes_t, _to(torch.tensor(rows, dtype=torch.long), device), stacked


def rejection_verify_packed(
    target_probs: Tensor, draft_probs: Tensor, draft_row: Tensor, law_codes: Tensor,
    tokens: Tensor, child_ptr: Tensor, child_idx: Tensor, uniforms: Tensor, *,
    kernels: str = "auto",
) -> Tensor:  # fmt: skip
    """Recursive rejection verification on device tensors (no host sync); packed (N + 2,).

    Arguments as :func:`verispec.kernels.reference.rejection_verify`.
    """
    if backend_for("rejection verification", target_probs.device, kernels) == "torch":
        return reference.rejection_verify(
            target_probs, draft_probs, draft_row, law_codes, tokens, child_ptr, child_idx, uniforms
        )
    module = kernel_module("rejection_verify")
    vocab = target_probs.shape[1]
    device = target_probs.device
    scratch = torch.empty(2, vocab, dtype=torch.long, device=device)
    out = torch.full((tokens.numel() + 2,), -1, dtype=torch.long, device=device)
    block_v = min(256 if interpreting() else 1024, _pow2(vocab, 16))
    with launch_device(device):
        module.rejection_verify_kernel[(1,)](
            target_probs, draft_probs, draft_row, law_codes, tokens, child_ptr, child_idx,
            uniforms.to(device=device, dtype=torch.float64), scratch[0], scratch[1], out,
            tokens.numel(), vocab, *target_probs.stride(), *draft_probs.stride(),
            BLOCK_V=block_v,
        )  # fmt: skip
    return out


def rejection_verify(
    tree: DraftTree, target_probs: Tensor, uniforms: Tensor, *,
    probs: Callable[[Tensor], Tensor] | None = None, kernels: str = "auto",
) -> Verdict:  # fmt: skip
    """Recursive rejection sampling over ``tree`` with given draws (one host sync).

    Args:
        target_probs: float, Shape: (N + 1, V). Processed target distribution of each
            row; with ``probs``, the raw rows (logits) that ``probs`` processes.
        uniforms: float64, Shape: (N + 1,). Coin of node i at i; the extra token's at N.
        probs: maps rows of ``target_probs`` (Shape: (..., V)) to distributions, row by
            row (``SamplingParams.probs``): the PyTorch path applies it to the rows the
            walk visits, the kernel to every row at once.
        kernels: ``"auto"``, ``"triton"`` or ``"torch"`` (:mod:`verispec.kernels.backend`).
    """
    if uniforms.shape != (tree.num_nodes + 1,):
        raise _fail(
            f"`uniforms` must have shape ({tree.num_nodes + 1},); got {tuple(uniforms.shape)}."
        )
    (verdict,) = rejection_verdicts(
        tree, target_probs, uniforms.reshape(1, -1), probs=probs, kernels=kernels
    )
    return verdict


def rejection_verdicts(
    tree: DraftTree, target_probs: Tensor, uniforms: Tensor, *,
    probs: Callable[[Tensor], Tensor] | None = None, kernels: str = "auto",
) -> list[Verdict]:  # fmt: skip
    """:func:`rejection_verify` for each row of ``uniforms`` (Shape: (S, N + 1)).

    The one switch of recursive rejection: Triton for CUDA tensors (one launch per
    coin set, the metadata built once), else the twin's walk
    (:func:`verispec.kernels.reference.tree_rejection_walk`), which shares each visited
    row's residuals among the coin sets. Either way set ``s`` gets
    :func:`rejection_verify`'s verdict with coins ``uniforms[s]``.

    Raises:
        TreeStructureError: shapes that do not match the tree, a row with children and
            no law; on the PyTorch path also a child its draft could not have drawn.
    """
    _check_rows(tree, target_probs, "target_probs")
    if uniforms.dim() != 2 or uniforms.shape[1] != tree.num_nodes + 1:
        raise _fail(
            f"`uniforms` must have shape (S, {tree.num_nodes + 1}); got {tuple(uniforms.shape)}."
        )
    device = target_probs.device
    if backend_for("rejection verification", device, kernels) == "torch":

        def target_row(row: int) -> torch.Tensor:
            return target_probs[row] if probs is None else probs(target_probs[row])

        walks = reference.tree_rejection_walk(tree, target_row, uniforms.to("cpu", torch.float64))
        return [Verdict(tuple(path), extra) for path, extra in walks]
    rows = target_probs if probs is None else probs(target_probs)
    rows = rows.to(torch.float64)  # exact for float32 rows: the twin quantises the same values
    codes, draft_row, drafts = law_tensors(tree, rows.shape[1], device)
    tokens, child_ptr, child_idx = tree_csr(tree, device)
    coins = _to(uniforms.to(torch.float64), device)
    csr = (tokens, child_ptr, child_idx)
    packed = [
        rejection_verify_packed(rows, drafts, draft_row, codes, *csr, u, kernels="triton")
        for u in coins
    ]
    return [unpack_verdict(p) for p in packed]


# -- Token Recycling --------------------------------------------------------------------


def state_device(rule: str, device: torch.device | str, kernels: str = "auto") -> torch.device:
    """Where an owner keeps the state that ``rule`` updates from tensors on ``device``:
    ``device`` when the rule's Triton kernel runs there, else the CPU (the PyTorch twin).

    Token Recycling's adjacency matrix asks this before each update, so it follows the
    logits onto a GPU when the kernels run and stays on the host otherwise.
    """
    device = torch.device(device)
    return device if backend_for(rule, device, kernels) == "triton" else torch.device("cpu")


def expand_template(
    adjacency: torch.Tensor,
    root: int,
    parents: torch.Tensor,
    slots: torch.Tensor,
    level_starts: Sequence[int],
    *,
    kernels: str = "auto",
) -> torch.Tensor:
    """Token Recycling's breadth-first template expansion; int64 (N + 1,), row 0 the root.

    Arguments as :func:`verispec.kernels.reference.expand_template` (``TreeTemplate``'s
    ``parents``, ``slots`` and ``level_starts``); ``kernels`` as everywhere here.
    """
    if adjacency.dim() != 2 or adjacency.dtype not in (torch.int32, torch.int64):
        raise _fail(f"`adjacency` must be int32/int64 of shape (V, K); got {adjacency.dtype}.")
    if parents.shape != slots.shape or int(level_starts[-1]) != parents.numel():
        raise _fail("`parents`, `slots` and `level_starts` must describe the same N nodes.")
    device = adjacency.device
    if backend_for("Token Recycling expansion", device, kernels) == "torch":
        return reference.expand_template(adjacency, root, parents, slots, level_starts)
    module = kernel_module("token_recycling")
    n = parents.numel()
    out = torch.empty(n + 1, dtype=torch.long, device=device)
    levels = _to(torch.tensor(list(level_starts), dtype=torch.long), device)
    widest = max((b - a for a, b in itertools.pairwise(level_starts)), default=1)
    with launch_device(device):
        module.token_recycling_kernel[(1,)](
            adjacency, _to(parents, device), _to(slots, device), levels, out,
            int(root), len(level_starts) - 1, adjacency.shape[0], *adjacency.stride(),
            BLOCK=min(_pow2(widest, 16), 256),
        )  # fmt: skip
    return out


def update_adjacency(
    adjacency: torch.Tensor,
    row_tokens: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    kernels: str = "auto",
) -> None:
    """Token Recycling's row update, in place: ``adjacency[row_tokens[i]] = topk_ids[i]``.

    A token at several rows keeps its last row's ids. ``row_tokens``: int64 (M,);
    ``topk_ids``: integer (M, K) with K = ``adjacency.shape[1]``.
    """
    if topk_ids.dim() != 2 or topk_ids.shape != (row_tokens.numel(), adjacency.shape[1]):
        raise _fail(
            f"`topk_ids` must have shape (M, K) = ({row_tokens.numel()}, {adjacency.shape[1]}); "
            f"got {tuple(topk_ids.shape)}."
        )
    device = adjacency.device
    rows, topk = row_tokens.to(device), topk_ids.to(device)
    if backend_for("Token Recycling update", device, kernels) == "torch":
        reference.update_adjacency(adjacency, rows, topk)
        return
    module = kernel_module("token_recycling")
    m = rows.numel()
    block_r = 16 if interpreting() else 64
    with launch_device(device):
        module.adjacency_update_kernel[(triton_cdiv(m, block_r),)](
            adjacency, rows, topk, m, adjacency.shape[1], *adjacency.stride(), *topk.stride(),
            BLOCK_R=block_r, BLOCK_K=_pow2(adjacency.shape[1], 2),
        )  # fmt: skip


# -- KV compaction ----------------------------------------------------------------------


def compact_kv(
    caches: Sequence[torch.Tensor] | torch.Tensor,
    start: int,
    source: torch.Tensor,
    *,
    kernels: str = "auto",
) -> None:
    """Entries ``start + j`` become copies of entries ``source[j]`` in every cache, in place.

    Args:
        caches: tensors of Shape: (..., L, D) (per-layer keys and values, or a stacked
            tensor), on any devices (a model split over GPUs: each device's caches are
            compacted there, with ``source`` copied to it). One launch per device and
            group of equal dtype/shape/strides.
        start: first destination position; ``source[j] >= start + j`` is not required.
        source: int64, Shape: (n,).
        kernels: ``"auto"``, ``"triton"`` or ``"torch"`` (:mod:`verispec.kernels.backend`).
    """
    tensors = [caches] if isinstance(caches, torch.Tensor) else list(caches)
    if not tensors or source.numel() == 0:
        return
    for t in tensors:
        if t.dim() < 2 or start + source.numel() > t.shape[-2]:
            raise _fail(
                f"caches must be (..., L, D) tensors with L >= start + n = "
                f"{start + source.numel()}; got {tuple(t.shape)} on {t.device}."
            )
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    for device, group in by_device.items():
        _compact_on(device, group, start, source.to(device=device, dtype=torch.long), kernels)


def _compact_on(
    device: torch.device,
    tensors: list[torch.Tensor],
    start: int,
    source: torch.Tensor,
    kernels: str,
) -> None:
    """:func:`compact_kv` for caches that all live on ``device``."""
    if backend_for("KV compaction", device, kernels) == "torch":
        reference.compact_kv(tensors, start, source)
        return
    module = kernel_module("kv_compaction")
    groups: dict[Any, list[torch.Tensor]] = {}
    for t in tensors:
        try:
            flat = t.view(-1, t.shape[-2], t.shape[-1])
        except RuntimeError:  # leading dims not flattenable: copy it the reference way
            reference.compact_kv([t], start, source)
            continue
        groups.setdefault((flat.dtype, tuple(flat.shape), flat.stride()), []).append(flat)
    for flats in groups.values():
        base = flats[0]
        size = base.element_size()
        offsets = [(f.data_ptr() - base.data_ptr()) // size for f in flats]
        delta = _to(torch.tensor(offsets, dtype=torch.long), device)
        d = base.shape[-1]
        block_d = min(_pow2(d, 16), 128)
        grid = (len(flats), base.shape[0], triton_cdiv(d, block_d))
        with launch_device(device):
            module.kv_compaction_kernel[grid](
                base, delta, source, start, source.numel(), d, *base.stride(),
                BLOCK_N=_pow2(source.numel(), 16), BLOCK_D=block_d,
            )  # fmt: skip
