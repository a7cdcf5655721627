"""Structured output under draft trees: a JSON schema, a regex or a grammar, at every node.

The engine is `llguidance <https://github.com/guidance-ai/llguidance>`_ (``pip install
llguidance``): a 3 MB wheel with no dependencies, an Earley parser over a token trie that
computes a mask in tens of microseconds on a CPU, with ``consume_token`` and ``rollback``,
and JSON schemas, regexes and Lark grammars (an EBNF) as inputs. xgrammar needs Triton on
Linux (a GPU-sized install) and outlines-core has no grammars beyond regular ones.

A mask is a function of the generated prefix, so it is exact under a tree as any
processor of the prefix is (docs/processors.rst): :class:`GrammarConstraint` walks the
tree depth first from the matcher's committed state, consuming each node's token and
rolling it back after its subtree, and writes each row's allowed tokens. A node whose
token its parent's row forbids is *dead*: the target gives it probability 0, so no
verifier accepts it; :meth:`GrammarConstraint.prune` drops such nodes before the target
scores them wherever that keeps the proposal laws (children of fixed candidates, or any
child at temperature 0), and the rows of the dead nodes left are given their parent's
processed logits (never read by a verifier; finite, so every row stays a distribution).
Draft-model drafters draw no dead node at all: :meth:`GrammarConstraint.allowed_after`
gives them each row's allowed tokens (``DecodeState.allowed``) and they mask their draft
distribution with it, declaring the masked law they draw from.

:class:`GrammarLogitsProcessor` is the same constraint as a transformers
``LogitsProcessor`` for plain ``generate``, the baseline to compare with.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from verispec.core.tree import Deterministic, DraftTree
from verispec.core.types import DecodeState
from verispec.errors import ConfigError

__all__ = [
    "GrammarConstraint",
    "GrammarLogitsProcessor",
    "grammar_error",
    "grammar_text",
    "ll_tokenizer",
]

_BITS = torch.arange(32, dtype=torch.int32)


def _unpack(bits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool, Shape: (R, vocab_size): the allowed tokens of llguidance's int32 bitmasks
    (Shape: (R, ceil(V / 32)), bit ``t % 32`` of word ``t // 32`` for token ``t``)."""
    return ((bits.unsqueeze(-1) >> _BITS) & 1).bool().view(bits.shape[0], -1)[:, :vocab_size]


_LL_TOKENIZERS: weakref.WeakKeyDictionary[Any, dict[tuple, Any]] = weakref.WeakKeyDictionary()


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as error:  # pragma: no cover - llguidance is a dependency
        raise ConfigError(
            "structured output (json_schema, regex, grammar) needs the `llguidance` package: "
            "pip install llguidance."
        ) from error
    return llguidance


class _BytesWrapper:
    """llguidance's tokenizer interface for a tokenizer that lists its tokens' bytes
    (``token_bytes()``, e.g. :class:`verispec.models.tiny.ByteTokenizer`)."""

    def __init__(self, tokenizer: Any) -> None:
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None)
        self.tokens = list(tokenizer.token_bytes())
        self.special_token_ids = [
            t for t in (self.eos_token_id, self.bos_token_id) if t is not None
        ]
        self.is_tokenizer_wrapper = True
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        ids = list(self._tokenizer.encode(text))
        bos = self.bos_token_id
        return ids[1:] if ids and bos is not None and ids[0] == bos else ids


def ll_tokenizer(tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> Any:
    """llguidance's view of ``tokenizer`` (built once per tokenizer, vocabulary and eos).

    Raises:
        ConfigError: the tokenizer is neither a fast Hugging Face tokenizer nor one that
            lists its tokens' bytes.
    """
    llg = _llguidance()
    key = (vocab_size, tuple(eos_token_ids))
    try:
        cache = _LL_TOKENIZERS.setdefault(tokenizer, {})
    except TypeError:  # not weakly referenceable: build every time
        cache = {}
    if key in cache:
        return cache[key]
    eos = list(eos_token_ids) or None
    if callable(getattr(tokenizer, "token_bytes", None)):
        built = llg.LLTokenizer(_BytesWrapper(tokenizer), n_vocab=vocab_size, eos_token=eos)
    elif hasattr(tokenizer, "backend_tokenizer"):
        import llguidance.hf

        built = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos)
    else:
        raise ConfigError(
            "structured output needs a fast Hugging Face tokenizer (or one with "
            f"`token_bytes()`); got {type(tokenizer).__name__}."
        )
    cache[key] = built
    return built


