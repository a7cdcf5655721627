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
the collected candidates (``N <= W``) are the best connected tree of ``N`` nodes. A
level holds at most ``W K`` candidates, walked in Python over NumPy views of the matrix
(on a CPU, a torch op per level costs more in dispatch than the level's work).

**Fusion with prompt lookup.** Continuations of n-gram matches in the context
(:class:`~verispec.drafters.prompt_lookup.PromptLookup`) join the tree with their own
calibrated value (by depth and by the share of matches that agree); a path found by
both sources keeps the larger value.

**Fusion with suffix matches** (``suffix=True``, in place of prompt lookup). The
continuations of the longest suffix matches in the context and in a corpus of earlier
outputs (:class:`~verispec.drafters.suffix.SuffixDrafter`) join the tree, and after the
union every node is valued again by *agreement*
(:func:`~verispec.drafters.candidates.revalue`): a node only one source proposed takes
a rate calibrated on such nodes of that source, a node several sources agree on the
largest of their rates calibrated on shared nodes. Pooling the two kinds overvalues the
lone nodes (measured on logged SmolLM2 steps: docs/benchmarks.rst, "Measurements once
quoted in docstrings").

**Budget.** A fixed ``budget=N``, or ``budget="auto"``: the prefix of the value order
that maximises ``(1 + sum of values) / T(n)`` with ``T`` the target's measured latency
(:mod:`verispec.drafters.budget`). With ``"auto"`` the candidates are searched no wider
than ``2 n + 8`` and no deeper than ``n + 3`` for the last chosen ``n`` (up to
``max_budget`` and ``max_depth``): where the rule keeps
choosing one or two nodes (a CPU whose tree steps cost several single-token steps), the
beam stays narrow and cheap, and it widens again as soon as larger trees are chosen.
``"auto"`` (the default) also gates drafting on its measured pay-off
(:mod:`verispec.drafters.gate`): while the steps it drafts commit tokens more slowly
than plain decoding would, counting the drafter's own time, it sends the empty tree for
a doubling stretch of steps between probes, so it is never far below plain decoding.

Exactness: the tree is a function of the drafter's state (matrix, calibration, context,
and with ``"auto"`` the gate's clock), which only changes in ``observe``; it never depends
on the current step's random draws. The clock makes ``"auto"``'s trees vary from run to
run, never its output.

Shape glossary: N tree nodes, V vocabulary, K candidates per token.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch

from verispec.core.tree import DraftTree
from verispec.core.types import DecodeState, StepOutcome
from verispec.core.validate import boolean, integer, integer_or_auto, option
from verispec.drafters.budget import LatencyTable
from verispec.drafters.candidates import (
    Calibration,
    CalibrationOptions,
    Candidates,
    Trie,
    fuse,
    revalue,
    tried_and_hit_lists,
    update_by_agreement,
)
from verispec.drafters.gate import DeviceSized
from verispec.drafters.prompt_lookup import PromptLookup
from verispec.drafters.suffix import SOURCES, SuffixDrafter
from verispec.drafters.token_recycling import row_topk_scored
from verispec.errors import ConfigError, IncompatibleModelsError
from verispec.kernels.reference import last_rows

__all__ = [
    "Calibration",
    "DynamicTokenRecycling",
    "DynamicTokenRecyclingOptions",
    "code_to_score",
    "score_to_code",
]

_TR, _PLD, _SUFFIX = 0, 1, 2  # candidate columns: recycled, prompt lookup, suffix sources
_COLUMNS = 2 + len(SOURCES)
_TR_EDGES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
_PLD_EDGES = (0.3, 0.45, 0.7, 0.99)
_CODE_STEP = 16.0  # score codes: log(score) in steps of 1/16, code 255 = score 1
# the values of an empty tree: shared, since a plain step must not build a tensor (after a
# forward has swept the caches, even one torch.empty is a measurable part of a step)
_NO_VALUES = torch.empty(0, dtype=torch.float64)


def score_to_code(score: torch.Tensor) -> torch.Tensor:
    """uint8 code of scores in (0, 1]: ``255 + 16 ln(score)`` rounded, at least 1 (0 = unknown)."""
    return torch.from_numpy(_codes(score.detach().cpu().float().numpy()))


def _codes(score: np.ndarray) -> np.ndarray:
    """:func:`score_to_code` of float32 scores, in NumPy (a drafter codes a few rows a step)."""
    code = np.rint(np.float32(255.0) + np.float32(_CODE_STEP) * np.log(np.maximum(score, 1e-30)))
    return np.clip(code, 1, 255).astype(np.uint8)


def code_to_score(code: torch.Tensor) -> torch.Tensor:
    """float32 scores of uint8 codes; code 0 (unknown) gives 0."""
    score = torch.exp((code.float() - 255.0) / _CODE_STEP)
    return torch.where(code > 0, score, 0.0)


def _encode(ids: np.ndarray | torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """Token ids as the matrix (``dtype``) stores them: offset by -32768 in int16, else as
    they are; in NumPy (a step's few rows: a torch operator costs more than its work)."""
    ids = np.asarray(ids)
    return (ids - 32768).astype(np.int16) if dtype == torch.int16 else ids.astype(np.int32)


def _decode(ids: torch.Tensor) -> torch.Tensor:
    return ids.long() + 32768 if ids.dtype == torch.int16 else ids.long()


@attrs.frozen(kw_only=True)
class DynamicTokenRecyclingOptions(CalibrationOptions):
    """DynamicTokenRecycling's scalar parameters, checked (the one description of them)."""

    budget: int | str = option(
        "auto", integer_or_auto, 0, help="nodes per step, or auto (latency table and gate)"
    )
    k: int = option(8, integer, 1, high=1024, help="candidates recycled per token (K)")
    fusion: bool = option(True, boolean, help="add prompt-lookup candidates")
    suffix: bool = option(False, boolean, help="add suffix-match candidates (context + corpus)")
    max_budget: int = option(64, integer, 1, help="most nodes `auto` may choose")
    max_depth: int = option(12, integer, 1, help="deepest node considered")


_DEFAULT = DynamicTokenRecyclingOptions()  # the defaults of DynamicTokenRecycling's arguments


class DynamicTokenRecycling(DeviceSized):
    """Token Recycling with a budget-optimal, calibrated, PLD-fused dynamic tree.

    Args:
        budget: nodes per step, or ``"auto"`` (the default): the latency table chooses
            each step's size, and a :class:`~verispec.drafters.gate.DraftGate` stops
            drafting while it does not pay (plain decoding steps, with probes).
        k: K, candidates recycled per token.
        fusion: add prompt-lookup candidates (``prompt_lookup`` configures them); not
            with ``suffix=True``, whose context matches cover the same ground.
        suffix: add suffix-match candidates from the context and a corpus
            (``suffix_drafter`` configures them), valued by agreement (module notes).
        latency: the target's :class:`~verispec.drafters.budget.LatencyTable` for
            ``budget="auto"``; by default :class:`verispec.SpeculativeDecoder` binds it
            (``bind_target``: ``verispec.drafters.budget.latency_for(model)``).
        max_budget: most nodes ``"auto"`` may choose (and the beam width).
        max_depth: deepest node considered.
        prompt_lookup: the n-gram matcher used for fusion (default ``PromptLookup()``).
        suffix_drafter: the suffix matcher used with ``suffix=True`` (default
            ``SuffixDrafter()``, with a private corpus; build one on a shared
            :class:`~verispec.drafters.suffix_corpus.SuffixCorpus` to pool outputs).
        prior_strength: pseudo-count of the calibration prior.
        decay: per-step forgetting of the calibration counts.
        vocab_size: allocate the matrix now rather than at the first observed step.

    Raises:
        ConfigError: an argument out of range, or a ``suffix_drafter`` without
            ``suffix=True``; at ``propose``, ``"auto"`` with no latency table given or bound.
    """

    def __init__(
        self,
        budget: int | str = _DEFAULT.budget,
        k: int = _DEFAULT.k,
        *,
        fusion: bool = _DEFAULT.fusion,
        suffix: bool = _DEFAULT.suffix,
        latency: LatencyTable | None = None,
        max_budget: int = _DEFAULT.max_budget,
        max_depth: int = _DEFAULT.max_depth,
        prompt_lookup: PromptLookup | None = None,
        suffix_drafter: SuffixDrafter | None = None,
        prior_strength: float = _DEFAULT.prior_strength,
        decay: float = _DEFAULT.decay,
        vocab_size: int | None = None,
    ) -> None:
        self.options = DynamicTokenRecyclingOptions(
            budget=budget,
            k=k,
            fusion=fusion,
            suffix=suffix,
            max_budget=max_budget,
            max_depth=max_depth,
            prior_strength=prior_strength,
            decay=decay,
        )
        if suffix_drafter is not None and not suffix:
            raise ConfigError("`suffix_drafter` is only used with `suffix=True`; got suffix=False.")
        self.budget = budget
        self.k = k
        self.use_prompt_lookup = bool(fusion) and not suffix
        self.suffix_drafter = suffix_drafter if suffix_drafter is not None else SuffixDrafter()
        self.use_suffix = bool(suffix)
        self._size_by_device(budget == "auto", latency)
        self.max_budget = max_budget if budget == "auto" else int(budget)
        self.max_depth = max_depth
        self.prompt_lookup = prompt_lookup if prompt_lookup is not None else PromptLookup()
        tr_prior = (
            torch.tensor((0.0, *_TR_EDGES)) + torch.diff(torch.tensor((0.0, *_TR_EDGES, 1.0))) / 2
        )
        pld_prior = 0.5 * (torch.tensor((0.0, *_PLD_EDGES)) + torch.tensor((*_PLD_EDGES, 1.0))) / 2
        self.tr_calibration = Calibration(_TR_EDGES, tr_prior, 8, prior_strength, decay)
        self.pld_calibration = Calibration(_PLD_EDGES, pld_prior, 8, prior_strength, decay)
        self._ids: torch.Tensor | None = None  # (V, K) int16 (offset) or int32
        self._codes: torch.Tensor | None = None  # (V, K) uint8 score codes, 0 = unknown
        self._tr_bucket_list: list[int] = torch.bucketize(
            code_to_score(torch.arange(256, dtype=torch.uint8)), self.tr_calibration.edges
        ).tolist()
        # with suffix=True, every source's calibration in two: exclusive and shared nodes
        self._sources = [
            self.tr_calibration,
            self.pld_calibration,
            *self.suffix_drafter.calibrations,
        ]
        self._shared = [calibration.fresh() for calibration in self._sources]
        self._last: tuple[DraftTree, list[list[int]]] | None = None  # the tree and its cells
        self.last_values = _NO_VALUES  # values of the last tree's nodes (never written to)
        # budget="auto": the beam's width follows the sizes the rule chooses (see propose)
        self._auto_width = self.max_budget
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
        """Forget the matrix, the calibration, the context index and the suffix corpus."""
        if self._codes is not None:
            self._codes.zero_()
        self.tr_calibration.reset()
        self.pld_calibration.reset()
        self.prompt_lookup.reset()
        self.suffix_drafter.reset()
        for calibration in self._shared:
            calibration.reset()
        self._auto_width = self.max_budget
        self._last = None

    def remember(self, tokens: list[int]) -> None:
        """Add a document (e.g. a finished answer) to the suffix corpus (``suffix=True``)."""
        if self.use_suffix:
            self.suffix_drafter.remember(tokens)

    # -- candidates -------------------------------------------------------------------

    def _recycled(self, root: int, width: int, depth_cap: int) -> Trie:
        """Beam over the scored matrix, as a trie whose nodes are in beam order.

        Python lists over NumPy views of the matrix: a level holds at most ``width * K``
        candidates (about 100 for the small trees a CPU chooses), where torch ops cost
        more in dispatch than in work."""
        ids, codes = self._ids, self._codes
        if ids is None or codes is None or root >= ids.shape[0] or width == 0:
            return Trie.empty(_COLUMNS)
        cal = self.tr_calibration
        buckets = self._tr_bucket_list  # the calibration bucket of each score code
        rates = cal.rate_rows()  # (depths, B)
        id_rows, code_rows = ids.numpy(), codes.numpy()
        offset = 32768 if ids.dtype == torch.int16 else 0
        nb = cal.num_buckets
        front: list[tuple[int, float, int]] = [(root, 1.0, -1)]  # (token, value, node index)
        tokens: list[int] = []
        parents: list[int] = []
        values: list[float] = []
        depths: list[int] = []
        cells: list[list[int]] = []
        best: list[float] = []  # the `width` largest values so far, descending
        for depth in range(1, depth_cap + 1):
            row = min(depth, cal.depths) - 1
            rate = rates[row]
            level: list[tuple[float, int, int, int]] = []  # (value, token, parent, code)
            for token, value, node in front:
                for token_id, code in zip(
                    id_rows[token].tolist(), code_rows[token].tolist(), strict=True
                ):
                    if code:  # code 0: an unknown slot, worth nothing
                        level.append((value * rate[buckets[code]], token_id, node, code))
            # the `width` most valuable, descending; among equal values the earlier in
            # (parent, slot) order
            top = sorted(range(len(level)), key=lambda i: -level[i][0])[:width]
            if not top or (len(best) == width and level[top[0]][0] <= best[-1]):
                break  # nothing known below, or nothing deeper can enter the top `width`
            front = []
            for i in top:
                value, token_id, node, code = level[i]
                token_id += offset
                front.append((token_id, value, len(tokens)))
                tokens.append(token_id)
                parents.append(node)
                values.append(value)
                depths.append(depth)
                cell = [-1] * _COLUMNS
                cell[_TR] = buckets[code] + row * nb
                cells.append(cell)
            best = sorted(best + [level[i][0] for i in top], reverse=True)[:width]
        return Trie(tokens, parents, values, depths, cells, _COLUMNS)

    def _prompt_lookup_trie(self, tokens: list[int], depth_cap: int) -> Trie:
        """Prompt-lookup trie with calibrated values (parents first, so a parent's value
        is known before its children's)."""
        toks, parents, depths, share, _ = self.prompt_lookup.candidate_lists(
            tokens, max_depth=depth_cap
        )
        if not toks:  # no match: nothing to value
            return Trie.empty(_COLUMNS)
        cal = self.pld_calibration
        rates = cal.rates().tolist()
        values: list[float] = []
        cells: list[list[int]] = []
        for parent, depth, own in zip(parents, depths, share, strict=True):
            # the share of matches that continue this way
            agree = own / share[parent] if parent >= 0 else own
            cell = cal.cell(depth - 1, agree)
            values.append(rates[cell] * (values[parent] if parent >= 0 else 1.0))
            row = [-1] * _COLUMNS
            row[_PLD] = cell
            cells.append(row)
        return Trie(toks, parents, values, depths, cells, _COLUMNS)

    # -- Drafter protocol -------------------------------------------------------------

    def begin(self, state: DecodeState) -> None:
        """Index the prompt for fusion; the matrix and calibration carry over (hot start)."""
        if self.use_prompt_lookup:
            self.prompt_lookup.begin(state)
        if self.use_suffix:
            self.suffix_drafter.begin(state)
        self._last = None
        if self.gate is not None:
            self.gate.reset()

    def propose(self, state: DecodeState) -> DraftTree:
        """The most valuable connected tree of the budget's size (see the module notes);
        with ``budget="auto"``, the empty tree while drafting does not pay
        (:class:`~verispec.drafters.gate.DraftGate`)."""
        if not self.sized_by_device:
            return self._propose(state)
        self._last = None
        self.last_values = _NO_VALUES
        return self._gated_propose(
            "DynamicTokenRecycling(budget='auto')", lambda: self._propose(state)
        )

    def _propose(self, state: DecodeState) -> DraftTree:
        width = min(self.max_budget, state.max_nodes)
        depth_cap = min(self.max_depth, max(width, 1))
        if self.budget == "auto":  # no wider than 2 n + 8, no deeper than n + 3 (n: the last size)
            width = min(width, self._auto_width)
            depth_cap = min(depth_cap, max(self._auto_width // 2 - 1, 1))
        trie = self._recycled(state.tokens[-1], width, depth_cap)
        if width > 0 and trie.num_nodes > width:  # the top `width` of the beam: a connected tree
            trie = trie.take(sorted(trie.by_value()[:width]))
        if self.use_prompt_lookup and width > 0:
            trie = trie.fuse(self._prompt_lookup_trie(state.tokens, depth_cap))
        if self.use_suffix and width > 0:
            found = self.suffix_drafter.candidates(state.tokens, width, depth_cap)
            trie = revalue(fuse(Candidates.from_trie(trie), found.placed(_COLUMNS, _SUFFIX)),
                           self._sources, self._shared).to_trie()  # fmt: skip
        order = trie.by_value()  # parents first
        if self.sized_by_device:
            values = trie.values
            n = self._budget([values[i] for i in order[:width]], len(state.tokens))
            self._auto_width = min(self.max_budget, 2 * n + 8)
        else:
            n = int(self.budget)
        tree, kept = trie.subtree(order[: min(n, width)])
        self.last_values = torch.tensor(kept.values, dtype=torch.float64)
        self._last = (tree, kept.cells)
        return tree

    def observe(self, outcome: StepOutcome) -> None:
        """Recycle the target's top-K at every scored row and calibrate on what was accepted."""
        self._gated_observe(outcome, lambda: self._observe(outcome))

    def _observe(self, outcome: StepOutcome) -> None:
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
        scored = [root, *tree.tokens.tolist()]  # the token of each scored row
        keep = last_rows(scored)  # last writer wins: a token scored twice keeps its later row
        rows = [scored[row] for row in keep]
        ids.numpy()[rows, :k] = _encode(top.cpu().numpy()[keep], ids.dtype)
        codes.numpy()[rows, :k] = _codes(score.cpu().numpy()[keep])
        if self._last is not None and self._last[0] is tree:
            tried, hit = tried_and_hit_lists(tree, outcome.verdict)
            cells = self._last[1]
            if self.use_suffix:
                cell_t = torch.tensor(cells, dtype=torch.long).reshape(len(cells), _COLUMNS)
                update_by_agreement(cell_t, torch.tensor(tried, dtype=torch.bool),
                                    torch.tensor(hit, dtype=torch.bool), self._sources,
                                    self._shared)  # fmt: skip
            else:
                self.tr_calibration.count([c[_TR] for c in cells], tried, hit)
                if self.use_prompt_lookup:
                    self.pld_calibration.count([c[_PLD] for c in cells], tried, hit)
        self._last = None
        if self.use_prompt_lookup:
            self.prompt_lookup.observe(outcome)
        if self.use_suffix:
            self.suffix_drafter.sync(outcome.state.tokens)

    def reset_vocabulary(self, vocab_size: int) -> None:
        """Reallocate the matrix for a target with another vocabulary (forgets it)."""
        self._allocate(vocab_size)
