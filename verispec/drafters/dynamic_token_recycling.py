"""Dynamic Token Recycling: budget-optimal recycled trees, calibrated online, fused with PLD.

Builds on Token Recycling (Luo et al., ACL 2025; :mod:`verispec.drafters.token_recycling`),
whose authors name "combine TR with dynamic trees" as the next step, and on DySpec's
observation that expanding greedily by estimated acceptance value gives the best tree
for a budget. Not in either paper: everything below is verispec's design.

**Scored adjacency.** Beside each recycled candidate id ``M[t, j]`` the drafter keeps the
score ``S[t, j]`` it had when it was written (``row_topk_scored``: a probability under a
softmax over block maxima), as a uint8 code of its logarithm in steps of 1/16 (code 0
marks an unknown slot). Ids are int16 (offset by 32,768) when V <= 65,536, else int32:
49,152 x 8 x (2 + 1) bytes = 1.125 MiB for SmolLM2.

**Node value.** Every node's children are deterministic candidates, so the verifier
accepts child ``c`` of an accepted row with probability exactly ``q(c)`` (``q`` the
target's processed distribution there), whatever siblings were tried before it (see
docs/methods/dynamic_token_recycling.rst). A node's value — the probability its whole
path is accepted — is therefore its parent's value times its own acceptance estimate,
and the expected tokens per step is ``1 + sum of the values``. The estimate is a table
indexed by depth and score bucket (13 buckets), calibrated online as
``(hits + m prior) / (tries + m)`` over the nodes whose parent was accepted, with
exponential forgetting.

**Tree.** A level-by-level beam over the matrix keeps, at each depth, the ``W`` most
valuable nodes (``W`` the largest budget): every node of the global top ``W`` is in its
level's top ``W``, and a node is never worth more than its parent, so the top ``N`` of
the collected candidates (``N <= W``) are the best connected tree of ``N`` nodes. Each
level is one gather and one top-k: no Python loop over nodes.

**Fusion with prompt lookup.** Continuations of n-gram matches in the context
(:class:`~verispec.drafters.prompt_lookup.PromptLookup`) join the tree with their own
calibrated value (by depth and by the share of matches that agree); a path found by
both sources keeps the larger value.

**Budget.** A fixed ``budget=N``, or ``budget="auto"``: the prefix of the value order
that maximises ``(1 + sum of values) / T(n)`` with ``T`` the target's measured latency
(:mod:`verispec.drafters.budget`).

Exactness: the tree is a function of the drafter's state (matrix, calibration, context),
which only changes in ``observe``; it never depends on the current step's random draws.

Shape glossary: N tree nodes, V vocabulary, K candidates per token.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from verispec.core.tree import DraftTree
from verispec.core.types import DecodeState, StepOutcome
from verispec.drafters.budget import LatencyTable, choose_budget
from verispec.drafters.prompt_lookup import PromptLookup
from verispec.drafters.token_recycling import last_occurrence_mask, row_topk_scored
from verispec.errors import ConfigError, IncompatibleModelsError

__all__ = ["Calibration", "DynamicTokenRecycling", "code_to_score", "score_to_code"]

_TR_EDGES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
_PLD_EDGES = (0.3, 0.45, 0.7, 0.99)
_MAX_RATE = 1.0 - 1e-6  # keeps a child strictly below its parent


class Calibration:
    """Online acceptance rates by depth and score bucket, shrunk toward the bucket's rate.

    A *try* is a node whose parent was accepted (or a child of the root) and a *hit* an
    accepted one. Two levels of pseudo-counts::

        bucket[b]  = (hits[b] + strength * prior[b]) / (tries[b] + strength)
        rate[d, b] = (hits[d, b] + depth_strength * bucket[b]) / (tries[d, b] + depth_strength)

    so sparse (depth, bucket) cells borrow from all depths of their bucket. On logged
    SmolLM2 steps (2,851 tried nodes) the score bucket explains acceptance far better
    than depth, and this shrinkage predicts as well as the bucket alone (log-loss 0.259
    against 0.256) while still following a depth effect where there is one. Counts decay
    by ``decay`` per observed step, so the table follows the text.

    Args:
        edges: bucket edges of the score, increasing in (0, 1).
        prior: float, Shape: (B,). Rate assumed before any observation, B = len(edges) + 1.
        depths: depths tracked; deeper nodes share the last row.
    """

    def __init__(
        self,
        edges: tuple[float, ...],
        prior: torch.Tensor,
        depths: int,
        strength: float,
        decay: float,
        depth_strength: float = 16.0,
    ) -> None:
        self.edges = torch.tensor(edges, dtype=torch.float32)
        self.prior = prior.to(torch.float64)
        self.depths = depths
        self.strength, self.decay, self.depth_strength = strength, decay, depth_strength
        self.hits = torch.zeros(depths, len(edges) + 1, dtype=torch.float64)
        self.tries = torch.zeros_like(self.hits)
        self._code_buckets = torch.bucketize(
            code_to_score(torch.arange(256, dtype=torch.uint8)), self.edges
        )

    def reset(self) -> None:
        self.hits.zero_()
        self.tries.zero_()

    @property
    def num_buckets(self) -> int:
        return len(self.edges) + 1

    def code_buckets(self) -> torch.Tensor:
        """int64, Shape: (256,). Score bucket of every uint8 score code."""
        return self._code_buckets

    def cells(self, depth: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
        """int64 flat cell index of each (depth, score); depth is 1-based. Same shape."""
        bucket = torch.bucketize(score.float(), self.edges)
        row = (depth - 1).clamp(0, self.depths - 1)
        return row * (len(self.edges) + 1) + bucket

    def rates(self) -> torch.Tensor:
        """float64, Shape: (depths * B,). Calibrated acceptance rate of every cell."""
        bucket = (self.hits.sum(0) + self.strength * self.prior) / (
            self.tries.sum(0) + self.strength
        )  # (B,)
        rate = (self.hits + self.depth_strength * bucket) / (self.tries + self.depth_strength)
        return rate.clamp_(1e-9, _MAX_RATE).reshape(-1)

    def update(self, cells: torch.Tensor, tried: torch.Tensor, hit: torch.Tensor) -> None:
        """Count the tried nodes (bool masks, Shape: (N,)) of cells ``cells`` (-1 = none)."""
        self.hits.mul_(self.decay)
        self.tries.mul_(self.decay)
        use = tried & (cells >= 0)
        flat = cells[use]
        self.tries.view(-1).index_add_(0, flat, torch.ones(flat.numel(), dtype=torch.float64))
        self.hits.view(-1).index_add_(0, flat, hit[use].to(torch.float64))


_CODE_STEP = 16.0  # score codes: log(score) in steps of 1/16, code 255 = score 1


def score_to_code(score: torch.Tensor) -> torch.Tensor:
    """uint8 code of scores in (0, 1]: ``255 + 16 ln(score)`` rounded, at least 1 (0 = unknown)."""
    code = torch.round(255.0 + _CODE_STEP * score.float().clamp(min=1e-30).log())
    return code.clamp_(1, 255).to(torch.uint8)


def code_to_score(code: torch.Tensor) -> torch.Tensor:
    """float32 scores of uint8 codes; code 0 (unknown) gives 0."""
    score = torch.exp((code.float() - 255.0) / _CODE_STEP)
    return torch.where(code > 0, score, 0.0)


def _encode(ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (ids - 32768).to(torch.int16) if dtype == torch.int16 else ids.to(dtype)


def _decode(ids: torch.Tensor) -> torch.Tensor:
    return ids.long() + 32768 if ids.dtype == torch.int16 else ids.long()


class DynamicTokenRecycling:
    """Token Recycling with a budget-optimal, calibrated, PLD-fused dynamic tree.

    Args:
        budget: nodes per step, or ``"auto"`` to let the latency table choose each step.
        k: K, candidates recycled per token.
        fusion: add prompt-lookup candidates (``prompt_lookup`` configures them).
        latency: the target's :class:`~verispec.drafters.budget.LatencyTable`, needed by
            ``budget="auto"`` (``verispec.drafters.budget.latency_for(model)``).
        max_budget: most nodes ``"auto"`` may choose (and the beam width).
        max_depth: deepest node considered.
        prompt_lookup: the n-gram matcher used for fusion (default ``PromptLookup()``).
        prior_strength: pseudo-count of the calibration prior.
        decay: per-step forgetting of the calibration counts.
        vocab_size: allocate the matrix now rather than at the first observed step.

    Raises:
        ConfigError: an argument out of range, or ``"auto"`` without a latency table.
    """

    needs_draft_model: ClassVar[bool] = False

    def __init__(
        self,
        budget: int | str = 16,
        k: int = 8,
        *,
        fusion: bool = True,
        latency: LatencyTable | None = None,
        max_budget: int = 64,
        max_depth: int = 12,
        prompt_lookup: PromptLookup | None = None,
        prior_strength: float = 8.0,
        decay: float = 0.999,
        vocab_size: int | None = None,
    ) -> None:
        if budget != "auto" and (isinstance(budget, bool) or not isinstance(budget, int)):
            raise ConfigError(f"`budget` must be an integer >= 0 or 'auto'; got {budget!r}.")
        if isinstance(budget, int) and budget < 0:
            raise ConfigError(f"`budget` must be an integer >= 0 or 'auto'; got {budget!r}.")
        if budget == "auto" and latency is None:
            raise ConfigError(
                "`budget='auto'` needs the target's latency table; pass "
                "`latency=verispec.drafters.budget.latency_for(model)`."
            )
        for name, value, low in (
            ("k", k, 1),
            ("max_budget", max_budget, 1),
            ("max_depth", max_depth, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"`{name}` must be an integer >= {low}; got {value!r}.")
        for name, real, high, allowed in (
            ("decay", decay, 1.0, "in (0, 1]"),
            ("prior_strength", prior_strength, math.inf, "a finite number > 0"),
        ):
            number = isinstance(real, int | float) and not isinstance(real, bool)
            if not number or not 0 < real <= high or real == math.inf:
                raise ConfigError(f"`{name}` must be {allowed}; got {real!r}.")
        if not isinstance(fusion, bool):
            raise ConfigError(f"`fusion` must be True or False; got {fusion!r}.")
        self.budget = budget
        self.k = k
        self.fusion = fusion
        self.latency = latency
        self.max_budget = max_budget if budget == "auto" else int(budget)
        self.max_depth = max_depth
        self.lookup = prompt_lookup if prompt_lookup is not None else PromptLookup()
        tr_prior = (
            torch.tensor((0.0, *_TR_EDGES)) + torch.diff(torch.tensor((0.0, *_TR_EDGES, 1.0))) / 2
        )
        pld_prior = 0.5 * (torch.tensor((0.0, *_PLD_EDGES)) + torch.tensor((*_PLD_EDGES, 1.0))) / 2
        self.tr_calibration = Calibration(_TR_EDGES, tr_prior, 8, prior_strength, decay)
        self.pld_calibration = Calibration(_PLD_EDGES, pld_prior, 8, prior_strength, decay)
        self._ids: torch.Tensor | None = None  # (V, K) int16 (offset) or int32
        self._codes: torch.Tensor | None = None  # (V, K) uint8 score codes, 0 = unknown
        self._last: tuple[DraftTree, torch.Tensor, torch.Tensor] | None = None
        self.last_values = torch.empty(0, dtype=torch.float64)  # values of the last tree's nodes
        if vocab_size is not None:
            self._allocate(vocab_size)

    # -- state ------------------------------------------------------------------------

    def _allocate(self, vocab_size: int) -> None:
        dtype = torch.int16 if vocab_size <= 65536 else torch.int32
        self._ids = torch.zeros(vocab_size, self.k, dtype=dtype)
        self._codes = torch.zeros(vocab_size, self.k, dtype=torch.uint8)

    @property
    def state_bytes(self) -> int:
        """Bytes of the scored adjacency (ids and score codes)."""
        if self._ids is None or self._codes is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (self._ids, self._codes))

    def adjacency(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(int64 ids, float32 scores), Shape: (V, K) each, or ``None`` before the first step."""
        if self._ids is None or self._codes is None:
            return None
        return _decode(self._ids), code_to_score(self._codes)

    def reset(self) -> None:
        """Forget the matrix, the calibration and the context index."""
        if self._codes is not None:
            self._codes.zero_()
        self.tr_calibration.reset()
        self.pld_calibration.reset()
        self.lookup.reset()
        self._last = None

    # -- candidates -------------------------------------------------------------------

    def _recycled(self, root: int, width: int, depth_cap: int) -> tuple[torch.Tensor, ...]:
        """Beam over the scored matrix: tokens, parents, values, depths, cells (Shape: (M,))."""
        ids, codes = self._ids, self._codes
        empty = torch.empty(0, dtype=torch.long)
        if ids is None or codes is None or root >= ids.shape[0] or width == 0:
            return empty, empty, empty.double(), empty, empty
        cal = self.tr_calibration
        buckets = cal.code_buckets()  # (256,)
        rate_of_code = cal.rates().reshape(cal.depths, -1)[:, buckets]  # (depths, 256)
        rate_of_code[:, 0] = 0.0  # unknown slots are worth nothing
        k = ids.shape[1]
        front_tok = torch.tensor([root])
        front_val = torch.ones(1, dtype=torch.float64)
        front_idx = torch.tensor([-1])
        parts: list[tuple[torch.Tensor, ...]] = []
        best = torch.empty(0, dtype=torch.float64)  # the `width` largest values so far
        count = 0
        for depth in range(1, depth_cap + 1):
            row = min(depth, cal.depths) - 1
            child_codes = codes.index_select(0, front_tok).long()  # (F, K)
            value = front_val[:, None] * rate_of_code[row].take(child_codes)  # (F, K)
            top_val, pos = torch.topk(value.reshape(-1), min(width, value.numel()))  # descending
            alive = int(torch.count_nonzero(top_val))
            if alive == 0 or (best.numel() == width and float(top_val[0]) <= float(best[-1])):
                break  # nothing known below, or nothing deeper can enter the top `width`
            top_val, pos = top_val[:alive], pos[:alive]
            parent = pos // k
            tok = _decode(ids.index_select(0, front_tok).take(pos))
            cell = buckets.take(child_codes.take(pos)) + row * cal.num_buckets
            idx = torch.arange(count, count + alive)
            parts.append((tok, front_idx.take(parent), top_val, torch.full_like(pos, depth), cell))
            count += alive
            best = torch.cat([best, top_val])
            if best.numel() > width:
                best = torch.topk(best, width).values
            front_tok, front_val, front_idx = tok, top_val, idx
        if not parts:
            return empty, empty, empty.double(), empty, empty
        return tuple(torch.cat([p[i] for p in parts]) for i in range(5))

    def _looked_up(self, tokens: list[int], depth_cap: int) -> tuple[torch.Tensor, ...]:
        """Prompt-lookup trie with calibrated values: tokens, parents, values, depths, cells."""
        cand = self.lookup.candidates(tokens, max_depth=depth_cap)
        if cand.num_nodes == 0:
            empty = torch.empty(0, dtype=torch.long)
            return empty, empty, empty.double(), empty, empty
        parent_share = torch.where(cand.parents >= 0, cand.share[cand.parents.clamp(min=0)], 1.0)
        agree = cand.share / parent_share  # share of matches that continue this way
        cells = self.pld_calibration.cells(cand.depth, agree)
        rate = self.pld_calibration.rates()[cells]
        value = rate.clone()
        for depth in range(2, int(cand.depth.max()) + 1):  # one op per level: parents first
            at = cand.depth == depth
            value[at] = rate[at] * value[cand.parents[at]]
        return cand.tokens, cand.parents, value, cand.depth, cells

    # -- Drafter protocol -------------------------------------------------------------

    def begin(self, state: DecodeState) -> None:
        """Index the prompt for fusion; the matrix and calibration carry over (hot start)."""
        if self.fusion:
            self.lookup.begin(state)
        self._last = None

    def propose(self, state: DecodeState) -> DraftTree:
        """The most valuable connected tree of the budget's size (see the module notes)."""
        width = min(self.max_budget, state.max_nodes)
        depth_cap = min(self.max_depth, max(width, 1))
        tok, par, val, dep, tr_cell = self._recycled(state.tokens[-1], width, depth_cap)
        if width > 0 and tok.numel() > width:  # the top `width` of the beam: a connected tree
            keep = torch.topk(val, width).indices.sort().values  # sorted: parents first
            remap = torch.full((tok.numel(),), -1, dtype=torch.long)
            remap[keep] = torch.arange(keep.numel())
            par = torch.where(par[keep] >= 0, remap[par[keep].clamp(min=0)], -1)
            tok, val, dep, tr_cell = tok[keep], val[keep], dep[keep], tr_cell[keep]
        pld_cell = torch.full_like(tok, -1)
        if self.fusion and width > 0:
            tok, par, val, dep, tr_cell, pld_cell = self._fuse(
                (tok, par, val, dep, tr_cell, pld_cell), self._looked_up(state.tokens, depth_cap)
            )
        order = torch.argsort(val, descending=True, stable=True)  # parents before children
        if self.budget == "auto":
            assert self.latency is not None
            n = choose_budget(val[order][:width], self.latency, context=len(state.tokens))
        else:
            n = int(self.budget)
        chosen = order[: min(n, width)]
        chosen = chosen[torch.argsort(dep[chosen], stable=True)]  # by depth, then value
        remap = torch.full((tok.numel(),), -1, dtype=torch.long)
        remap[chosen] = torch.arange(chosen.numel())
        parents = par[chosen]
        parents = torch.where(parents >= 0, remap[parents.clamp(min=0)], -1)
        tree = DraftTree.from_parents(tok[chosen], parents)
        self.last_values = val[chosen]
        self._last = (tree, tr_cell[chosen], pld_cell[chosen])
        return tree

    @staticmethod
    def _fuse(
        recycled: tuple[torch.Tensor, ...], looked_up: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, ...]:
        """Union of the two tries by token path; a shared node keeps the larger value."""
        tok, par, val, dep, tr_cell, pld_cell = recycled
        p_tok, p_par, p_val, p_dep, p_cell = looked_up
        if p_tok.numel() == 0:
            return recycled
        u_tok, u_par, u_val = tok.tolist(), par.tolist(), val.tolist()
        u_dep, u_tr, u_pld = dep.tolist(), tr_cell.tolist(), pld_cell.tolist()
        child = {(p, t): i for i, (p, t) in enumerate(zip(u_par, u_tok, strict=True))}
        where: list[int] = []
        for t, p, v, d, c in zip(p_tok.tolist(), p_par.tolist(), p_val.tolist(),
                                 p_dep.tolist(), p_cell.tolist(), strict=True):  # fmt: skip
            parent = where[p] if p >= 0 else -1
            i = child.get((parent, t))
            if i is None:
                i = len(u_tok)
                child[(parent, t)] = i
                u_tok.append(t)
                u_par.append(parent)
                u_val.append(v)
                u_dep.append(d)
                u_tr.append(-1)
                u_pld.append(c)
            else:
                u_val[i] = max(u_val[i], v)
                u_pld[i] = c
            where.append(i)
        long = torch.long
        return (torch.tensor(u_tok, dtype=long), torch.tensor(u_par, dtype=long),
                torch.tensor(u_val, dtype=torch.float64), torch.tensor(u_dep, dtype=long),
                torch.tensor(u_tr, dtype=long), torch.tensor(u_pld, dtype=long))  # fmt: skip

    def observe(self, outcome: StepOutcome) -> None:
        """Recycle the target's top-K at every scored row and calibrate on what was accepted."""
        logits = outcome.target_logits  # (N + 1, V)
        vocab = logits.shape[-1]
        if self._ids is None:
            self._allocate(vocab)
        ids, codes = self._ids, self._codes
        assert ids is not None and codes is not None
        if ids.shape[0] != vocab:
            raise IncompatibleModelsError(
                f"this drafter's matrix has {ids.shape[0]} rows but the target's vocabulary "
                f"has {vocab}; call `reset_vocabulary({vocab})` or use a new drafter."
            )
        k = min(self.k, vocab)
        top, score = row_topk_scored(logits, k)  # (N + 1, K) each
        tree = outcome.tree
        root = outcome.state.tokens[-outcome.verdict.num_committed - 1]
        scored = torch.cat([torch.tensor([root]), tree.tokens])  # (N + 1,)
        keep = last_occurrence_mask(scored)
        rows = scored[keep]
        ids[rows, :k] = _encode(top[keep].cpu(), ids.dtype)
        codes[rows, :k] = score_to_code(score[keep].cpu())
        if self._last is not None and self._last[0] is tree:
            on_path = torch.zeros(tree.num_nodes + 1, dtype=torch.bool)
            on_path[0] = True
            on_path[torch.tensor(outcome.verdict.accepted, dtype=torch.long) + 1] = True
            tried = on_path[tree.parents + 1]
            hit = on_path[1:]
            self.tr_calibration.update(self._last[1], tried, hit)
            if self.fusion:
                self.pld_calibration.update(self._last[2], tried, hit)
        self._last = None
        if self.fusion:
            self.lookup.observe(outcome)

    def reset_vocabulary(self, vocab_size: int) -> None:
        """Reallocate the matrix for a target with another vocabulary (forgets it)."""
        self._allocate(vocab_size)
