"""A corpus of earlier outputs and documents for suffix drafting, shared across requests.

A :class:`SuffixCorpus` holds token documents (earlier answers, reference texts) in one
generalised :class:`~verispec.drafters.suffix_automaton.SuffixAutomaton`, so a drafter
can find the longest suffix of its context anywhere in them. It lives as long as the
user keeps it: several drafters (and decoders) may share one, and it can be saved to a
file and loaded back in another process.

**Memory.** The corpus keeps at most ``max_tokens`` tokens. When an added document
takes it past that cap, the oldest documents are dropped until at most three quarters
of the cap remain (never the newest document) and the automaton is rebuilt from the
rest: a rebuild costs at most as many appends as the tokens kept, and at least a quarter
of the cap is added between two rebuilds, so eviction costs amortised O(1) appends per
added token. :meth:`SuffixCorpus.memory_bytes` reports the bytes held (about 400 to
600 per token in CPython: the automaton's transition dicts dominate).

**File format** (version 1): the line ``verispec-suffix-corpus 1``, a JSON line
``{"max_tokens": int, "lengths": [int, ...]}`` (document lengths, oldest first), then
every token as a little-endian int32. Loading checks each part and raises
:class:`~verispec.errors.CorpusFileError` naming the file and what is wrong.
"""

from __future__ import annotations

import json
import os
import sys
from array import array
from collections.abc import Iterable
from pathlib import Path

from verispec.core.paths import write_atomic
from verispec.core.validate import integer
from verispec.drafters.suffix_automaton import COUNT_WALK, SuffixAutomaton
from verispec.errors import ConfigError, CorpusFileError

__all__ = ["DEFAULT_CORPUS_TOKENS", "SuffixCorpus"]

DEFAULT_CORPUS_TOKENS = 1 << 18  # 262,144 tokens: about 100-150 MB in CPython
_MAGIC = b"verispec-suffix-corpus"
_FORMAT = 1
_INT32_MAX = 2**31 - 1


def _tokens(tokens: Iterable[int], name: str) -> array:
    out = array("i")
    for token in tokens:
        value = int(token)
        if not 0 <= value <= _INT32_MAX:
            raise ConfigError(f"`{name}` token ids must be in [0, 2**31); got {value}.")
        out.append(value)
    return out


