"""verispec inside transformers' ``generate``: ``custom_generate=verispec.speculative("dtr")``.

transformers 5 lets ``generate`` hand its decoding loop to a callable
(``model.generate(**inputs, custom_generate=fn, ...)``): it prepares the inputs, the
generation config, the logits processors and the stopping criteria as usual, then calls
``fn(model, input_ids, logits_processor=..., stopping_criteria=..., generation_config=...,
**model_kwargs)`` and returns what ``fn`` returns. :func:`speculative` builds such a
callable around verispec's :class:`~verispec.decoder.SpeculativeDecoder`:

* the model runs on verispec's fast runtime where it covers the architecture (Llama,
  Qwen2, Mistral), else through the Hugging Face adapter
  (:func:`verispec.models.default.make_target`); the wrapped model is built once per
  model and kept on it, rebuilt only when its weights change;
* the generation config is honoured: ``max_new_tokens``/``max_length``, ``do_sample``,
  ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``eos_token_id``,
  ``return_dict_in_generate``; ``streamer`` receives each step's committed tokens;
  ``stop_strings`` and ``seed`` are read as keyword arguments of ``generate`` (below);
* the logits processors ``generate`` builds (repetition penalty, no-repeat n-gram, bad
  words, min new tokens, sequence bias, suppress tokens, forced BOS/EOS, the typical,
  epsilon, eta and top-h warpers, ``prefix_allowed_tokens_fn``...) and the caller's
  ``logits_processor=[...]`` are applied to every tree row with its own prefix
  (:mod:`verispec.processors`); ``json_schema``, ``regex`` or ``grammar`` given to
  :func:`speculative` constrain the output;
* what cannot be honoured exactly raises :class:`~verispec.errors.ConfigError`, naming
  the option: beams, several sequences, padding, an assistant model, other decoding
  methods (contrastive search, DoLa, constrained beam search, MTP drafting), processors
  that are not functions of the prefix (classifier-free guidance, SynthID), custom
  stopping criteria, score outputs.

Two gaps of transformers 5 (5.17 to 5.23 read) that this module works around:
``generate`` does not pass ``streamer`` (nor ``tokenizer``) to a callable
``custom_generate``: the streamer is read from the calling ``generate`` frame; and
``stop_strings`` with a ``tokenizer`` fail before the callable runs (the tokenizer is
dropped), so the callable takes ``stop_strings`` as its own keyword (popped before
transformers sees it) and the tokenizer from ``speculative(..., tokenizer=...)``.

Greedy outputs equal ``model.generate(...)``'s (the target's own greedy decoding);
sampled outputs follow the same processed distribution, from verispec's own seeded
generator (seeded from torch's global generator unless ``seed=`` is given, so
``torch.manual_seed`` makes a call repeat).
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import attrs
import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerationMixin

from verispec.core.engine import GenerationResult, require_tokenizer_for_stop_strings
from verispec.core.types import (
    Drafter,
    GenerationParams,
    LanguageModel,
    check_seed,
    random_seed,
)
from verispec.core.validate import boolean
from verispec.decoder import SpeculativeDecoder
from verispec.errors import ConfigError
from verispec.kernels.backend import Kernels, check_kernels
from verispec.processors import classify

if TYPE_CHECKING:
    from verispec.models.default import DType, Runtime

__all__ = ["SpeculativeGenerate", "SpeculativeGenerateOutput", "speculative", "target_for"]

_STOPS = {"MaxLengthCriteria", "EosTokenCriteria"}


@dataclass
class SpeculativeGenerateOutput(GenerateDecoderOnlyOutput):
    """``generate``'s output (``return_dict_in_generate=True``) with the acceptance figures.

    Attributes:
        sequences: prompt and new tokens, int64, Shape: (1, S).
        mean_accepted_tokens: tokens committed per target forward (MAT).
        num_steps: target forwards after the prefill.
        tree_sizes: draft nodes sent to the target at each step.
        accepted_lengths: draft tokens accepted at each step (the extra token not counted).
        spec_decode_metrics: the request's figures, named as vLLM's spec-decode metrics
            (:meth:`~verispec.core.engine.GenerationResult.spec_decode_metrics`).
        result: verispec's :class:`~verispec.core.engine.GenerationResult` (timings too).
    """

    mean_accepted_tokens: float | None = None
    num_steps: int | None = None
    tree_sizes: tuple[int, ...] | None = None
    accepted_lengths: tuple[int, ...] | None = None
    spec_decode_metrics: dict[str, Any] | None = None
    result: GenerationResult | None = None


def _fingerprint(hf_model: Any) -> tuple:
    """Changes when a parameter is replaced, cast, reshaped or modified in place: its address,
    dtype, shape and version counter, and its content's row and column sums
    (:func:`_marginals`), which see the edits that leave the version counter as it was
    (through ``.data``, or in ``no_grad``), reorderings included."""
    return tuple(
        (p.data_ptr(), p._version, p.dtype, tuple(p.shape), _marginals(p))
        for p in hf_model.parameters()
    )


# words of 1, 2, 4 or 8 bytes as unsigned integers, and as the signed ones of a device's sums
_WORDS = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}
_SIGNED_WORDS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_BLOCK_BYTES = 1 << 19  # rows summed at a time: both sums read them while they are in cache


def _marginals(tensor: torch.Tensor) -> tuple[bytes, bytes]:
    """The row sums and the column sums of ``tensor``'s bits, read as a matrix of words.

    The rows are the tensor's first dimension; a row's bytes are cut into 8-byte words (into
    its elements where its length is not a multiple of 8 bytes; an element wider than 8
    bytes counts as its 8-byte words); each word is an unsigned integer, and the sums wrap
    modulo 2**(its bits).

    What this sees: an edit of one element changes its word (its words, if it is wider than
    8 bytes) by less than 2**(the word's bits), so it changes its column's sum, and its
    row's if it is 8 bytes at most. A swap of two unequal elements of 8 bytes at most (any
    but a complex dtype) changes the sums of both rows (other rows), of both words'
    columns (one row), or the one word that holds both. A reordering of rows permutes the
    row sums, so it changes them unless the rows it moves have equal sums. An edit goes
    unseen only if it keeps every row sum and every column sum. Integers, so the sums are
    exact; and, unlike one sum of the whole tensor, they depend on where each value is."""
    import numpy as np

    tensor = tensor.detach()
    if tensor.numel() == 0:
        return b"", b""
    rows = tensor.shape[0] if tensor.ndim else 1
    row_bytes = tensor.numel() // rows * tensor.element_size()
    width = 8 if row_bytes % 8 == 0 else min(tensor.element_size(), 8)
    flat = tensor.contiguous().reshape(-1).view(torch.uint8)
    if flat.device.type != "cpu":
        return _device_marginals(flat, rows, width)
    words = flat.numpy().view(_WORDS[width]).reshape(rows, -1)
    word = words.dtype
    row_sums = np.empty(rows, word)
    column_sums = np.zeros(words.shape[1], word)
    step = max(1, _BLOCK_BYTES // row_bytes)
    for start in range(0, rows, step):
        block = words[start : start + step]
        np.add.reduce(block, axis=1, dtype=word, out=row_sums[start : start + step])
        column_sums += np.add.reduce(block, axis=0, dtype=word)
    return row_sums.tobytes(), column_sums.tobytes()


def _device_marginals(flat: torch.Tensor, rows: int, width: int) -> tuple[bytes, bytes]:
    """:func:`_marginals` of a tensor's bytes ``flat`` summed where they are (a GPU's), as
    signed integers of the words' width: their sums wrap to the unsigned sums' bits."""
    words = flat.view(_SIGNED_WORDS[width]).reshape(rows, -1)
    return (
        words.sum(1, dtype=words.dtype).cpu().numpy().tobytes(),
        words.sum(0, dtype=words.dtype).cpu().numpy().tobytes(),
    )


def target_for(
    hf_model: Any,
    *,
    runtime: Runtime = "auto",
    dtype: torch.dtype | DType | None = None,
    max_length: int | None = None,
) -> Any:
    """The verispec model wrapping ``hf_model``, built once and kept on it.

    :func:`~verispec.models.default.make_target` builds it (the fast runtime where it
    covers the architecture, else the adapter); later calls with the same options return
    the same object while ``hf_model``'s parameters are unchanged (same tensors, dtypes,
    shapes, version counters and row and column sums of their bits: :func:`_fingerprint`),
    and build a new one otherwise. So whatever edited the weights (``.data``, ``copy_``
    under ``no_grad``, ``load_state_dict``, a replaced parameter, ``to(dtype)``), the next
    generation uses the current ones, provided the edit changes a parameter's address,
    dtype, shape or version counter, or one of those sums: any edit of a single element
    does, and any swap of two unequal elements (:func:`_marginals` says what else).

    ``max_length=None`` takes the context cap that :func:`~verispec.models.loading.load_model`
    (or :func:`~verispec.models.default.load_default_model`, which calls it) recorded on
    ``hf_model`` (its own ``max_length=``), else the model's whole context.
    """
    from verispec.models.default import make_target
    from verispec.models.loading import MAX_LENGTH_ATTRIBUTE

    if max_length is None:
        max_length = getattr(hf_model, MAX_LENGTH_ATTRIBUTE, None)
    key = (runtime, str(dtype), max_length)
    cache: dict = hf_model.__dict__.setdefault("_verispec_targets", {})
    fingerprint = _fingerprint(hf_model)
    kept = cache.get(key)
    if kept is not None and kept[0] == fingerprint:
        return kept[1]
    target = make_target(hf_model, runtime=runtime, dtype=dtype, max_length=max_length)
    cache[key] = (fingerprint, target)
    return target


def speculative(
    spec_or_drafter: str | Drafter | None = "dtr",
    *,
    tokenizer: Any = None,
    draft_model: Any = None,
    runtime: Runtime = "auto",
    dtype: torch.dtype | DType | None = None,
    kernels: Kernels = "auto",
    learn_across_calls: bool = True,
    json_schema: str | dict | None = None,
    regex: str | None = None,
    grammar: str | None = None,
) -> SpeculativeGenerate:
    """A ``custom_generate`` callable that decodes speculatively with verispec.

    ``model.generate(**inputs, custom_generate=verispec.speculative("dtr"),
    max_new_tokens=128, do_sample=True, temperature=0.7, streamer=streamer)``.

    Args:
        spec_or_drafter: a method spec (``"dtr"``, ``"tr:template=16"``, ``"pld"``,
            ``"dyspec:budget=24"``...; see ``verispec methods``), a drafter object, or
            ``None``/``"ar"`` for plain decoding through verispec's engine. A spec builds
            one drafter per model, which keeps what it learns across calls (Token
            Recycling's adjacency matrix).
        tokenizer: the model's tokenizer, needed for ``stop_strings``.
        draft_model: for the draft-model methods, a separate draft model (a
            ``transformers`` model, wrapped like the target, or a verispec
            ``LanguageModel``) with the target's vocabulary; default: a self-draft.
        runtime: ``"auto"``, ``"fast"`` or ``"hf"``: what runs the model
            (:func:`~verispec.models.default.make_target`).
        dtype: the fast runtime's weight dtype; ``None`` (default) keeps the model's own,
            so greedy outputs equal ``generate``'s.
        kernels: ``"auto"``, ``"triton"`` or ``"torch"`` (see :mod:`verispec.kernels`).
        learn_across_calls: keep what the drafter learnt from earlier calls (Token
            Recycling's matrix, the suffix corpus: more accepted tokens per step). Outputs
            do not depend on it: greedy ones never, and seeded samples with a drafter of
            fixed candidates (``tr``, ``dtr``, ``pld``, ``suffix``) are the text plain
            sampling gives for that seed, whatever was learnt (the coupled verifier keys
            each draw by position). Only speed changes; ``False`` forgets at each call.
        json_schema, regex, grammar: structured output: every answer follows this JSON
            schema (a dict or a JSON string), regular expression or Lark grammar (at most
            one; needs ``tokenizer``), masked at every tree node (docs/processors.rst).

    Raises:
        ConfigError: a bad spec or option (checked now, before any model is seen).
    """
    from verispec.models.default import check_dtype, check_runtime
    from verispec.specs import parse_spec

    if not hasattr(GenerationMixin, "_extract_generation_mode_kwargs"):
        import transformers

        raise ConfigError(
            f"verispec.speculative needs a transformers whose generate takes a callable "
            f"`custom_generate` (5.x); got transformers {transformers.__version__}. Use "
            "verispec.SpeculativeDecoder(verispec.make_target(model), ...) instead."
        )
    if isinstance(spec_or_drafter, str):
        parse_spec(spec_or_drafter)  # a bad spec fails here, not at the first generate
    elif spec_or_drafter is not None and not isinstance(spec_or_drafter, Drafter):
        raise ConfigError(
            f"`spec_or_drafter` must be a method spec string (e.g. 'dtr'), a drafter or None; "
            f"got {type(spec_or_drafter).__name__}."
        )
    check_runtime(runtime)
    if dtype is not None:
        dtype = check_dtype(dtype)
    check_kernels(kernels)
    boolean("learn_across_calls", learn_across_calls)
    constraint = GenerationParams(json_schema=json_schema, regex=regex, grammar=grammar)
    if constraint.constrained:
        if tokenizer is None:
            raise ConfigError(
                "structured output (json_schema, regex, grammar) needs the model's tokenizer: "
                "verispec.speculative(..., tokenizer=tokenizer)."
            )
        from verispec.processors import grammar_text

        grammar_text(json_schema=json_schema, regex=regex, grammar=grammar)  # checked now
    return SpeculativeGenerate(
        spec_or_drafter,
        tokenizer=tokenizer,
        draft_model=draft_model,
        runtime=runtime,
        dtype=dtype,
        kernels=kernels,
        learn_across_calls=learn_across_calls,
        constraint=constraint,
    )


class SpeculativeGenerate:
    """The callable :func:`speculative` returns; see the module docstring.

    One generation at a time per model (the wrapped model keeps one KV cache).
    """

    def __init__(
        self,
        spec_or_drafter: str | Drafter | None,
        *,
        tokenizer: Any,
        draft_model: Any,
        runtime: Runtime,
        dtype: torch.dtype | DType | None,
        kernels: Kernels,
        learn_across_calls: bool = True,
        constraint: GenerationParams | None = None,
    ) -> None:
        self.spec = spec_or_drafter
        self.constraint = constraint if constraint is not None else GenerationParams()
        self.learn_across_calls = learn_across_calls
        self.tokenizer = tokenizer
        self.draft_model = draft_model
        self.runtime = runtime
        self.dtype = dtype
        self.kernels = kernels
        # one drafter per wrapped model, learning across calls
        self._drafters: weakref.WeakKeyDictionary[Any, Drafter | None] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"verispec.speculative({self.spec!r}, runtime={self.runtime!r})"

    # -- what generate calls ----------------------------------------------------------

    def __call__(
        self,
        model: Any,
        input_ids: torch.Tensor,
        logits_processor: Any = None,
        stopping_criteria: Any = None,
        generation_config: Any = None,
        synced_gpus: bool = False,
        streamer: Any = None,
        stop_strings: str | list[str] | None = None,
        seed: int | None = None,
        tokenizer: Any = None,
        **model_kwargs: Any,
    ) -> torch.Tensor | SpeculativeGenerateOutput:
        """Decode ``input_ids`` (int64, Shape: (1, S)) as ``generate`` asked.

        ``stop_strings``, ``seed`` and ``tokenizer`` are this callable's own keywords: pass
        them to ``generate`` and transformers hands them over untouched.
        """
        caller = _generate_frame()
        if streamer is None and caller is not None:
            streamer = caller.get("streamer")
        try:
            _check_caller(caller, synced_gpus)
            config = _generation_config(
                generation_config, logits_processor, stopping_criteria, input_ids, model_kwargs
            )
            max_new = int(generation_config.max_length) - int(input_ids.shape[1])
            if max_new < 1:
                return _output(generation_config, input_ids, [], None)
            if config.temperature > 0:
                seed = _seed(seed)
            elif seed is not None:
                _seed(seed)  # validated even where greedy decoding does not use it
            config = _with_call_options(config, max_new, stop_strings, seed)
            config = attrs.evolve(
                config,
                json_schema=self.constraint.json_schema,
                regex=self.constraint.regex,
                grammar=self.constraint.grammar,
            )
            tokenizer = tokenizer if tokenizer is not None else self.tokenizer
            require_tokenizer_for_stop_strings(  # transformers does not hand generate's
                config.stop_strings,  # `tokenizer` to a custom_generate callable
                tokenizer,
                "verispec.speculative(..., tokenizer=tokenizer)",
            )
            decoder = self._decoder(model, tokenizer)
            ids = input_ids[0].tolist()

            def push(tokens: list[int]) -> None:
                streamer.put(torch.tensor(tokens, dtype=torch.long))

            result = decoder.generate(ids, config, on_step=push if streamer is not None else None)
            return _output(generation_config, input_ids, result.tokens, result)
        finally:
            if streamer is not None:
                streamer.end()  # also on an error: a consumer thread stops waiting

    # -- helpers ----------------------------------------------------------------------

    def _decoder(self, model: Any, tokenizer: Any) -> SpeculativeDecoder:
        """A decoder over ``model``'s wrapped target and this callable's drafter for it."""
        target = target_for(model, runtime=self.runtime, dtype=self.dtype)
        if target not in self._drafters:
            self._drafters[target] = self._drafter(target)
        drafter = self._drafters[target]
        reset = getattr(drafter, "reset", None)
        if not self.learn_across_calls and callable(reset):
            reset()
        # cheap to build; checks the tokenizer against the model on every call
        return SpeculativeDecoder(target, drafter, tokenizer=tokenizer, kernels=self.kernels)

    def _drafter(self, target: LanguageModel) -> Drafter | None:
        if not isinstance(self.spec, str):
            return self.spec
        from verispec.specs import drafter

        draft = self.draft_model
        if draft is not None and not isinstance(draft, LanguageModel):
            draft = target_for(draft, runtime=self.runtime, dtype=self.dtype)
        return drafter(self.spec, target=target, draft_model=draft)


def _generate_frame() -> dict[str, Any] | None:
    """The local variables of the ``generate`` call that called us, if one did."""
    try:
        frame = sys._getframe(2)  # _generate_frame <- __call__ <- generate
    except ValueError:  # called from the top of a stack
        return None
    if frame.f_code.co_name == "generate" and "streamer" in frame.f_locals:
        return dict(frame.f_locals)
    return None


def _check_caller(caller: dict[str, Any] | None, synced_gpus: bool) -> None:
    # transformers hands none of these to a callable custom_generate: read from its frame
    if synced_gpus or (caller is not None and caller.get("synced_gpus")):
        raise ConfigError("`synced_gpus=True` is not supported: verispec decodes on one device.")
    if caller is None:
        return
    if caller.get("assistant_model") is not None:
        raise ConfigError(
            "`assistant_model` is not supported with verispec.speculative: verispec drafts "
            "itself. Pass the draft as verispec.speculative('chain', draft_model=assistant)."
        )
    if caller.get("negative_prompt_ids") is not None:
        raise ConfigError(
            "`negative_prompt_ids` (classifier-free guidance) is not supported with "
            "verispec.speculative: it runs the model on a second sequence."
        )


def _generation_config(
    gc: Any, processors: Any, criteria: Any, input_ids: torch.Tensor, model_kwargs: dict
) -> GenerationParams:
    """verispec's settings for transformers' prepared config; raise on what has none."""

    def refuse(option: str, value: Any, allowed: str) -> ConfigError:
        return ConfigError(
            f"`{option}` must be {allowed} with verispec.speculative; got {value!r}."
        )

    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ConfigError(
            f"verispec.speculative needs `input_ids` of one prompt, Shape: (1, S); got shape "
            f"{tuple(input_ids.shape)} (inputs_embeds are not supported)."
        )
    if getattr(gc, "num_beams", 1) > 1:
        raise refuse("num_beams", gc.num_beams, "1 (beam search is not speculative sampling)")
    if getattr(gc, "num_return_sequences", 1) > 1:
        raise refuse("num_return_sequences", gc.num_return_sequences, "1")
    if input_ids.shape[0] != 1:
        raise ConfigError(
            f"verispec.speculative decodes one sequence at a time; got a batch of "
            f"{input_ids.shape[0]}. Call generate once per prompt."
        )
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise refuse("attention_mask", "with padding", "all ones (no padding, batch size 1)")
    if model_kwargs.get("inputs_embeds") is not None:  # beside input_ids: they would be ignored
        raise refuse("inputs_embeds", "a tensor", "None (pass the prompt as input_ids)")
    for name in ("past_key_values", "cache"):  # transformers 5 renames the first to the second
        cache = model_kwargs.get(name)
        if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
            raise refuse("past_key_values", "a filled cache", "empty (verispec keeps its own)")
    for option in ("prompt_lookup_num_tokens", "assistant_early_exit"):
        if getattr(gc, option, None) is not None:
            raise refuse(option, getattr(gc, option), "None (use verispec.speculative('pld'))")
    if getattr(gc, "use_mtp", None):
        raise refuse("use_mtp", gc.use_mtp, "False (verispec drafts itself)")
    # decoding modes whose answers are not the target's greedy or sampled ones; transformers
    # runs them from Hub repositories, and a callable `custom_generate` would otherwise
    # decode greedily in their place without a word
    for option in ("constraints", "force_words_ids", "dola_layers"):
        if getattr(gc, option, None) is not None:
            raise refuse(option, getattr(gc, option), "None (it is another decoding method)")
    alpha = getattr(gc, "penalty_alpha", None)
    if not gc.do_sample and (gc.top_k or 0) > 1 and (alpha or 0) > 0:  # contrastive search
        raise refuse("penalty_alpha", alpha, "None (it is another decoding method)")
    for option in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        if getattr(gc, option, False):
            raise refuse(option, True, "False")
    processors = list(processors or ())
    for processor in processors:
        classify(processor)  # refuses, naming it, a processor that is not exact under trees
    for criterion in criteria or ():
        name = type(criterion).__name__
        if name not in _STOPS:
            raise ConfigError(
                f"stopping criterion `{name}` is not supported with verispec.speculative: only "
                "max_new_tokens/max_length, eos_token_id and its own stop_strings= are."
            )
    sample = bool(gc.do_sample) and (gc.temperature is None or gc.temperature > 0)
    eos = gc.eos_token_id
    eos_ids = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
    head, sampling = _sampling_tail(processors) if sample else (processors, {})
    if sample and sampling is None:  # warpers the verifier cannot apply: all in the rows
        head, sampling = processors, {"temperature": 1.0}
    return GenerationParams(eos_token_ids=eos_ids, logits_processor=tuple(head), **(sampling or {}))


# transformers' warpers that are verispec's sampling parameters, in the order both apply them
_SAMPLING_WARPERS = {
    "TemperatureLogitsWarper": "temperature",
    "TopKLogitsWarper": "top_k",
    "TopPLogitsWarper": "top_p",
    "MinPLogitsWarper": "min_p",
}


def _sampling_tail(processors: list[Any]) -> tuple[list[Any], dict[str, Any] | None]:
    """Split off the list's tail of transformers' temperature, top-k, top-p and min-p
    warpers, in that order, as sampling parameters (which the verifier applies to the
    processed rows, as ``generate`` applies them last). ``None`` when a warper is
    anywhere else in the list or out of order: then the whole list goes to the rows."""
    order = list(_SAMPLING_WARPERS)
    tail = len(processors)
    while tail and type(processors[tail - 1]).__name__ in _SAMPLING_WARPERS:
        tail -= 1
    head, warpers = processors[:tail], processors[tail:]
    names = [type(w).__name__ for w in warpers]
    other = {"TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper", "TopHLogitsWarper"}
    if any(type(p).__name__ in _SAMPLING_WARPERS or type(p).__name__ in other for p in head):
        return processors, None
    if names != sorted(names, key=order.index) or len(set(names)) != len(names):
        return processors, None
    sampling: dict[str, Any] = {"temperature": 1.0}
    for warper, name in zip(warpers, names, strict=True):
        field = _SAMPLING_WARPERS[name]
        if getattr(warper, "min_tokens_to_keep", 1) != 1 or getattr(
            warper, "filter_value", -float("inf")
        ) != -float("inf"):
            return processors, None
        sampling[field] = getattr(warper, field)
    return head, sampling


def _seed(seed: int | None) -> int:
    if seed is None:  # from torch's global generator: torch.manual_seed makes a call repeat
        return random_seed()
    return check_seed("seed", seed)  # the range of GenerationParams.seed


def _with_call_options(
    config: GenerationParams, max_new: int, stop_strings: Any, seed: int | None
) -> GenerationParams:
    import attrs

    sequence = isinstance(stop_strings, list | tuple)
    strings = sequence and all(isinstance(s, str) for s in stop_strings)
    if stop_strings is not None and not (isinstance(stop_strings, str) or strings):
        raise ConfigError(
            f"`stop_strings` must be a string or a list of strings; got {stop_strings!r}."
        )
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    if stop_strings is not None and not all(stop_strings):
        raise ConfigError(f"`stop_strings` must not contain an empty string; got {stop_strings!r}.")
    return attrs.evolve(
        config,
        max_new_tokens=max_new,
        stop_strings=tuple(stop_strings or ()),
        seed=seed if seed is not None else 0,
    )


def _output(
    gc: Any, input_ids: torch.Tensor, tokens: list[int], result: GenerationResult | None
) -> torch.Tensor | SpeculativeGenerateOutput:
    new = torch.tensor([tokens], dtype=input_ids.dtype, device=input_ids.device)
    sequences = torch.cat([input_ids, new], dim=1)
    if not getattr(gc, "return_dict_in_generate", False):
        return sequences
    steps = result.steps if result is not None else []
    return SpeculativeGenerateOutput(
        sequences=sequences,  # type: ignore[arg-type]
        mean_accepted_tokens=result.mean_accepted_tokens if result is not None else 0.0,
        num_steps=len(steps),
        tree_sizes=tuple(s.tree_size for s in steps),
        accepted_lengths=tuple(s.accepted for s in steps),
        spec_decode_metrics=result.spec_decode_metrics() if result is not None else None,
        result=result,
    )
