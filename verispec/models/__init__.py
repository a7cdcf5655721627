"""Model adapters: run a real causal LM over a draft tree (KV cache, tree mask, compaction).

* :class:`FastModel` — the fast runtime: verispec's own Llama-family forward (Llama, Qwen2,
  Mistral), prepacked weights, static KV cache; the default target.
* :class:`HFModel` — a Hugging Face causal LM behind the ``LanguageModel`` protocol (the
  reference, and every architecture the runtime does not cover).
* :func:`load_default_model` — the embedded SmolLM2-135M-Instruct and its tokenizer.
* :func:`self_draft` — a subset of the target's layers as a draft model, sharing weights
  (:func:`recommended_layers` by default; :func:`parse_layers` reads ``0-12+19-29``).
* :func:`tiny_llama`, :func:`tiny_qwen2`, :func:`tiny_mistral` — tiny random models for tests.
"""

from verispec.models.default import load_default_model
from verispec.models.hf import HFModel
from verispec.models.runtime import FastModel
from verispec.models.self_draft import (
    check_compatible,
    parse_layers,
    recommended_layers,
    self_draft,
)
from verispec.models.tiny import tiny_llama, tiny_mistral, tiny_model, tiny_qwen2

__all__ = [
    "FastModel",
    "HFModel",
    "check_compatible",
    "load_default_model",
    "parse_layers",
    "recommended_layers",
    "self_draft",
    "tiny_llama",
    "tiny_mistral",
    "tiny_model",
    "tiny_qwen2",
]
