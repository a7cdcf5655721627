"""Self-speculative drafting: the target's own first layers as its draft model.

A layer-skipping draft (Zhang et al., 2024, "Draft & Verify: Lossless Large
Language Model Acceleration via Self-Speculative Decoding"; Elhoushi et al., 2024,
"LayerSkip") runs a subset of the target's decoder layers, then the target's final
norm and LM head. It shares every weight with the target (nothing is copied) and
keeps its own KV cache, so it is an ordinary :class:`~verispec.core.types.LanguageModel`
that any draft-model drafter can use.

:func:`check_compatible` is the check a drafter runs before pairing two models.
"""

from __future__ import annotations

from collections.abc import Sequence

from verispec.core.types import LanguageModel
from verispec.errors import IncompatibleModelsError
from verispec.models.hf import HFModel

__all__ = ["check_compatible", "parse_layers", "recommended_layers", "self_draft"]

# The measured best skip on SmolLM2-135M (30 layers): dropping layers 13-18 keeps 24 layers
# whose greedy choice agrees with the full model's most often (docs/benchmarks.rst). Early
# layers build the representation and the last ones map it to the vocabulary; the
# middle ones are the most redundant.
_SKIP_START, _SKIP_STOP = 13 / 30, 19 / 30


def recommended_layers(num_layers: int) -> tuple[int, ...]:
    """The default self-draft: every layer except a block in the middle.

    The block starts at 43 % of the depth and spans a fifth of the layers (layers 13-18
    of SmolLM2's 30), the skip measured best for the embedded model. Models with fewer
    than 3 layers keep only their first layer.
    """
    if num_layers < 3:
        return (0,)
    start = round(_SKIP_START * num_layers)
    stop = max(start + 1, round(_SKIP_STOP * num_layers))
    return tuple(i for i in range(num_layers) if not start <= i < stop)


def parse_layers(text: str) -> int | tuple[int, ...]:
    """Parse a layer choice: ``"6"`` (the first 6 layers) or ranges ``"0-12+19-29"``.

    Ranges are inclusive and joined by ``+``; single indices are allowed (``"0-3+29"``).

    Raises:
        ValueError: the text is neither form (the message says which forms are allowed).
    """
    text = text.strip()
    if text.isdigit():
        return int(text)
    layers: list[int] = []
    for part in text.split("+"):
        first, sep, last = part.strip().partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(
                f"an integer n (the first n layers) or inclusive ranges joined by '+', "
                f"e.g. 0-12+19-29; got {text!r}"
            )
        low, high = int(first), int(last if sep else first)
        if high < low:
            raise ValueError(f"a range must run upwards (e.g. 0-12); got {part.strip()!r}")
        layers.extend(range(low, high + 1))
    return tuple(layers)


def self_draft(
    target: HFModel, layers: int | Sequence[int] | None = None, *, max_length: int | None = None
) -> HFModel:
    """A draft model running only ``layers`` of ``target``'s decoder layers.

    Args:
        target: the model to draft for.
        layers: ``n`` for the first ``n`` layers, or strictly increasing layer indices
            (for example ``[0, 1, 2, 3, 29]``); ``None``: :func:`recommended_layers`.
        max_length: context cap; defaults to the target's.

    Raises:
        ConfigError: ``layers`` is empty, out of range, unordered or not an int/sequence.
    """
    if layers is None:
        layers = recommended_layers(target.num_layers)
    return target.self_draft(layers, max_length=max_length)


def check_compatible(target: LanguageModel, draft: LanguageModel) -> None:
    """Raise :class:`IncompatibleModelsError` unless ``draft`` can draft for ``target``.

    The two must share a vocabulary: the same logits width ``vocab_size``, so token
    ``t`` means the same thing to both.
    """
    if target.vocab_size != draft.vocab_size:
        raise IncompatibleModelsError(
            f"the draft model's vocabulary must match the target's; got "
            f"{draft.vocab_size} draft logits for {target.vocab_size} target logits. "
            f"Use a draft from the same model family and tokenizer."
        )
