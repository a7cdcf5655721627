"""GGUF files written at test time with the ``gguf`` package: random blocks of each format,
and files of them (no download, nothing kept in the repository)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

# where each format keeps its float16 fields (random bytes there could be inf or NaN)
HALVES = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_NL": [0], "IQ4_XS": [0],
}  # fmt: skip


def random_blocks(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random bytes as ``rows`` rows of ``kind`` blocks, their float16 fields finite and
    normal (some negative, as llama.cpp's Q4_0, Q5_0 and Q6_K scales are)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    for at in HALVES[kind]:
        sign = rng.choice([-1.0, 1.0], len(data))
        halves = (sign * rng.uniform(0.01, 0.1, len(data))).astype(np.float16)
        data[:, at : at + 2] = halves.view(np.uint8).reshape(-1, 2)
    return data.reshape(rows, -1)


def write_gguf(
    path: Path,
    tensors: dict[str, tuple[str, np.ndarray]],
    metadata: Callable[[GGUFWriter], None] | None = None,
) -> Path:
    """A GGUF file of the architecture ``llama``: ``metadata`` writes its metadata, and each
    tensor is (type name, bytes (rows, row bytes)), or ("F32" / "F16", the values)."""
    writer = GGUFWriter(str(path), "llama")
    if metadata is not None:
        metadata(writer)
    for name, (kind, data) in tensors.items():
        if kind in ("F32", "F16"):
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# A tiny Llama: width 256 (four heads of 64, two key/value heads), two layers, and the
# format of each of its matrices (every kind of widening: 4-bit, 5-bit, K-quants, halves).
WIDTH, HEADS, KV_HEADS, FFN, LAYERS = 256, 4, 2, 512, 2
# (The runtime fuses q, k, v and gate, up into one matrix each: block formats or halves.)
LLAMA_FORMATS = {
    "attn_q": "Q4_K", "attn_k": "Q5_0", "attn_v": "Q6_K", "attn_output": "BF16",
    "ffn_gate": "Q4_0", "ffn_up": "Q5_K", "ffn_down": "F16",
}  # fmt: skip


def _byte_level_vocabulary() -> tuple[list[str], list[str]]:
    """A GPT-2 style vocabulary: the 256 byte symbols, the tokens of a few merges, and
    three special tokens (ChatML's and an end of text); and the merges."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "a t"]
    tokens = symbols + [m.replace(" ", "") for m in merges]
    return [*tokens, "<|endoftext|>", "<|im_start|>", "<|im_end|>"], merges


def llama_gguf(path: Path, *, tied: bool = True, name: str = "Tiny Llama", seed: int = 0) -> Path:
    """A complete Llama GGUF file, as llama.cpp's converter writes one: the model's and the
    tokenizer's metadata (a byte-level BPE with merges and a chat template), random weights
    in :data:`LLAMA_FORMATS` (query and key rows as llama.cpp orders them), float32 norms,
    a Q8_0 embedding and, unless ``tied``, a Q4_1 output matrix."""
    tokens, merges = _byte_level_vocabulary()
    rng = np.random.default_rng(seed)

    def metadata(writer: GGUFWriter) -> None:
        writer.add_name(name)
        writer.add_context_length(512)
        writer.add_embedding_length(WIDTH)
        writer.add_block_count(LAYERS)
        writer.add_feed_forward_length(FFN)
        writer.add_head_count(HEADS)
        writer.add_head_count_kv(KV_HEADS)
        writer.add_rope_dimension_count(WIDTH // HEADS)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(len(tokens))
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types([1] * (len(tokens) - 3) + [3] * 3)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(len(tokens) - 2)
        writer.add_eos_token_id(len(tokens) - 1)
        writer.add_unk_token_id(len(tokens) - 3)
        writer.add_pad_token_id(len(tokens) - 1)
        writer.add_add_bos_token(False)
        writer.add_chat_template(
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        )

    def matrix(kind: str, rows: int, cols: int) -> tuple[str, np.ndarray]:
        if kind == "F16":
            return kind, rng.normal(0, 0.05, (rows, cols)).astype(np.float16)
        if kind == "BF16":
            values = rng.normal(0, 0.05, (rows, cols)).astype(np.float32)
            halves = (values.view(np.uint32) >> 16).astype(np.uint16)
            return kind, halves.view(np.uint8).reshape(rows, 2 * cols)
        return kind, random_blocks(kind, rows, cols, int(rng.integers(1 << 30)))

    shapes = {
        "attn_q": (WIDTH, WIDTH), "attn_k": (WIDTH // HEADS * KV_HEADS, WIDTH),
        "attn_v": (WIDTH // HEADS * KV_HEADS, WIDTH), "attn_output": (WIDTH, WIDTH),
        "ffn_gate": (FFN, WIDTH), "ffn_up": (FFN, WIDTH), "ffn_down": (WIDTH, FFN),
    }  # fmt: skip
    tensors = {"token_embd.weight": matrix("Q8_0", len(tokens), WIDTH)}
    for layer in range(LAYERS):
        for part, kind in LLAMA_FORMATS.items():
            tensors[f"blk.{layer}.{part}.weight"] = matrix(kind, *shapes[part])
        for norm in ("attn_norm", "ffn_norm"):
            tensors[f"blk.{layer}.{norm}.weight"] = (
                "F32",
                rng.uniform(0.5, 1.5, WIDTH).astype(np.float32),
            )
    tensors["output_norm.weight"] = ("F32", rng.uniform(0.5, 1.5, WIDTH).astype(np.float32))
    if not tied:
        tensors["output.weight"] = matrix("Q4_1", len(tokens), WIDTH)
    return write_gguf(path, tensors, metadata)
