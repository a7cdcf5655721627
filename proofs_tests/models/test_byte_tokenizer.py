"""The tiny models' byte tokenizer (:class:`verispec.models.tiny.ByteTokenizer`)."""

from __future__ import annotations

from verispec.models.tiny import ByteTokenizer


def test_text_round_trips_through_the_bytes() -> None:
    """``decode(encode(text))`` is the text, multi-byte characters included; BOS and EOS
    decode to nothing."""
    tokenizer = ByteTokenizer()
    text = "abc: ñ → 漢"
    assert tokenizer.decode([*tokenizer.encode(text), tokenizer.eos_token_id]) == text


def test_ids_past_the_bytes_read_as_replacement_characters() -> None:
    """A random model with a larger vocabulary (SmolLM2's shape: 49,152 ids, the GPU
    check's random-weights bench) emits ids past the 258 the tokenizer has: each decodes as
    U+FFFD, between the bytes around it, instead of failing."""
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("hi")[1:]
    assert tokenizer.decode([ids[0], 258, ids[1], 49151]) == "h\ufffdi\ufffd"
