"""The public decoder: the core loop with the package's defaults.

:class:`verispec.core.Engine` is handed its drafter and its verifier and
knows no concrete one. :class:`SpeculativeDecoder` here (``verispec.SpeculativeDecoder``)
is the same class with defaults picked at construction, without any global: the
:class:`~verispec.drafters.Autoregressive` drafter when none is given, and the
:func:`~verispec.verifiers.default_verifier` policy (``Greedy`` at temperature 0,
``Coupled`` otherwise) when no verifier is given; and the logits processing of
:func:`verispec.processors.processing_for` (repetition penalty, ``logits_processor=``,
``json_schema=`` / ``regex=`` / ``grammar=``, applied to every tree row).
"""

from __future__ import annotations

from typing import Any

from verispec.core import engine
from verispec.core._checks import check_decoder_arguments
from verispec.core.engine import VerifierPolicy
from verispec.core.sampling import SamplingParams
from verispec.core.types import Drafter, LanguageModel, Verifier
from verispec.drafters.autoregressive import Autoregressive
from verispec.processors import processing_for
from verispec.verifiers import default_verifier

__all__ = ["SpeculativeDecoder"]


class SpeculativeDecoder(engine.Engine):
    """Lossless speculative decoding of one sequence at a time, with default parts.

    Args:
        target: the model whose distribution the output follows.
        drafter: proposes the draft trees; ``None`` decodes autoregressively.
        verifier: a :class:`~verispec.core.types.Verifier`, or a callable mapping
            :class:`~verispec.core.sampling.SamplingParams` to one; ``None`` uses
            :func:`~verispec.verifiers.default_verifier` (greedy at temperature 0, the
            coupled rule with recursive rejection for draft-model trees otherwise).
        tokenizer: a Hugging Face tokenizer, to accept string prompts, decode text,
            apply stop strings and find the end-of-sequence token.
        kernels: ``"auto"``, ``"triton"`` or ``"torch"``, given to the default policy's
            verifier (:mod:`verispec.kernels.backend`); a ``verifier`` passed in keeps
            its own.
    """

    def __init__(
        self,
        target: LanguageModel,
        drafter: Drafter | None = None,
        verifier: Verifier | VerifierPolicy | None = None,
        tokenizer: Any = None,
        *,
        kernels: str = "auto",
    ) -> None:
        check_decoder_arguments(target, drafter, verifier, tokenizer)
        if verifier is None:
            if kernels != "auto":

                def verifier(sampling: SamplingParams) -> Verifier:
                    return default_verifier(sampling, kernels=kernels)

                verifier(SamplingParams())  # checks `kernels` now, not at the first step
            else:
                verifier = default_verifier
        super().__init__(
            target,
            drafter if drafter is not None else Autoregressive(),
            verifier,
            tokenizer,
            processing=processing_for,
        )