def grammar_text(
    *, json_schema: str | dict | None = None, regex: str | None = None, grammar: str | None = None
) -> str:
    """llguidance's grammar for exactly one of a JSON schema, a regex or a Lark grammar.

    Raises:
        ConfigError: none or several given, or a JSON schema that is not JSON.
    """
    llg = _llguidance()
    options = {"json_schema": json_schema, "regex": regex, "grammar": grammar}
    given = [name for name, value in options.items() if value is not None]
    if len(given) != 1:
        raise ConfigError(
            f"give exactly one of `json_schema`, `regex` and `grammar`; got {given or 'none'}."
        )
    if json_schema is not None:
        try:
            schema = json.loads(json_schema) if isinstance(json_schema, str) else json_schema
        except json.JSONDecodeError as error:
            raise ConfigError(f"`json_schema` is not valid JSON: {error}.") from error
        return str(llg.LLMatcher.grammar_from_json_schema(schema))
    if regex is not None:
        return str(llg.LLMatcher.grammar_from_regex(regex))
    return str(llg.LLMatcher.grammar_from_lark(grammar))


def grammar_error(grammar: str) -> str | None:
    """Why llguidance cannot compile ``grammar`` (from :func:`grammar_text`), on one line,
    or None: its checks that need no tokenizer (a regex that does not parse or uses
    look-around or backreferences, a Lark grammar's syntax or a rule it lacks, a schema's
    unknown type, format or unsatisfiable bounds), in milliseconds, before any model loads.
    What needs the tokenizer (a special token the grammar names) is checked by
    :class:`GrammarConstraint`."""
    is_error, messages = _llguidance().LLMatcher.validate_grammar_with_warnings(grammar)
    return _one_line(messages[0]) if is_error and messages else None


def _one_line(message: str) -> str:
    """llguidance's error without its drawing of the source (lines of text and carets):
    the first line, its place ``at 3(5)`` as ``line 3, column 5``, and for a regex that
    does not parse, the parser's reason."""
    lines = [line.strip() for line in message.strip().splitlines()]
    first = lines[0] if lines else "unknown error"
    if first.endswith("regex parse error:"):
        reasons = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
        first = " ".join([first, *reasons[:1]])
    return re.sub(r"^(?:at )?(\d+)\((\d+)\): ", r"line \1, column \2: ", first)


