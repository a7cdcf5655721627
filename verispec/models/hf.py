"""Tree attention over a Hugging Face causal LM (SpecInfer-style token tree verification).

:class:`HFModel` implements :class:`verispec.core.types.LanguageModel` for a
``transformers`` decoder-only model (Llama, Qwen2, Mistral). One forward pass
scores the pending tokens and every node of a draft tree (Miao et al., 2024,
"SpecInfer", §4.2 tree attention):

* the queries are the pending tokens, then the nodes;
* a 4-D boolean mask lets each pending token see the cache and the pending tokens
  before it, and each node see the cache, every pending token, itself and its
  ancestors (``DraftTree.ancestor_mask``);
* positions are depth-based: node ``i`` sits at ``root_position + depth[i]``.

``commit`` keeps only the accepted path's KV entries by a gather of the tail
(:class:`~verispec.models._cache.TreeKVCache`), so a side branch leaves the cache
exactly as sequential decoding would. The decoder layers are called one by one, so
a subset of them (a *self-draft*, :meth:`HFModel.self_draft`) is the same class
over the same weights with its own cache.

Shape glossary: N tree nodes, V vocabulary, S committed tokens, P pending tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from verispec.core.validate import integer
from verispec.errors import ConfigError
from verispec.kernels.hf_attention import register
from verispec.models._cache import TreeKVCache
from verispec.models._sequence import TreeSequenceModel, layer_indices

__all__ = ["HFModel"]

_SUPPORTED_ATTENTION = ("sdpa", "eager", "verispec")


def _decoder(hf_model: Any) -> Any:
    decoder = getattr(hf_model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if decoder is None or not all(hasattr(decoder, name) for name in needed):
        raise ConfigError(
            f"`hf_model` must be a decoder-only causal LM with `.model.embed_tokens`, `.layers`, "
            f"`.norm` and `.rotary_emb` (Llama, Qwen2, Mistral); got {type(hf_model).__name__}."
        )
    return decoder


class HFModel(TreeSequenceModel):
    """A Hugging Face causal LM behind the :class:`~verispec.core.types.LanguageModel` protocol.

    Batch size 1. The model is put in eval mode and run under ``torch.no_grad``.

    Args:
        hf_model: a ``transformers`` causal LM (``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
            ``MistralForCausalLM``...) with ``sdpa``, ``eager`` or ``verispec`` attention
            (the Triton tree attention of :mod:`verispec.kernels.hf_attention`; enable it
            with ``verispec.kernels.hf_attention.enable(hf_model)``).
        max_length: cap on the context (prompt plus generated plus tree); defaults to
            ``max_position_embeddings`` (or the sliding window, if smaller: no sliding
            window is applied).
        layers: run only these decoder layers (an int ``n`` = the first ``n``); ``None``
            runs all of them. See :meth:`self_draft`.
        attention: ``"sdpa"``, ``"eager"`` or ``"verispec"`` switches ``hf_model``'s
            attention (``"verispec"``: the Triton tree attention, with sdpa where it does
            not apply); ``None`` keeps the model's own.

    Attributes:
        hf_model, config: the wrapped model and its config.
        vocab_size: width of the logits (the LM head's output size).
        max_length: the most committed tokens plus tree nodes.
        eos_token_id: from the model's ``generation_config`` (int, list of ints or ``None``).
        layer_indices: the decoder layers this view runs.

    Logits are returned in the model's dtype, upcast to float32 for float16/bfloat16.
    """

    runs_hf_attention = True

    def __init__(
        self,
        hf_model: Any,
        *,
        max_length: int | None = None,
        layers: int | Sequence[int] | None = None,
        attention: str | None = None,
    ) -> None:
        self._decoder = _decoder(hf_model)
        self.hf_model = hf_model.eval()
        self.config = hf_model.config
        self._lm_head = hf_model.get_output_embeddings()
        if attention is not None:  # switches the wrapped model itself (shared by its views)
            if attention not in _SUPPORTED_ATTENTION:
                raise ConfigError(
                    f"`attention` must be one of {_SUPPORTED_ATTENTION}; got {attention!r}."
                )
            if attention == "verispec":
                register()  # Triton tree attention on CUDA, sdpa elsewhere (warns once)
            hf_model.set_attn_implementation(attention)
        attention = getattr(self.config, "_attn_implementation", None) or "eager"
        if attention not in _SUPPORTED_ATTENTION:
            raise ConfigError(
                f"attention implementation must be one of {_SUPPORTED_ATTENTION}; got "
                f"{attention!r}. Load the model with attn_implementation='sdpa'."
            )
        num_layers = len(self._decoder.layers)
        self.layer_indices = layer_indices(layers, num_layers)
        self._layers = [self._decoder.layers[i] for i in self.layer_indices]
        self.vocab_size = int(self._lm_head.weight.shape[0])
        context = int(getattr(self.config, "max_position_embeddings", 2048))
        window = getattr(self.config, "sliding_window", None)
        if window and getattr(self.config, "use_sliding_window", True):
            context = min(context, int(window))
        if max_length is not None:
            integer("max_length", max_length, 2)
            context = min(context, max_length)
        self.max_length = context
        generation_config = getattr(hf_model, "generation_config", None)
        self.eos_token_id = getattr(generation_config, "eos_token_id", None)
        if self.eos_token_id is None:
            self.eos_token_id = getattr(self.config, "eos_token_id", None)
        param = next(hf_model.parameters())
        self.device, self.dtype = param.device, param.dtype
        half = self.dtype in (torch.float16, torch.bfloat16)
        self._logits_dtype = torch.float32 if half else self.dtype
        self._cache = TreeKVCache(num_layers, max_capacity=self.max_length)
        self._init_sequence()

    # -- construction -----------------------------------------------------------------

    def self_draft(self, layers: int | Sequence[int], *, max_length: int | None = None) -> HFModel:
        """A draft model that runs only ``layers`` of this model, sharing its weights.

        The view embeds, runs the chosen decoder layers in order, applies the final
        norm and the LM head, and keeps its own KV cache. No parameter is copied.

        Args:
            layers: ``n`` for the first ``n`` layers, or strictly increasing layer indices.
        """
        return HFModel(
            self.hf_model,
            max_length=self.max_length if max_length is None else max_length,
            layers=layers,
        )

    @property
    def num_layers(self) -> int:
        return len(self.layer_indices)

    # -- introspection (tests, debugging) ---------------------------------------------

    def kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The committed KV entries of each run layer: keys, values, Shape: (1, H, S, D)."""
        out = []
        for index in self.layer_indices:
            keys, values = self._cache.buffer_layers[index].valid()
            if keys is None or values is None:
                continue
            out.append((keys[:, :, : self._cached], values[:, :, : self._cached]))
        return out

    def _attention_mask(
        self, tail: torch.Tensor | None, kv_offset: int, queries: int
    ) -> torch.Tensor | None:
        """The 4-D mask over ``kv_offset`` cached entries then ``tail``'s columns.

        ``tail``: bool, Shape: (Q, T), or ``None`` for a causal pass over an empty cache
        (the prefill), which sdpa runs without a mask. Returns Shape: (1, 1, Q,
        kv_offset + T), boolean (True = attend) for sdpa, additive (0 / dtype minimum)
        for eager.
        """
        eager = self.config._attn_implementation == "eager"
        if tail is None:
            assert kv_offset == 0, "a causal pass needs an empty cache"
            if not eager:
                return None
            tail = torch.ones(queries, queries, dtype=torch.bool, device=self.device).tril_()
        queries, width = tail.shape
        tail = tail.to(self.device, non_blocking=True)
        if kv_offset:
            full = torch.ones(queries, kv_offset + width, dtype=torch.bool, device=self.device)
            full[:, kv_offset:] = tail
            tail = full
        mask = tail[None, None]
        if not eager:  # sdpa, verispec: boolean masks
            return mask
        additive = torch.zeros(mask.shape, dtype=self.dtype, device=self.device)
        return additive.masked_fill_(~mask, torch.finfo(self.dtype).min)

    # -- TreeSequenceModel hooks ---------------------------------------------------------

    def _truncate(self, length: int) -> None:
        self._cache.truncate(length)

    def _clear(self) -> None:
        self._cache.reset()

    def _compact(self, start: int, source: torch.Tensor) -> None:
        self._cache.compact(start, source)

    @torch.no_grad()  # not inference_mode: callers may modify the logits in place
    def _feed(
        self, tokens: Tensor, positions: Tensor, visible: int, local_mask: Tensor | None,
        keep_rows: int | None,
    ) -> Tensor:  # fmt: skip
        """Feed ``tokens`` (Shape: (Q,)) at ``positions``; logits of the last ``keep_rows`` rows.

        transformers' cache appends, so it is first cut to the slot the new entries start at.
        ``keep_rows=None`` keeps every row; ``0`` skips the LM head (prefill).
        """
        queries = tokens.numel()
        width = queries if local_mask is None else local_mask.shape[1]
        self._cache.truncate(visible + width - queries)
        if queries == 0:  # nothing to feed (extend_from == N)
            return torch.empty((0, self.vocab_size), dtype=self._logits_dtype, device=self.device)
        ids = tokens.to(self.device, non_blocking=True)[None]  # (1, Q)
        position_ids = positions.to(self.device, non_blocking=True)[None]  # (1, Q)
        mask = self._attention_mask(local_mask, visible, queries)
        hidden = self._decoder.embed_tokens(ids)
        position_embeddings = self._decoder.rotary_emb(hidden, position_ids)
        for layer in self._layers:
            hidden = layer(
                hidden,
                attention_mask=mask,
                position_ids=position_ids,
                past_key_values=self._cache,
                use_cache=True,
                position_embeddings=position_embeddings,
            )
        if keep_rows == 0:
            return hidden.new_empty((0, self.vocab_size))
        if keep_rows is not None:
            hidden = hidden[:, hidden.shape[1] - keep_rows :]
        logits = self._lm_head(self._decoder.norm(hidden))[0]  # (rows, V)
        return logits.to(self._logits_dtype)

    def __repr__(self) -> str:
        return (
            f"HFModel({type(self.hf_model).__name__}, layers={self.num_layers}/"
            f"{len(self._decoder.layers)}, vocab_size={self.vocab_size}, "
            f"max_length={self.max_length}, dtype={self.dtype}, device={self.device})"
        )
