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

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from verispec.core.tree import DraftTree
from verispec.errors import ConfigError, ContextLengthError, TreeStructureError
from verispec.models._cache import TreeKVCache

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


def _layer_indices(layers: int | Sequence[int] | None, num_layers: int) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(num_layers))
    if isinstance(layers, bool):
        raise ConfigError(
            f"`layers` must be an int or a sequence of layer indices; got {layers!r}."
        )
    if isinstance(layers, int):
        if not 1 <= layers <= num_layers:
            raise ConfigError(
                f"`layers` must be between 1 and the model's {num_layers} layers; got {layers}."
            )
        return tuple(range(layers))
    chosen = tuple(int(i) for i in layers)
    if not chosen:
        raise ConfigError("`layers` must name at least one decoder layer; got an empty list.")
    if any(not 0 <= i < num_layers for i in chosen):
        raise ConfigError(f"`layers` indices must be in [0, {num_layers}); got {list(chosen)}.")
    if any(b <= a for a, b in itertools.pairwise(chosen)):
        raise ConfigError(
            f"`layers` indices must be strictly increasing (each layer once, in order); "
            f"got {list(chosen)}."
        )
    return chosen


class HFModel:
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
                from verispec.kernels.hf_attention import register

                register()  # Triton tree attention on CUDA, sdpa elsewhere (warns once)
            hf_model.set_attn_implementation(attention)
        attention = getattr(self.config, "_attn_implementation", None) or "eager"
        if attention not in _SUPPORTED_ATTENTION:
            raise ConfigError(
                f"attention implementation must be one of {_SUPPORTED_ATTENTION}; got "
                f"{attention!r}. Load the model with attn_implementation='sdpa'."
            )
        num_layers = len(self._decoder.layers)
        self.layer_indices = _layer_indices(layers, num_layers)
        self._layers = [self._decoder.layers[i] for i in self.layer_indices]
        self.vocab_size = int(self._lm_head.weight.shape[0])
        context = int(getattr(self.config, "max_position_embeddings", 2048))
        window = getattr(self.config, "sliding_window", None)
        if window and getattr(self.config, "use_sliding_window", True):
            context = min(context, int(window))
        if max_length is not None:
            if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
                raise ConfigError(f"`max_length` must be an integer >= 2; got {max_length!r}.")
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
        self._cached = 0  # entries in the cache that belong to committed tokens
        self._pending: list[int] = []
        self._tree: DraftTree | None = None  # the tree scored this step
        self._fed = 0  # nodes of that tree whose KV entries are in the cache
        self._pending_fed = 0  # pending tokens fed this step (0 or len(_pending))

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

    # -- protocol ---------------------------------------------------------------------

    @property
    def num_committed(self) -> int:
        """Committed tokens so far: cached plus pending."""
        return self._cached + len(self._pending)

    @property
    def num_layers(self) -> int:
        return len(self.layer_indices)

    def reset(self) -> None:
        """Forget the sequence and free its cache."""
        self._cache.reset()
        self._cached = 0
        self._pending = []
        self._tree = None
        self._fed = self._pending_fed = 0

    def prefill(self, ids: torch.Tensor | Sequence[int]) -> None:
        """Start a new sequence from prompt ``ids`` (int64, Shape: (S,)), S >= 1.

        Every token but the last is cached; the last one is pending (the root).
        """
        ids_t = torch.as_tensor(ids, dtype=torch.long).reshape(-1).cpu()
        if ids_t.numel() == 0:
            raise ConfigError("`ids` must hold at least one token; got an empty prompt.")
        self._check_tokens(ids_t, "prompt")
        if ids_t.numel() > self.max_length:
            raise ContextLengthError(
                f"the prompt has {ids_t.numel()} tokens but the model's context holds "
                f"{self.max_length}; shorten the prompt."
            )
        self.reset()
        head = ids_t[:-1]
        if head.numel():
            count = head.numel()
            positions = torch.arange(count)
            self._run(head, positions, None, kv_offset=0, keep_rows=0)  # None: causal
        self._cached = int(head.numel())
        self._pending = [int(ids_t[-1])]

    def forward_tree(self, tree: DraftTree, *, extend_from: int = 0) -> torch.Tensor:
        """Score the root and the tree's nodes in one pass.

        Args:
            tree: the draft tree below the root.
            extend_from: ``0`` scores the whole tree and returns float, Shape: (N + 1, V)
                (row 0 the root, row i + 1 node i). ``k > 0`` grows the tree scored by the
                previous call of this step, whose first ``k`` nodes must equal this tree's:
                only nodes ``k..N-1`` are fed, and their logits returned, Shape: (N - k, V).
        """
        if not self._pending:
            raise ConfigError("`forward_tree` needs a sequence; call `prefill(ids)` first.")
        num_nodes = tree.num_nodes
        if extend_from:
            self._check_extension(tree, extend_from)
        start = extend_from
        new_tokens = tree.tokens[start:]
        self._check_tokens(new_tokens, "tree")
        num_pending = len(self._pending)
        if self._cached + num_pending + num_nodes > self.max_length:
            raise ContextLengthError(
                f"{self._cached + num_pending} committed tokens plus a tree of {num_nodes} "
                f"nodes exceed the model's context of {self.max_length}; send a smaller tree "
                f"(`DecodeState.max_nodes` says how many fit)."
            )
        root_position = self._cached + num_pending - 1
        node_positions = tree.depth[start:] + root_position
        node_mask = tree.ancestor_mask[start:]  # (N - k, N)
        if start == 0:
            # Feed the pending tokens, then the nodes, after the committed cache.
            self._cache.truncate(self._cached)
            queries = num_pending + num_nodes
            mask = torch.zeros(queries, num_pending + num_nodes, dtype=torch.bool)
            mask[:num_pending, :num_pending] = torch.ones(
                num_pending, num_pending, dtype=torch.bool
            ).tril_()
            mask[num_pending:, :num_pending] = True
            mask[num_pending:, num_pending:] = node_mask
            tokens = torch.cat([torch.tensor(self._pending, dtype=torch.long), new_tokens])
            positions = torch.cat([torch.arange(self._cached, root_position + 1), node_positions])
            logits = self._run(
                tokens, positions, mask, kv_offset=self._cached, keep_rows=num_nodes + 1
            )
            self._pending_fed = num_pending
        else:
            # Grow the tree scored by the previous call: the cache holds its first k nodes.
            base = self._cached + self._pending_fed
            self._cache.truncate(base + start)
            mask = torch.ones(num_nodes - start, self._pending_fed + num_nodes, dtype=torch.bool)
            mask[:, self._pending_fed :] = node_mask
            logits = self._run(
                new_tokens, node_positions, mask, kv_offset=self._cached, keep_rows=None
            )
        self._tree = tree
        self._fed = num_nodes
        return logits

    def commit(self, accepted: Sequence[int], extra_token: int) -> None:
        """Keep the pending tokens and the ``accepted`` nodes of the last scored tree.

        ``accepted`` is a root-to-node path of the tree given to the last ``forward_tree``
        call (all of whose nodes were fed). Their KV entries are gathered into place
        right after the pending tokens' (so a side branch leaves the cache exactly as
        sequential decoding would); only the accepted entries move, and none when the
        path is the tree's first nodes in order. ``extra_token`` becomes pending. With no
        tree scored since the last commit, ``accepted`` must be empty and ``extra_token``
        joins the pending tokens.
        """
        if not self._pending:
            raise ConfigError("`commit` needs a sequence; call `prefill(ids)` first.")
        path = [int(a) for a in accepted]
        if path:
            self._check_path(path)
        self._check_tokens(torch.tensor([int(extra_token)]), "extra token")
        if self._pending_fed:
            base = self._cached + self._pending_fed
            if path != list(range(len(path))):
                source = torch.tensor(path, dtype=torch.long) + base
                self._cache.compact(base, source.to(self.device, non_blocking=True))
            else:
                self._cache.truncate(base + len(path))
            self._cached = base + len(path)
            self._pending = [int(extra_token)]
        else:
            self._pending = [*self._pending, int(extra_token)]
        self._tree = None
        self._fed = self._pending_fed = 0

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

    @property
    def pending_tokens(self) -> list[int]:
        """Committed tokens not yet fed; the last is the root of the next tree."""
        return list(self._pending)

    # -- internals --------------------------------------------------------------------

    def _check_tokens(self, tokens: torch.Tensor, what: str) -> None:
        if tokens.numel() == 0:
            return
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            error = TreeStructureError if what == "tree" else ConfigError
            raise error(f"{what} token ids must be in [0, {self.vocab_size}); got {bad}.")

    def _check_extension(self, tree: DraftTree, extend_from: int) -> None:
        previous = self._tree
        if previous is None or not self._pending_fed:
            raise ConfigError(
                f"`extend_from={extend_from}` grows the tree scored earlier in this step, but no "
                f"tree was scored since the last commit; call with `extend_from=0` first."
            )
        if not 0 < extend_from <= min(self._fed, tree.num_nodes):
            raise ConfigError(
                f"`extend_from` must be in [0, {min(self._fed, tree.num_nodes)}] (nodes already "
                f"scored); got {extend_from}."
            )
        same = torch.equal(previous.tokens[:extend_from], tree.tokens[:extend_from]) and (
            torch.equal(previous.parents[:extend_from], tree.parents[:extend_from])
        )
        if not same:
            raise TreeStructureError(
                f"the first {extend_from} nodes of the tree must equal those scored by the "
                f"previous `forward_tree` call to extend it; they differ."
            )

    def _check_path(self, accepted: list[int]) -> None:
        tree = self._tree
        if tree is None or accepted[-1] >= tree.num_nodes or min(accepted) < 0:
            raise TreeStructureError(
                f"`accepted` nodes {accepted} must be nodes of the last scored tree "
                f"({0 if tree is None else tree.num_nodes} nodes)."
            )
        parents = tree.parents.tolist()
        expected = -1
        for node in accepted:
            if parents[node] != expected:
                raise TreeStructureError(
                    f"`accepted` must be a root-to-node path; node {node}'s parent is "
                    f"{parents[node]}, not {expected}."
                )
            expected = node

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

    @torch.no_grad()  # not inference_mode: callers may modify the logits in place
    def _run(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        tail_mask: torch.Tensor | None,
        *,
        kv_offset: int,
        keep_rows: int | None,
    ) -> torch.Tensor:
        """Feed ``tokens`` (Shape: (Q,)) at ``positions``; logits of the last ``keep_rows`` rows.

        ``keep_rows=None`` keeps every row; ``0`` skips the LM head (prefill).
        """
        if tokens.numel() == 0:  # nothing to feed (extend_from == N)
            return torch.empty((0, self.vocab_size), dtype=self._logits_dtype, device=self.device)
        ids = tokens.to(self.device, non_blocking=True)[None]  # (1, Q)
        position_ids = positions.to(self.device, non_blocking=True)[None]  # (1, Q)
        mask = self._attention_mask(tail_mask, kv_offset, tokens.numel())
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
