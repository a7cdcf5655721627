"""The llama.cpp peers: what a CPU user running a GGUF file would reach for.

:class:`LlamaCppRunner` runs ``llama-cpp-python`` (an optional extra:
``pip install 'verispec[llamacpp]'``, which builds llama.cpp from source with a C++
compiler and cmake) on the GGUF file the target was loaded from:

* ``llama-cpp``: plain decoding;
* ``llama-cpp-pld``: its prompt-lookup drafting,
  ``Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size, num_pred_tokens))``.

Both see what every other method sees: the same prompt *token ids* (the chat template
applied by the same tokenizer, fed as ids, not text), the same ``max_new_tokens`` and
end-of-sequence ids (generation stops at the first of them, which is kept), greedy at
temperature 0 (``temp=0``: llama.cpp's greedy sampler), the same number of threads
(``n_threads`` = torch's thread count, for decoding and for the prompt), and the same
wall clock around the whole call, prompt evaluation included. Each call starts from an
empty KV cache (``Llama.reset`` first), so no prompt prefix is reused across calls, as
for the other methods.

llama.cpp computes with the GGUF file's own weights (SmolLM2's are Q4_1: 4-bit blocks),
not the dequantized float32/bfloat16 weights the other methods run: its outputs are a
different model's, and its "identical" column says how often they still match.

Every ``Llama.eval`` call (the prompt, then each decoding step with its drafts) counts
as one target forward, as transformers' forwards do for the ``hf`` peers.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from typing import Any

import torch

from verispec.bench.runner import BenchContext, TurnResult, _decode, measure_call
from verispec.core.types import GenerationConfig
from verispec.errors import ConfigError

__all__ = ["INSTALL_HINT", "LlamaCppRunner", "llama_cpp_available", "llama_cpp_version"]

INSTALL_HINT = (
    "install it with `pip install 'verispec[llamacpp]'` (= `pip install llama-cpp-python`: "
    "builds llama.cpp from source with a C++ compiler and cmake, ~25 min on 2 cores) or run "
    "`VERISPEC_LLAMACPP=1 bash scripts/bench.sh`"
)
_CONTEXT_STEP = 1024  # context sizes are multiples of this: few re-creations


def llama_cpp_available() -> str | None:
    """``None`` when ``llama_cpp`` can be imported here, else why not and how to install it."""
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed; {INSTALL_HINT}."
    return None


def llama_cpp_version() -> str | None:
    """The installed llama-cpp-python version, or ``None``."""
    try:
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:
        return None


class LlamaCppRunner:
    """``llama_cpp.Llama.generate`` on the context's GGUF file.

    Args:
        context: the benchmark context; ``context.gguf`` must name the GGUF file.
        prompt_lookup: ``None`` for plain decoding, else ``(max_ngram_size,
            num_pred_tokens)`` of ``LlamaPromptLookupDecoding``.
        llama_class, lookup_class: the classes to build (default: llama-cpp-python's);
            tests pass stand-ins.

    The ``Llama`` object is created on first use with a context of a multiple of 1024
    tokens that holds the prompt, the answer and a round of drafts, and created again,
    untimed (``setup_s``), when a longer prompt needs more.
    """

    def __init__(
        self,
        context: BenchContext,
        prompt_lookup: tuple[int, int] | None = None,
        *,
        llama_class: Any = None,
        lookup_class: Any = None,
    ) -> None:
        if context.gguf is None:
            raise ConfigError(
                "the llama-cpp peers need the target's GGUF file: use --model smollm2 (the "
                "embedded GGUF) or --model FILE.gguf."
            )
        if llama_class is None or (prompt_lookup is not None and lookup_class is None):
            reason = llama_cpp_available()
            if reason is not None:
                raise ConfigError(reason)
            import llama_cpp
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            llama_class = llama_class or llama_cpp.Llama
            lookup_class = lookup_class or LlamaPromptLookupDecoding
        self.context = context
        self.prompt_lookup = prompt_lookup
        self._llama_class = llama_class
        self._lookup_class = lookup_class
        self.threads = torch.get_num_threads()
        self.llama: Any = None
        self.n_ctx = 0
        self.forwards = 0  # eval calls of the current generation
        self.setup_s = 0.0

    def remember(self, tokens: Sequence[int]) -> None:
        pass

    def reset(self) -> None:
        """Nothing learnt across prompts (llama.cpp's prompt lookup reads only the context)."""

    def _ensure(self, needed: int) -> Any:
        """The ``Llama`` object, with a context of at least ``needed`` tokens."""
        if self.llama is not None and needed <= self.n_ctx:
            return self.llama
        start = time.perf_counter()
        self.n_ctx = -(-needed // _CONTEXT_STEP) * _CONTEXT_STEP
        options: dict[str, Any] = {
            "model_path": str(self.context.gguf),
            "n_ctx": self.n_ctx,
            "n_threads": self.threads,
            "n_threads_batch": self.threads,
            "verbose": False,
        }
        if self.prompt_lookup is not None:
            ngram, tokens = self.prompt_lookup
            options["draft_model"] = self._lookup_class(
                max_ngram_size=ngram, num_pred_tokens=tokens
            )
            # Drafting keeps every row's logits; llama-cpp-python 0.3 sizes that buffer from
            # this argument (n_batch rows without it: prompts past 512 tokens overflow it).
            options["logits_all"] = True
        self.llama = None  # free the old context first
        llama = self._llama_class(**options)
        plain_eval = llama.eval

        def counted_eval(tokens: Sequence[int]) -> Any:
            self.forwards += 1
            return plain_eval(tokens)

        llama.eval = counted_eval
        self.llama = llama
        self.setup_s += time.perf_counter() - start
        return llama

    def _sampling(self, config: GenerationConfig) -> dict[str, Any]:
        if config.temperature == 0:
            return {"temp": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0}
        return {
            "temp": config.temperature,
            "top_k": config.top_k,  # 0 disables it in llama.cpp, as in verispec
            "top_p": config.top_p,
            "min_p": config.min_p,
            "repeat_penalty": 1.0,
        }

    def _generate(self, llama: Any, prompt: list[int], config: GenerationConfig) -> list[int]:
        eos = set(config.eos_token_ids or self.context.eos_token_ids)
        llama.reset()  # an empty cache: no prompt prefix reused from the last call
        if config.temperature > 0:
            llama.set_seed(config.seed)
        tokens: list[int] = []
        stream = llama.generate(prompt, reset=True, **self._sampling(config))
        try:
            for token in stream:
                tokens.append(int(token))
                if int(token) in eos or len(tokens) >= config.max_new_tokens:
                    break
        finally:
            stream.close()
        return tokens

    def run(self, prompt_ids: Sequence[int], config: GenerationConfig) -> TurnResult:
        prompt = [int(t) for t in prompt_ids]
        draft_room = self.prompt_lookup[1] if self.prompt_lookup is not None else 0
        llama = self._ensure(len(prompt) + config.max_new_tokens + draft_room + 1)
        self.forwards = 0
        tokens, seconds, peak = measure_call(
            torch.device("cpu"), lambda: self._generate(llama, prompt, config)
        )
        eos = set(config.eos_token_ids or self.context.eos_token_ids)
        finish = "eos" if tokens and tokens[-1] in eos else "max_new_tokens"
        return TurnResult(
            tokens=tokens,
            text=_decode(self.context.tokenizer, tokens),
            seconds=seconds,
            steps=max(self.forwards, 1),
            committed=len(tokens),
            tree_nodes=0 if self.prompt_lookup is None else None,
            draft_s=0.0 if self.prompt_lookup is None else None,
            target_s=None,
            verify_s=None,
            peak_memory=peak,
            finish_reason=finish,
        )
