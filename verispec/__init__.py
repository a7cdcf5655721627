"""verispec: lossless speculative decoding with draft trees.

A drafter proposes a tree of likely continuations, the target model scores the
whole tree in one forward pass with tree attention, and a verifier keeps the
longest path it can accept while the output stays distributed exactly as the
target alone would produce it.

In one line, inside transformers' ``generate``::

    out = model.generate(**inputs, custom_generate=verispec.speculative("dtr"),
                         max_new_tokens=128)

Quick start with verispec's own decoder::

    import verispec
    model, tokenizer = verispec.load_default_model()
    drafter = verispec.drafters.TokenRecycling(template="16")
    decoder = verispec.SpeculativeDecoder(model, drafter, tokenizer=tokenizer)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Explain speculative decoding."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    result = decoder.generate(prompt, max_new_tokens=64)
    print(result.text, result.mean_accepted_tokens)
"""

from typing import TYPE_CHECKING, Any

from verispec import errors
from verispec.core import (
    DecodeState,
    DraftTree,
    GenerationParams,
    GenerationResult,
    SamplingParams,
    StepOutcome,
    StreamChunk,
    Verdict,
)

if TYPE_CHECKING:
    from verispec.decoder import SpeculativeDecoder

__version__ = "0.1.0"

__all__ = [
    "DecodeState",
    "DraftTree",
    "FastModel",
    "GenerationParams",
    "GenerationResult",
    "HFModel",
    "SamplingParams",
    "SpeculativeDecoder",
    "StepOutcome",
    "StreamChunk",
    "Verdict",
    "drafter",
    "drafters",
    "errors",
    "load_default_model",
    "load_model",
    "make_target",
    "speculative",
    "verifiers",
]

_LAZY = {
    # the decoder with its defaults imports drafters/ and verifiers/: importing
    # verispec.core alone (which runs this file) must not.
    "SpeculativeDecoder": ("verispec.decoder", "SpeculativeDecoder"),
    # models/ imports transformers, which takes seconds: load it on first use.
    "FastModel": ("verispec.models.runtime", "FastModel"),
    "HFModel": ("verispec.models.hf", "HFModel"),
    "load_default_model": ("verispec.models.default", "load_default_model"),
    "load_model": ("verispec.models.loading", "load_model"),
    "make_target": ("verispec.models.default", "make_target"),
    "speculative": ("verispec.custom_generate", "speculative"),
    "drafter": ("verispec.specs", "drafter"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    if name in ("drafters", "verifiers", "models", "kernels"):
        import importlib

        return importlib.import_module(f"verispec.{name}")
    raise AttributeError(f"module 'verispec' has no attribute {name!r}")
