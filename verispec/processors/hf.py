"""transformers' logits processors under draft trees: which ones are exact, and how each is called.

A processor is exact under a tree when it is a *function of the prefix*: its output row
depends only on that row's ``input_ids`` and scores. Then every tree row, processed with
its own prefix (committed tokens, then the path to its node), gets the distribution the
target would have there with the processor on; rows of one depth have prefixes of one
length, so one call per depth processes them as a batch.

:func:`classify` sorts a processor into

* ``"batch"`` — transformers' processors known to be functions of the prefix, row by row
  (repetition penalty, no-repeat n-gram, bad words, min length, sequence bias, suppress
  tokens, forced BOS/EOS, the warpers, ...): one call per depth;
* ``"row"`` — a function of the prefix that also reads its row's index in the batch
  (``PrefixConstrainedLogitsProcessor`` passes it to the user's function as ``batch_id``):
  called on one row at a time, as ``generate`` calls it with a batch of one;
* ``"probe"`` — a processor written outside transformers: it must be a function of the
  prefix; :func:`probe` checks on first use that it repeats and that it treats rows
  independently, and refuses it otherwise;

and raises :class:`~verispec.errors.ConfigError` naming the processor for those that are
not functions of the prefix (they keep state across calls, run a model, or belong to
encoder-decoder or audio models). :func:`config_processors` builds the processors of
verispec's own :class:`~verispec.core.types.GenerationParams` fields, with transformers'
own classes, in the order ``generate`` builds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from verispec.core.types import GenerationParams
from verispec.errors import ConfigError

__all__ = ["Mode", "classify", "config_processors", "probe"]

Mode = Literal["batch", "row", "probe"]

# transformers' processors whose output row is a function of that row's prefix and scores
_BATCH = frozenset(
    {
        "MinLengthLogitsProcessor",
        "MinNewTokensLengthLogitsProcessor",
        "TemperatureLogitsWarper",
        "RepetitionPenaltyLogitsProcessor",
        "EncoderRepetitionPenaltyLogitsProcessor",  # its "encoder" ids are the fixed prompt
        "TopPLogitsWarper",
        "TopKLogitsWarper",
        "TopHLogitsWarper",
        "MinPLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
        "NoRepeatNGramLogitsProcessor",
        "SequenceBiasLogitsProcessor",
        "NoBadWordsLogitsProcessor",
        "ForcedBOSTokenLogitsProcessor",
        "ForcedEOSTokenLogitsProcessor",
        "InfNanRemoveLogitsProcessor",
        "ExponentialDecayLengthPenalty",
        "LogitNormalization",
        "SuppressTokensAtBeginLogitsProcessor",
        "SuppressTokensLogitsProcessor",
        "WatermarkLogitsProcessor",  # seeds its green list from the row's last tokens
    }
)
_ROW = frozenset({"PrefixConstrainedLogitsProcessor"})
_REFUSED = {
    "ClassifierFreeGuidanceLogitsProcessor": "it needs the unconditional half of a doubled batch",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "it runs the model on a cache of its own "
    "that advances one token per call",
    "SynthIDTextWatermarkLogitsProcessor": "it keeps watermark state across calls",
    "EncoderNoRepeatNGramLogitsProcessor": "it belongs to encoder-decoder models",
    "WhisperTimeStampLogitsProcessor": "it belongs to Whisper's timestamp decoding",
    "WhisperNoSpeechDetection": "it runs the model and keeps state across calls",
    "AlternatingCodebooksLogitsProcessor": "it belongs to Bark's codebooks",
    "BarkEosPrioritizerLogitsProcessor": "it belongs to Bark",
    "DiaClassifierFreeGuidanceLogitsProcessor": "it belongs to Dia's doubled batch",
    "DiaEOSChannelFilterLogitsProcessor": "it belongs to Dia's audio channels",
    "DiaEOSDelayPatternLogitsProcessor": "it keeps Dia's delay state across calls",
}


def _name(processor: object) -> str:
    return type(processor).__name__


def classify(processor: object) -> Mode:
    """How ``processor`` is applied to a tree (module docstring).

    Raises:
        ConfigError: ``processor`` is not a function of the prefix; the message names it.
    """
    name = _name(processor)
    module = type(processor).__module__ or ""
    if name in _REFUSED:
        raise ConfigError(
            f"logits processor `{name}` cannot be applied under draft trees: {_REFUSED[name]}, "
            "so it is not a function of each row's prefix. Drop it, or decode without "
            "speculation."
        )
    if name in _BATCH:
        return "batch"
    if name in _ROW:
        return "row"
    if module.startswith("transformers."):
        raise ConfigError(
            f"logits processor `{name}` ({module}) is not known to verispec to be a function of "
            "the prefix, so it is refused rather than applied with a possible difference."
        )
    return "probe"


def probe(processor: Any, input_ids: torch.Tensor, scores: torch.Tensor) -> None:
    """Check once that a processor written outside transformers is a function of the prefix.

    It is called three times on a batch of two rows built from ``input_ids`` (Shape:
    (1, L)) and ``scores`` (Shape: (1, V)): twice on the batch, which must give the same
    result (no state carried from one call to the next), and once per row, which must
    give that row of the batch (rows treated independently, so one call per depth is
    right). A processor that passes can still change later in ways no probe sees: the
    contract (docs/processors.rst) is that it be a function of ``(input_ids, scores)``.

    Raises:
        ConfigError: a check failed; the message names the processor and the check.
    """
    name = _name(processor)
    other = input_ids.clone()
    other[0, -1] = (int(other[0, -1]) + 1) % scores.shape[-1]
    ids = torch.cat([input_ids, other])
    batch = torch.cat([scores, scores.roll(1, dims=-1)])
    first = processor(ids, batch.clone())
    second = processor(ids, batch.clone())
    if not _same(first, second):
        raise ConfigError(
            f"logits processor `{name}` gave different scores on two calls with the same "
            "input_ids and scores: it keeps state across calls, so it cannot be applied to "
            "the rows of a draft tree exactly. Make it a function of (input_ids, scores)."
        )
    rows = torch.cat([processor(ids[i : i + 1], batch[i : i + 1].clone()) for i in range(2)])
    if not _same(first, rows):
        raise ConfigError(
            f"logits processor `{name}` scores a row differently in a batch than alone: rows "
            "of a draft tree are processed one batch per depth, so it must treat rows "
            "independently."
        )


def _same(a: object, b: object) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return False
    return bool(torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan()))


def config_processors(
    config: GenerationParams, prompt_length: int, eos_token_ids: Sequence[int]
) -> list[Any]:
    """transformers' processors for ``config``'s processing fields, in ``generate``'s order,
    then ``config.logits_processor``.

    Raises:
        ConfigError: ``min_new_tokens`` without an end-of-sequence token to hold back.
    """
    from transformers.generation import logits_process as lp

    processors: list[Any] = []
    if config.repetition_penalty != 1.0:
        processors.append(lp.RepetitionPenaltyLogitsProcessor(penalty=config.repetition_penalty))
    if config.no_repeat_ngram_size:
        processors.append(lp.NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size))
    if config.bad_words_ids:
        processors.append(
            lp.NoBadWordsLogitsProcessor(
                [list(seq) for seq in config.bad_words_ids], eos_token_id=list(eos_token_ids)
            )
        )
    if config.min_new_tokens:
        if not eos_token_ids:
            raise ConfigError(
                f"`min_new_tokens`={config.min_new_tokens} holds back the end-of-sequence token, "
                "but this generation has none; set `eos_token_ids` or give the decoder a "
                "tokenizer."
            )
        processors.append(
            lp.MinNewTokensLengthLogitsProcessor(
                prompt_length, config.min_new_tokens, list(eos_token_ids)
            )
        )
    if config.suppress_tokens:
        processors.append(lp.SuppressTokensLogitsProcessor(list(config.suppress_tokens)))
    return processors + list(config.logits_processor)
