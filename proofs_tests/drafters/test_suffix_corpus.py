"""Tests of verispec/drafters/suffix_corpus.py: documents, eviction, memory, files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verispec.drafters.suffix_corpus import SuffixCorpus
from verispec.errors import ConfigError, CorpusFileError


def _occurs(corpus: SuffixCorpus, pattern: list[int]) -> int:
    state = 0
    for token in pattern:
        state = corpus.automaton.next[state].get(token, -1)
        if state < 0:
            return 0
    return corpus.automaton.occ[state]


def test_documents_are_searchable_but_never_joined() -> None:
    """A substring of one document is found with its count; a string that spans the end
    of one document and the start of the next is not."""
    corpus = SuffixCorpus()
    corpus.add([1, 2, 3])
    corpus.add([4, 1, 2])
    assert _occurs(corpus, [1, 2]) == 2
    assert _occurs(corpus, [3, 4]) == 0
    assert corpus.num_tokens == 6 and corpus.num_documents == 2


def test_cap_evicts_the_oldest_documents_and_keeps_the_newest() -> None:
    """Past max_tokens, the oldest documents go until at most 3/4 of the cap is left, the
    automaton is rebuilt from the rest, and what was evicted is no longer found."""
    corpus = SuffixCorpus(max_tokens=20)
    for start in range(0, 60, 6):
        corpus.add(range(start + 100, start + 106))  # distinct 6-token documents
        assert corpus.num_tokens <= 20
    assert [list(d) for d in corpus.documents] == [list(range(148, 154)), list(range(154, 160))]
    assert corpus.num_tokens == 12 and corpus.rebuilds >= 1
    assert _occurs(corpus, [154, 155]) == 1 and _occurs(corpus, [100]) == 0


def test_eviction_is_amortised() -> None:
    """Adding 10,000 one-token documents under a cap of 100 rebuilds at most once per 25
    added tokens (a quarter of the cap), so appends stay amortised O(1) per token."""
    corpus = SuffixCorpus(max_tokens=100)
    for token in range(10_000):
        corpus.add([token % 50])
    assert corpus.rebuilds <= 10_000 // 25
    assert 75 <= corpus.num_tokens <= 100


def test_a_document_longer_than_the_cap_keeps_its_end() -> None:
    """A document of more than max_tokens tokens keeps its last max_tokens tokens."""
    corpus = SuffixCorpus(max_tokens=5)
    corpus.add([1, 2])
    corpus.add(range(10))
    assert [list(d) for d in corpus.documents] == [[5, 6, 7, 8, 9]]


def test_memory_is_reported_in_bytes_and_bounded_by_the_cap() -> None:
    """memory_bytes() grows with the corpus and stops growing once the cap is reached."""
    corpus = SuffixCorpus(max_tokens=2000)
    empty = corpus.memory_bytes()
    corpus.add(range(1000))
    half = corpus.memory_bytes()
    assert half > empty + 1000 * 100
    for start in range(0, 20_000, 1000):
        corpus.add(range(start, start + 1000))
    assert corpus.memory_bytes() < 3 * half


def test_clear_forgets_everything() -> None:
    """clear() leaves an empty corpus and changes its version (drafters re-match)."""
    corpus = SuffixCorpus()
    corpus.add([1, 2, 3])
    version = corpus.version
    corpus.clear()
    assert corpus.num_tokens == 0 and corpus.num_documents == 0 and corpus.version != version


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    """A saved corpus loads back with the same documents, cap and counts; a smaller cap
    given at load evicts the oldest documents; no temporary file is left behind."""
    corpus = SuffixCorpus(max_tokens=50)
    corpus.add([5, 6, 7, 5, 6])
    corpus.add([2**31 - 1, 0, 5, 6])
    path = tmp_path / "corpus.vsc"
    corpus.save(path)
    back = SuffixCorpus.load(path)
    assert [list(d) for d in back.documents] == [list(d) for d in corpus.documents]
    assert back.max_tokens == 50 and _occurs(back, [5, 6]) == 3
    assert [list(d) for d in SuffixCorpus.load(path, max_tokens=4).documents] == [
        [2**31 - 1, 0, 5, 6]
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.vsc"]


def _write(path: Path, head: bytes, header: object, payload: bytes) -> Path:
    path.write_bytes(head + json.dumps(header).encode() + b"\n" + payload)
    return path


@pytest.mark.parametrize(
    ("head", "header", "payload", "match"),
    [
        (b"not a corpus\n", {}, b"", "is not a verispec suffix corpus"),
        (b"verispec-suffix-corpus 2\n", {}, b"", "format version '2'"),
        (b"verispec-suffix-corpus 1\n", {"lengths": [1]}, b"\0" * 4, "malformed header"),
        (b"verispec-suffix-corpus 1\n", {"max_tokens": 9, "lengths": [0]}, b"", "lengths"),
        (
            b"verispec-suffix-corpus 1\n",
            {"max_tokens": 9, "lengths": [2]},
            b"\0" * 4,
            "truncated or corrupt",
        ),
        (
            b"verispec-suffix-corpus 1\n",
            {"max_tokens": 9, "lengths": [1]},
            b"\xff" * 4,
            "negative token id",
        ),
        (b"verispec-suffix-corpus 1\n", {"max_tokens": 0, "lengths": [1]}, b"\0" * 4, "max_tokens"),
    ],
)
def test_bad_files_are_refused_with_a_clear_error(
    tmp_path: Path, head: bytes, header: object, payload: bytes, match: str
) -> None:
    """A wrong magic line, another version, a malformed header, a payload of the wrong
    size or a negative token raise CorpusFileError naming the file and the problem."""
    path = _write(tmp_path / "bad.vsc", head, header, payload)
    with pytest.raises(CorpusFileError, match=match) as info:
        SuffixCorpus.load(path)
    assert "bad.vsc" in str(info.value)


def test_bad_arguments_are_refused() -> None:
    """A cap below 1 and token ids out of int32 range raise ConfigError naming them."""
    with pytest.raises(ConfigError, match="`max_tokens` must be an integer >= 1"):
        SuffixCorpus(0)
    with pytest.raises(ConfigError, match="token ids must be in"):
        SuffixCorpus().add([1, -2])
