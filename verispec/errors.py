"""Exceptions raised at verispec's public boundaries.

Each subclasses the builtin a caller would catch for the same mistake, so
``except ValueError`` keeps working. Messages follow one form: what must hold,
what was given, and a hint where one helps.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ContextLengthError",
    "CorpusFileError",
    "DefaultModelUnavailableError",
    "IncompatibleModelsError",
    "KernelUnavailableError",
    "ModelFileError",
    "NonFiniteLogitsError",
    "TreeStructureError",
    "UnsupportedModelError",
    "VerispecError",
]


class VerispecError(Exception):
    """Base class of every exception verispec raises on purpose."""


class ConfigError(VerispecError, ValueError):
    """A configuration value is out of its allowed range."""


class ModelFileError(ConfigError):
    """A model file or directory cannot be read: not the format it claims, truncated or
    corrupt, a missing weight shard, or an architecture transformers cannot load."""


class TreeStructureError(VerispecError, ValueError):
    """A draft tree is malformed: a parent after its child, a token out of range..."""


class IncompatibleModelsError(VerispecError, ValueError):
    """Two models (or a model and a tokenizer) cannot work together."""


class ContextLengthError(VerispecError, ValueError):
    """A prompt (or prompt plus tree) does not fit the model's context window."""


class CorpusFileError(VerispecError, ValueError):
    """A saved suffix corpus cannot be read: not such a file, another format version, or
    truncated or corrupt data."""


class NonFiniteLogitsError(VerispecError, ValueError):
    """Logits or probabilities contain NaN or infinity where a distribution is needed."""


class UnsupportedModelError(VerispecError, ValueError):
    """A model the fast runtime does not cover (architecture, activation, rotary scaling)."""


class KernelUnavailableError(VerispecError, RuntimeError):
    """A kernel was forced where it cannot run (no Triton, no CUDA...)."""


class DefaultModelUnavailableError(VerispecError, RuntimeError):
    """The embedded default model's package is not installed."""
