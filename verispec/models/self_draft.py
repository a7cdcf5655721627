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

__all__ = ["check_compatible", "self_draft"]


def self_draft(
    target: HFModel, layers: int | Sequence[int], *, max_length: int | None = None
) -> HFModel:
    """A draft model running only ``layers`` of ``target``'s decoder layers.

    Args:
        target: the model to draft for.
        layers: ``n`` for the first ``n`` layers, or strictly increasing layer indices
            (for example ``[0, 1, 2, 3, 29]``).
        max_length: context cap; defaults to the target's.

    Raises:
        ConfigError: ``layers`` is empty, out of range, unordered or not an int/sequence.
    """
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