class SuffixCorpus:
    """Documents indexed by one suffix automaton, with a cap on tokens.

    Args:
        max_tokens: most tokens kept; the oldest documents are evicted beyond it.
        count_walk: see :class:`~verispec.drafters.suffix_automaton.SuffixAutomaton`.

    Raises:
        ConfigError: ``max_tokens`` below 1.
    """

    def __init__(
        self, max_tokens: int = DEFAULT_CORPUS_TOKENS, *, count_walk: int | None = COUNT_WALK
    ) -> None:
        integer("max_tokens", max_tokens, 1)
        self.max_tokens = max_tokens
        self.count_walk = count_walk
        self.documents: list[array] = []
        self.automaton = SuffixAutomaton(count_walk)
        self.version = 0  # changes whenever the automaton does (drafters re-match then)
        self.rebuilds = 0

    @property
    def num_tokens(self) -> int:
        return self.automaton.num_tokens

    @property
    def num_documents(self) -> int:
        return len(self.documents)

    def add(self, tokens: Iterable[int]) -> None:
        """Add one document (e.g. an answer once it is produced).

        A document longer than ``max_tokens`` keeps its last ``max_tokens`` tokens; an
        empty one is ignored.

        Raises:
            ConfigError: a token id that is negative or above 2**31 - 1.
        """
        doc = _tokens(tokens, "tokens")
        if not doc:
            return
        doc = doc[-self.max_tokens :]
        self.documents.append(doc)
        self.version += 1
        if self.num_tokens + len(doc) <= self.max_tokens:
            self.automaton.start_document()
            self.automaton.extend(doc)
            return
        kept, keep = 0, 0  # newest first: keep documents while they fit in 3/4 of the cap
        for doc in reversed(self.documents):
            if keep and kept + len(doc) > self.max_tokens * 3 // 4:
                break
            kept += len(doc)
            keep += 1
        self.documents = self.documents[-keep:]
        self._rebuild()

    def _rebuild(self) -> None:
        self.automaton = SuffixAutomaton(self.count_walk)
        for doc in self.documents:
            self.automaton.start_document()
            self.automaton.extend(doc)
        self.rebuilds += 1
        self.version += 1

    def clear(self) -> None:
        """Forget every document."""
        self.documents = []
        self.automaton = SuffixAutomaton(self.count_walk)
        self.version += 1

    def memory_bytes(self) -> int:
        """Bytes held by the automaton and the stored documents (an upper estimate)."""
        docs = sys.getsizeof(self.documents) + sum(sys.getsizeof(d) for d in self.documents)
        return self.automaton.memory_bytes() + docs

    # -- files ------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the documents to ``path`` (atomically: a temporary file, then a rename)."""
        path = Path(path)
        header = {"max_tokens": self.max_tokens, "lengths": [len(d) for d in self.documents]}

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as out:
                out.write(_MAGIC + b" %d\n" % _FORMAT)
                out.write(json.dumps(header).encode() + b"\n")
                for doc in self.documents:
                    data = array("i", doc)
                    if sys.byteorder != "little":
                        data.byteswap()
                    out.write(data.tobytes())

        write_atomic(path, write)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        max_tokens: int | None = None,
        *,
        count_walk: int | None = COUNT_WALK,
    ) -> SuffixCorpus:
        """Read a corpus written by :meth:`save`.

        Args:
            max_tokens: the cap (default: the saved one); a smaller cap evicts the oldest.

        Raises:
            CorpusFileError: not a corpus file, another format version, a malformed
                header, or token data of the wrong size or range.
        """
        with open(path, "rb") as src:
            first = src.readline()
            second = src.readline()
            payload = src.read()
        magic, _, version = first.rstrip(b"\n").partition(b" ")
        if magic != _MAGIC:
            raise CorpusFileError(
                f"`{path}` is not a verispec suffix corpus: it must start with "
                f"{_MAGIC.decode()!r}; got {first[:40]!r}."
            )
        if version != str(_FORMAT).encode():
            raise CorpusFileError(
                f"`{path}` has corpus format version {version.decode(errors='replace')!r}; "
                f"this verispec reads version {_FORMAT}."
            )
        try:
            header = json.loads(second)
            saved_cap, lengths = int(header["max_tokens"]), list(header["lengths"])
            if not all(isinstance(n, int) and n > 0 for n in lengths):
                raise ValueError("document lengths must be integers > 0")
        except (ValueError, KeyError, TypeError) as exc:
            raise CorpusFileError(
                f"`{path}` has a malformed header ({exc}); expected a JSON line with "
                "`max_tokens` and `lengths`."
            ) from None
        data = array("i")
        if len(payload) != data.itemsize * sum(lengths):
            raise CorpusFileError(
                f"`{path}` holds {len(payload)} bytes of tokens but its header announces "
                f"{sum(lengths)} tokens ({data.itemsize * sum(lengths)} bytes): the file is "
                "truncated or corrupt."
            )
        data.frombytes(payload)
        if sys.byteorder != "little":
            data.byteswap()
        if data and min(data) < 0:
            raise CorpusFileError(f"`{path}` holds a negative token id ({min(data)}).")
        cap = saved_cap if max_tokens is None else max_tokens
        try:
            corpus = cls(cap, count_walk=count_walk)
        except ConfigError as exc:
            raise CorpusFileError(f"`{path}`: {exc}") from None
        start = 0
        for n in lengths:
            corpus.add(data[start : start + n])
            start += n
        return corpus