class GrammarConstraint:
    """One generation's grammar: the allowed tokens of every tree row.

    Args:
        tokenizer: llguidance's tokenizer (:func:`ll_tokenizer`).
        grammar: llguidance's grammar (:func:`grammar_text`).
        vocab_size: V, the width of the logits.
        prompt_length: tokens of the prompt; the grammar covers the tokens after it.

    Raises:
        ConfigError: the grammar does not compile; the message is llguidance's.
    """

    def __init__(self, tokenizer: Any, grammar: str, vocab_size: int, prompt_length: int) -> None:
        llg = _llguidance()
        self._matcher = llg.LLMatcher(tokenizer, grammar)
        if self._matcher.is_error():
            raise ConfigError(
                f"the grammar does not compile: {_one_line(self._matcher.get_error())}"
            )
        self.vocab_size = vocab_size
        self.prompt_length = prompt_length
        self._words = (vocab_size + 31) // 32
        self._eos = {int(t) for t in getattr(tokenizer, "eos_tokens", ())}
        self._consumed = 0  # generated tokens the matcher has consumed
        self._cached: tuple[DraftTree, torch.Tensor, list[int]] | None = None

    # -- the committed state -------------------------------------------------------------

    def sync(self, tokens: Sequence[int]) -> None:
        """Advance the matcher over the generated tokens of ``tokens`` it has not consumed.

        Raises:
            RuntimeError: a committed token breaks the grammar (the mask was not applied).
        """
        new = list(tokens[self.prompt_length + self._consumed :])
        if new and not self._matcher.consume_tokens(new):
            raise RuntimeError(f"a committed token broke the grammar: {self._matcher.get_error()}")
        self._consumed += len(new)

    @property
    def matcher(self) -> Any:
        """llguidance's ``LLMatcher``, at the committed state after :meth:`sync`."""
        return self._matcher

    def row_mask(self) -> torch.Tensor:
        """int32, Shape: (ceil(V / 32),): the allowed tokens at the matcher's state, as bits."""
        bits = torch.zeros(1, self._words, dtype=torch.int32)
        self._matcher.unsafe_compute_mask_ptr(bits.data_ptr(), self._words * 4)
        return bits[0]

    # -- the tree ------------------------------------------------------------------------

    def _consume(self, path: Sequence[int]) -> int:
        """Consume ``path``'s tokens while the grammar allows them, stopping before an
        end-of-sequence token (nothing after it is ever committed); returns how many."""
        consumed = 0
        for token in path:
            if token >= self.vocab_size or token in self._eos:
                break
            if self._matcher.validate_tokens([token]) != 1:
                break
            self._matcher.consume_token(token)
            consumed += 1
        return consumed

    def allowed_after(self, state: DecodeState, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """bool, Shape: (len(paths), V): the tokens allowed after each path below the root
        (all tokens after a path the grammar already forbids: its node is dead anyway)."""
        self.sync(state.tokens)
        bits = torch.zeros(len(paths), self._words, dtype=torch.int32)
        words = bits.numpy()
        stride = self._words * 4
        matcher = self._matcher
        for r, path in enumerate(paths):
            consumed = self._consume(path)
            if consumed == len(path):
                matcher.unsafe_compute_mask_ptr(bits.data_ptr() + r * stride, stride)
            else:  # the path holds a forbidden token or ends the answer: nothing to mask
                words[r] = -1
            if consumed:
                matcher.rollback(consumed)
        return _unpack(bits, self.vocab_size)

    def masks(self, tree: DraftTree, tokens: Sequence[int]) -> tuple[torch.Tensor, list[int]]:
        """The allowed-token bits of every row of ``tree`` after ``tokens`` (committed).

        Returns:
            ``bits`` int32, Shape: (N + 1, ceil(V / 32)), and ``source``: for each row, the
            row whose bits and logits it takes (itself when alive; a dead row's nearest live
            ancestor).
        """
        self.sync(tokens)
        n = tree.num_nodes
        bits = torch.zeros(n + 1, self._words, dtype=torch.int32)
        words = bits.numpy()
        source = list(range(n + 1))
        children = tree.children
        node_tokens = tree.tokens.tolist()
        matcher = self._matcher
        stride = self._words * 4
        base = bits.data_ptr()

        def visit(row: int) -> None:
            matcher.unsafe_compute_mask_ptr(base + row * stride, stride)
            for child in children[row]:
                token = node_tokens[child]
                allowed = (
                    token < self.vocab_size and (int(words[row, token >> 5]) >> (token & 31)) & 1
                )
                if not allowed:
                    kill(child + 1, source[row])
                elif token in self._eos:  # the answer ends here: its subtree is never read
                    unmask(child + 1)
                elif matcher.consume_token(token):
                    visit(child + 1)
                    matcher.rollback(1)
                else:  # pragma: no cover - the mask allowed it
                    kill(child + 1, source[row])

        def unmask(row: int) -> None:
            words[row] = -1
            for child in children[row]:
                unmask(child + 1)

        def kill(row: int, live: int) -> None:
            source[row] = live
            for child in children[row]:
                kill(child + 1, live)

        visit(0)
        return bits, source

    def prune(self, tree: DraftTree, state: DecodeState) -> DraftTree:
        """``tree`` without its dead nodes where dropping them keeps the proposal laws: the
        children of a row of fixed candidates, or any child at temperature 0."""
        bits, source = self.masks(tree, state.tokens)
        greedy = state.sampling.is_greedy
        keep: list[int] = []
        kept: set[int] = set()
        for i, parent in enumerate(tree.parents.tolist()):
            if parent >= 0 and parent not in kept:
                continue  # below a dropped node
            dead = source[i + 1] != i + 1
            if dead and (greedy or isinstance(tree.laws[parent + 1], Deterministic)):
                continue
            keep.append(i)
            kept.add(i)
        if len(keep) == tree.num_nodes:
            self._cached = (tree, bits, source)
            return tree
        pruned = _subtree(tree, keep)
        rows = [0, *(i + 1 for i in keep)]
        where = {old: new for new, old in enumerate(rows)}
        self._cached = (pruned, bits[rows], [where[source[r]] for r in rows])
        return pruned

    def apply(self, tree: DraftTree, logits: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """Mask ``logits`` (Shape: (N + 1, V), modified in place and returned): forbidden
        tokens to -inf; a dead row takes its live ancestor's masked row."""
        if self._cached is not None and self._cached[0] is tree:
            _, bits, source = self._cached
        else:
            bits, source = self.masks(tree, state.tokens)
        self._cached = None
        logits.masked_fill_(~_unpack(bits, logits.shape[-1]), float("-inf"))
        dead = [r for r, s in enumerate(source) if s != r]
        if dead:
            logits[dead] = logits[[source[r] for r in dead]]
        return logits


def _subtree(tree: DraftTree, keep: list[int]) -> DraftTree:
    """The nodes ``keep`` of ``tree`` (each one's parent kept too), laws carried over."""
    index = {old: new for new, old in enumerate(keep)}
    parents = [index[p] if p >= 0 else -1 for p in (int(tree.parents[i]) for i in keep)]
    has_children = [False] * (len(keep) + 1)
    for p in parents:
        has_children[p + 1] = True
    rows = [0, *(i + 1 for i in keep)]
    laws = [tree.laws[r] if has_children[k] else None for k, r in enumerate(rows)]
    return DraftTree(tree.tokens[keep], torch.tensor(parents, dtype=torch.long), laws)


class GrammarLogitsProcessor:
    """The grammar as a transformers ``LogitsProcessor`` for plain ``generate`` (batch of one):
    ``model.generate(ids, logits_processor=[GrammarLogitsProcessor(tok, json_schema=s)])``.

    It keeps the matcher's state across calls, so it is for plain decoding only: give
    verispec the constraint as ``json_schema=`` / ``regex=`` / ``grammar=`` instead.

    Args:
        tokenizer: the model's (fast Hugging Face) tokenizer.
        vocab_size: the model's vocabulary (the logits' width); default ``len(tokenizer)``.
        eos_token_ids: default the tokenizer's.
        json_schema, regex, grammar: exactly one (:func:`grammar_text`).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        vocab_size: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
        json_schema: str | dict | None = None,
        regex: str | None = None,
        grammar: str | None = None,
    ) -> None:
        if eos_token_ids is None:
            eos = tokenizer.eos_token_id
            eos_token_ids = [eos] if isinstance(eos, int) else list(eos or [])
        vocab = vocab_size if vocab_size is not None else len(tokenizer)
        self._tokenizer = ll_tokenizer(tokenizer, vocab, eos_token_ids)
        self._grammar = grammar_text(json_schema=json_schema, regex=regex, grammar=grammar)
        self._vocab = vocab
        self._constraint: GrammarConstraint | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[0] != 1:
            raise ConfigError(
                f"GrammarLogitsProcessor decodes a batch of one; got {input_ids.shape[0]} rows."
            )
        if self._constraint is None:  # the first call sees the prompt alone
            self._constraint = GrammarConstraint(
                self._tokenizer, self._grammar, self._vocab, int(input_ids.shape[1])
            )
        self._constraint.sync(input_ids[0].tolist())
        bits = self._constraint.row_mask()
        return scores.masked_fill(~_unpack(bits[None], scores.shape[-1])[0], float("-inf"))
