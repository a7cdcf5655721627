"""Position-coupled verification: seeded identity for trees of fixed candidates.

The *coupled rule* draws the target's token at every absolute position ``t`` of the
sequence by the Gumbel-max trick, with noise that depends only on ``(seed, t)``:

    ``x_t = argmax_v  log q_t(v) + G(seed, t, v)``  (equivalently
    ``argmin_v E(seed, t, v) / q_t(v)``, ``E = -log U`` exponential),

where ``q_t`` is the processed target distribution at that position
(:meth:`~verispec.core.sampling.SamplingParams.probs`: temperature, top-k, top-p,
min-p) and ``U`` is a counter-based uniform (Philox4x64-10, Salmon et al. 2011, key
the seed, counter the position). The race is run in two levels, blocks of 256 tokens
then the tokens of the winning block (:func:`seeded_sample`), which has the same law
and needs about 450 noise values instead of V. For a tree of
``Deterministic`` candidates it walks down from the root: at the row of depth ``d``
(absolute position ``t = position + d``) the child whose token equals ``x_t`` is
accepted and becomes the next row; the first row with no such child ends the step
with ``x_t`` as its extra token.

*Exact.* Given the past, the noise values are i.i.d. Exp(1), so ``x_t`` is an exact
draw from ``q_t`` (the exponential race: ``P(argmin_v E_v / q_v = v) = q_v``), and
the noise at ``t`` is used by exactly one row — the committed token at ``t`` — so
the committed sequence has the target's autoregressive law. A child ``c_i`` of a row
is accepted with probability ``q(c_i)``, as under the recursive rule for point-mass
candidates (docs/exactness.rst, "Seeds and reproducibility").

*Seeded identity.* The committed token at ``t`` is a function of ``q_t`` and
``(seed, t)`` only — not of the tree, the step, or how many random numbers anything
else consumed — so every drafter of fixed candidates (Token Recycling, prompt
lookup, Dynamic Token Recycling) and plain autoregressive decoding (the empty tree)
commit the *same tokens* for the same seed and sampling settings.

Trees with a sampled proposal law (``IID``, ``WithoutReplacement``: draft-model
trees) or a mix of laws go to the fallback verifier, recursive rejection sampling
by default: coupling a sampled draft to this noise would cost it acceptance.

Cost per *visited* row (about MAT rows per step, never the whole tree): one processed
target row, its block masses, and about 450 Philox values.

Shape glossary (docs/glossary): N tree nodes, V vocabulary.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from torch import Generator, Tensor

from verispec.core.sampling import SamplingParams
from verispec.core.tree import Deterministic, DraftTree
from verispec.core.types import Verdict, Verifier, check_seed
from verispec.core.validate import integer
from verispec.errors import ConfigError
from verispec.kernels.cpu import draw as cpu_draw
from verispec.verifiers._rules import check_target_logits, follow_target
from verispec.verifiers.recursive import RecursiveRejection

__all__ = ["BLOCK", "Coupled", "position_noise", "seeded_sample"]

_KEY_LIMIT = 1 << 64  # positions and streams are 64-bit Philox words, as seeds are


BLOCK = 256  # tokens per block of the two-level race


def position_noise(seed: int, position: int, stream: int, count: int) -> torch.Tensor:
    """Exponential noise of one position: ``E[i] = -log U(seed, position, stream, i)``.

    ``U(seed, position, stream, i)`` is the ``i``-th 64-bit output of Philox4x64-10
    (Salmon et al. 2011) with key ``seed`` and counter ``position * 2**128 + stream *
    2**64`` (each (position, stream) owns a disjoint counter range), mapped to
    ``(k + 1/2) / 2**53`` with ``k`` its top 53 bits, so ``U`` is in (0, 1) and ``E`` is
    finite and positive. A pure function of its arguments: nothing is consumed, and
    any device or process computes the same values. Stream 0 races the blocks of a
    position, stream ``b + 1`` the tokens of block ``b`` (:func:`seeded_sample`).

    Args:
        seed: integer in [0, 2**64).
        position: absolute position of the token in the sequence, in [0, 2**64).
        stream: integer in [0, 2**64).
        count: how many values, >= 1.

    Returns:
        float64, Shape: (count,), on the CPU.
    """
    seed = check_seed("seed", seed)
    position = integer("position", position, 0, below=_KEY_LIMIT, integral=True)
    stream = integer("stream", stream, 0, below=_KEY_LIMIT, integral=True)
    integer("count", count, 1)
    counter = (position << 128) | (stream << 64)
    bits = np.random.Philox(key=seed, counter=counter).random_raw(count)
    uniform = (bits >> np.uint64(11)).astype(np.float64)
    uniform += 0.5
    uniform *= 2.0**-53
    return torch.from_numpy(np.log(uniform)).neg_()


def _race(noise: torch.Tensor, weights: torch.Tensor) -> int:
    """``argmin_i noise[i] / weights[i]`` over ``weights > 0``: index ``i`` w.p. ∝ weights[i]."""
    return int((noise / weights.to(device="cpu", dtype=torch.float64)).argmin())  # 1/0 = inf


def seeded_sample(target_probs: torch.Tensor, seed: int, position: int) -> int:
    """The target's token at ``position`` for ``seed``: an exact draw from ``target_probs``.

    A two-level exponential race (Gumbel-max by blocks): the vocabulary is cut into
    blocks of :data:`BLOCK` tokens with masses ``Q_b``; block ``b* = argmin_b F_b / Q_b``
    with ``F = position_noise(seed, position, 0, #blocks)``, then the token
    ``argmin_{v in b*} E_v / q_v`` with ``E = position_noise(seed, position, b* + 1, |b*|)``.
    Block ``b`` wins with probability ``Q_b / sum Q`` and token ``v`` of it with
    ``q_v / Q_b``, so ``v`` is drawn with probability ``q_v / sum q`` — the law of a
    one-level race over all V tokens, at the cost of about ``V / BLOCK + BLOCK`` noise
    values instead of V. Block masses are summed in float64.

    Args:
        target_probs: float, Shape: (V,). Non-negative weights with positive mass
            (need not be normalised).
        seed, position: the key of the noise (see :func:`position_noise`).

    Returns:
        The token id. One host sync (two with more than one block).
    """
    vocab_size = target_probs.shape[-1]
    blocks = -(-vocab_size // BLOCK)
    block = 0
    if blocks > 1:
        full = (vocab_size // BLOCK) * BLOCK
        mass = target_probs[:full].reshape(-1, BLOCK).sum(1, dtype=torch.float64)  # (V // BLOCK,)
        if full < vocab_size:
            tail = target_probs[full:].sum(dtype=torch.float64).reshape(1)
            mass = torch.cat([mass, tail])
        block = _race(position_noise(seed, position, 0, blocks), mass)
    start = block * BLOCK
    inside = target_probs[start : start + BLOCK]  # (<= BLOCK,)
    return start + _race(position_noise(seed, position, block + 1, inside.shape[0]), inside)


def _all_deterministic(tree: DraftTree) -> bool:
    return all(law is None or isinstance(law, Deterministic) for law in tree.laws)


class Coupled:
    """The coupled rule for trees of fixed candidates; recursive rejection for the rest.

    Args:
        fallback: the verifier of trees with a sampled (``IID``, ``WithoutReplacement``)
            or mixed proposal law, and of calls without a ``position``; default
            :class:`~verispec.verifiers.RecursiveRejection` with ``dtype`` residuals.
        dtype: precision of the processed target rows, ``torch.float32`` (default) or
            ``torch.float64``; the race itself runs in float64.

    The decoder passes ``position`` (the absolute position of the root's next token,
    ``len(state.tokens)``) to every verifier whose ``keyed_by_position`` is true; the
    seed is the generator's (``generator.initial_seed()``, the run's
    :attr:`~verispec.core.types.GenerationParams.seed`). At temperature 0 the draws
    are the argmax and the verdict equals :class:`~verispec.verifiers.Greedy`'s.
    """

    keyed_by_position: ClassVar[bool] = True

    def __init__(
        self, fallback: Verifier | None = None, dtype: torch.dtype = torch.float32
    ) -> None:
        if dtype not in (torch.float32, torch.float64):
            raise ConfigError(f"`dtype` must be torch.float32 or torch.float64; got {dtype}.")
        if fallback is not None and (isinstance(fallback, type) or not hasattr(fallback, "verify")):
            raise ConfigError(
                f"`fallback` must be a verifier instance (with a `verify` method) or None; "
                f"got {fallback!r}."
            )
        self.dtype = dtype
        self.fallback: Verifier = fallback if fallback is not None else RecursiveRejection(dtype)

    def __repr__(self) -> str:
        return f"Coupled(fallback={self.fallback!r}, dtype={self.dtype})"

    def verify(
        self, tree: DraftTree, target_logits: Tensor, sampling: SamplingParams,
        generator: Generator, *, position: int | None = None,
    ) -> Verdict:  # fmt: skip
        """Keep the path of candidates equal to the target's seeded draws.

        Args:
            tree: the draft tree.
            target_logits: float, Shape: (N + 1, V). Row 0 the root, row i + 1 node i.
            sampling: the processing applied to the target logits.
            generator: its ``initial_seed()`` keys the noise; nothing is drawn from it
                (the fallback draws from it).
            position: absolute position of the token drawn at the root row (the number
                of committed tokens, prompt included); ``None`` sends the tree to the
                fallback, since the draws cannot be keyed without it.

        Raises:
            TreeStructureError: the logits' shape does not match the tree, or a token
                is outside the vocabulary.
            NonFiniteLogitsError: a visited row has NaN or infinite logits.
            ConfigError: ``position`` is not an integer in [0, 2**64).
        """
        if position is None or not _all_deterministic(tree):
            return self.fallback.verify(tree, target_logits, sampling, generator)
        position = integer("position", position, 0, below=_KEY_LIMIT, integral=True)
        check_target_logits(tree, target_logits)
        seed = generator.initial_seed()

        def draw(row: int, depth: int) -> int:
            logits = target_logits[row]  # (V,)
            if self.dtype == torch.float32:  # a float32 CPU row: one C call (same law)
                token = cpu_draw.coupled_draw(logits, sampling, seed, position + depth, BLOCK)
                if token is not None:
                    return token
            return seeded_sample(sampling.probs(logits, self.dtype), seed, position + depth)

        return follow_target(tree, draw)
