"""Logits processors and structured output under draft trees, exactly.

What a user sets in ``generate`` — a repetition penalty, banned words, a minimum length,
any transformers ``LogitsProcessor`` that is a function of the prefix, a JSON schema, a
regex or a grammar — is applied to *every row* of a step's tree with that row's own
prefix (:class:`TreeProcessor`), before verification. The verifier then accepts against
the distribution the target has at each node with the processing on, so greedy output
equals ``generate``'s with the same processors and sampled output has the same law.

* :func:`processing_for` — the decoder's factory: a :class:`TreeProcessor` for one
  generation's :class:`~verispec.core.types.GenerationParams`, or None;
* :mod:`verispec.processors.hf` — which transformers processors are exact, and how each
  is called (one batch per depth, one row at a time, or checked on first use);
* :mod:`verispec.processors.grammar` — structured output through ``llguidance``, masked
  at every node, dead nodes pruned before the target scores them;
* :class:`GrammarLogitsProcessor` — the same grammar for plain ``generate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verispec.core.types import GenerationParams
from verispec.errors import ConfigError
from verispec.processors.grammar import (
    GrammarConstraint,
    GrammarLogitsProcessor,
    grammar_text,
    ll_tokenizer,
)
from verispec.processors.hf import classify, config_processors, probe
from verispec.processors.tree import TreeProcessor

__all__ = [
    "GrammarConstraint",
    "GrammarLogitsProcessor",
    "TreeProcessor",
    "classify",
    "config_processors",
    "grammar_text",
    "ll_tokenizer",
    "probe",
    "processing_for",
]


def processing_for(
    config: GenerationParams,
    *,
    prompt_length: int,
    tokenizer: Any,
    eos_token_ids: Sequence[int],
    vocab_size: int,
) -> TreeProcessor | None:
    """One generation's processing (a :data:`verispec.core.engine.ProcessingFactory`).

    Raises:
        ConfigError: a processor is not a function of the prefix, or a constraint is
            given without a tokenizer or does not compile.
    """
    if not config.processes_logits:
        return None
    constraint = None
    if config.constrained:
        if tokenizer is None:
            raise ConfigError(
                "structured output (json_schema, regex, grammar) needs the model's tokenizer; "
                "pass it as SpeculativeDecoder(..., tokenizer=tokenizer)."
            )
        constraint = GrammarConstraint(
            ll_tokenizer(tokenizer, vocab_size, eos_token_ids),
            grammar_text(
                json_schema=config.json_schema, regex=config.regex, grammar=config.grammar
            ),
            vocab_size,
            prompt_length,
        )
    return TreeProcessor(config_processors(config, prompt_length, eos_token_ids), constraint)
