"""Tests of GGUF's block formats read from the file (verispec/models/gguf_codes.py,
gguf_rows.py) and multiplied by the CPU kernel's Q8_2 blocks.

What they promise: every decoded format widens, through the kernel, to the bits the ``gguf``
package's own dequantization gives (the weights transformers loads); the Q8_2 product
equals its float32 twin bit for bit, for any row count and thread count; the rows of a
file are found in the matrices built from them however they were reordered, fused, scaled
by a power of two or tied, and a row that is not in the file is not; and a model whose
matrices come from K-quant files runs every product on blocks, its tree rows equal to
sequential decoding bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from block_checks import assert_avx512_equals_avx2, assert_rows_invariant
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize
from gguf_files import HALVES, random_blocks, write_gguf
from hypothesis import given, settings
from hypothesis import strategies as st
from model_references import draft_trees, tree_reference
from torch import nn

from verispec.core import DraftTree
from verispec.errors import ConfigError
from verispec.kernels.cpu.features import cpu_flags
from verispec.models import FastModel, tiny_model
from verispec.models.accelerators.blocks import LAYOUTS, BlockLinear, kernel_status, pack_codes
from verispec.models.gguf import matrices
from verispec.models.gguf_codes import DECODED, Codes, decode
from verispec.models.gguf_rows import FileRows

available, why = kernel_status()
needs_kernel = pytest.mark.skipif(not available, reason=f"block kernel unavailable: {why}")

# the layout each format's blocks are multiplied in
_LAYOUT = {
    "Q4_0": "q4_0", "Q4_1": "q4_1", "Q4_K": "q4_1", "Q5_0": "q8_0", "Q5_1": "q5_1",
    "Q5_K": "q5_1", "Q8_0": "q8_0", "IQ4_NL": "q8_0", "IQ4_XS": "q8_0", "Q2_K": "q8_2",
    "Q3_K": "q8_16", "Q6_K": "q8_16",
}  # fmt: skip
# and under arithmetic="int8", where only Q4_1 and Q8_0 have integer products
_INT8_LAYOUT = {"Q4_0": "q4_1", "Q4_1": "q4_1", "Q4_K": "q4_1", "Q5_0": "q8_0", "Q8_0": "q8_0",
                "IQ4_NL": "q8_0", "IQ4_XS": "q8_0"}  # fmt: skip


def widened(kind: str, data: np.ndarray, cols: int) -> torch.Tensor:
    """The gguf package's float32 widening of ``data`` (what transformers loads)."""
    values = dequantize(data, GGMLQuantizationType[kind]).reshape(data.shape[0], cols)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def test_the_decoders_cover_the_formats_of_llama_cpps_presets() -> None:
    """Every block format llama.cpp's quantization presets write (the K-quant mixes fall
    back to Q4_0, Q5_0, Q5_1, Q8_0 and IQ4_NL for widths that are not whole super-blocks)
    has a decoder."""
    assert set(DECODED) == set(HALVES)


@needs_kernel
@pytest.mark.parametrize("kind", DECODED)
def test_each_format_widens_to_the_gguf_packages_bits(kind: str) -> None:
    """Random blocks of each format, packed in the layout chosen for them (and in the one
    chosen for integer products), widen through the kernel to the gguf package's values bit
    for bit (Q4_0 and Q5_0 up to a zero's sign, which no product sees: its sums start at
    +0)."""
    cols = 512
    data = random_blocks(kind, 24, cols, seed=len(kind))
    codes = decode(kind, data, cols)
    expected = widened(kind, data, cols)
    for layouts, chosen in ((LAYOUTS, _LAYOUT), (("q4_1", "q8_0"), _INT8_LAYOUT)):
        packed = pack_codes(codes.code, codes.scale, codes.low, layouts)  # type: ignore[arg-type]
        if kind not in chosen:
            assert packed is None
            continue
        assert packed is not None and packed[0] == chosen[kind]
        got = BlockLinear(packed[0], packed[1], cols, 24, None).dequantized()
        assert torch.equal(got, expected)
        if kind not in ("Q4_0", "Q5_0"):
            assert torch.equal(got.view(torch.int32), expected.view(torch.int32))


def test_decode_names_bad_input() -> None:
    with pytest.raises(ValueError, match="`kind` must be one of"):
        decode("IQ2_XXS", np.zeros((1, 66), np.uint8), 256)
    with pytest.raises(ValueError, match="Q6_K rows of 256 weights are 1 blocks of 210 bytes"):
        decode("Q6_K", np.zeros((2, 200), np.uint8), 256)


def coded_linear(
    layout: str, rows: int, cols: int, seed: int, bias: bool = False
) -> tuple[nn.Linear, BlockLinear]:
    """A linear layer whose weight is ``layout`` blocks, and its block product: Q8_2 with
    6-bit codes and a scale and a low for each 16 weights (as Q2_K and mixed rows are held),
    Q8_16 the same without lows (Q6_K, Q3_K), Q5_1 with 5-bit codes and one scale and low
    for 32 (Q5_1, Q5_K), Q4_0 with 4-bit codes over a low of -8 times a signed scale for
    32."""
    generator = torch.Generator().manual_seed(seed)
    groups = 1 if layout in ("q8_2", "q8_16") else 2  # 16-weight groups sharing a scale
    lowest, highest = {"q5_1": (0, 32), "q4_0": (0, 16)}.get(layout, (-32, 32))
    code = torch.randint(lowest, highest, (rows, cols), generator=generator, dtype=torch.int8)
    scale = (torch.rand(rows, cols // 16 // groups, generator=generator) * 0.004).half().float()
    low = (torch.randn(rows, cols // 16 // groups, generator=generator) * 0.02).half().float()
    if layout == "q4_0":  # llama.cpp's Q4_0 scales take either sign
        scale = torch.where(low < 0, -scale, scale)
        low = scale * -8
    elif layout == "q8_16":
        low = torch.full_like(low, -0.0)
    scale, low = scale.repeat_interleave(groups, 1), low.repeat_interleave(groups, 1)
    codes = Codes(code.numpy(), scale.numpy(), low.numpy())
    packed = pack_codes(codes.code, codes.scale, codes.low)
    assert packed is not None and packed[0] == layout
    linear = nn.Linear(cols, rows, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(BlockLinear(packed[0], packed[1], cols, rows, None).dequantized())
        if bias:
            linear.bias.copy_(torch.randn(rows, generator=generator))
    block = BlockLinear.from_codes(linear, codes)
    assert block is not None and block.fmt == layout
    return linear, block


@needs_kernel
@pytest.mark.parametrize("layout", ["q8_2", "q8_16", "q5_1", "q4_0"])
@pytest.mark.parametrize("bias", [False, True])
def test_the_product_equals_its_float32_twin_bit_for_bit(layout: str, bias: bool) -> None:
    """The Q8_2, Q8_16, Q5_1 and Q4_0 products equal the kernel's float32 product on the
    widened matrix bit for bit, and torch's float64 product to rounding."""
    linear, block = coded_linear(layout, 72, 576, seed=5, bias=bias)
    twin = BlockLinear.from_linear(linear, ("float32",))
    assert twin is not None
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(1))
    got = block(x)
    assert torch.equal(got, twin(x))
    expected = nn.functional.linear(
        x.double(), linear.weight.double(), None if not bias else linear.bias.double()
    )
    assert (got.double() - expected).abs().max().item() < 1e-5


@needs_kernel
@pytest.mark.parametrize("layout", ["q8_2", "q8_16", "q5_1", "q4_0"])
def test_rows_do_not_depend_on_row_count_or_threads(layout: str) -> None:
    """Each row's bits are the same for 1 to 40 rows (the register paths and the widened
    buffer), and on one or two threads."""
    _, block = coded_linear(layout, 67, 1536, seed=6)
    assert_rows_invariant(block, torch.randn(40, 1536, generator=torch.Generator().manual_seed(2)))


@needs_kernel
@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU has no AVX-512")
@pytest.mark.parametrize("layout", ["q8_2", "q8_16", "q5_1", "q4_0"])
def test_avx512_products_equal_the_avx2_products_bit_for_bit(layout: str) -> None:
    """On an AVX-512 CPU the native build (16-lane registers, the new layouts widened eight
    lanes at a time and joined) gives every bit the eight-lane AVX2 build gives, for 1 to 20
    rows, on one or two threads."""
    _, block = coded_linear(layout, 67, 1536, seed=3, bias=True)
    assert_avx512_equals_avx2(
        block, torch.randn(20, 1536, generator=torch.Generator().manual_seed(4))
    )


@needs_kernel
def test_from_codes_refuses_codes_that_do_not_widen_to_the_weight() -> None:
    """Codes whose widening differs from the weight in one value are refused, as are codes of
    another shape, and codes of a layout the integer product lacks under int8."""
    linear = nn.Linear(256, 8, bias=False)
    data = random_blocks("Q6_K", 8, 256, seed=8)
    codes = decode("Q6_K", data, 256)
    with torch.no_grad():
        linear.weight.copy_(widened("Q6_K", data, 256))
    assert BlockLinear.from_codes(linear, codes) is not None
    assert BlockLinear.from_codes(linear, codes, "int8") is None  # Q8_16: no integer product
    with torch.no_grad():
        linear.weight[3, 17] = torch.nextafter(linear.weight[3, 17], torch.tensor(1.0))
    assert BlockLinear.from_codes(linear, codes) is None
    other = decode("Q6_K", random_blocks("Q6_K", 4, 256, seed=9), 256)
    assert BlockLinear.from_codes(linear, other) is None


# -- finding a file's rows -----------------------------------------------------------------


def test_the_header_reader_finds_every_matrix(tmp_path: Path) -> None:
    """verispec's own header reader gives each matrix's type, shape and bytes as written."""
    tensors = {
        "a": ("Q4_K", random_blocks("Q4_K", 6, 512, seed=1)),
        "b": ("Q5_0", random_blocks("Q5_0", 3, 96, seed=2)),
    }
    write_gguf(tmp_path / "m.gguf", tensors)
    found = {
        info.name: (kind, info.shape, np.asarray(raw))
        for info, kind, raw in matrices(tmp_path / "m.gguf")
    }
    assert found.keys() == tensors.keys()
    for name, (kind, data) in tensors.items():
        assert found[name][0] == kind
        assert found[name][1] == (
            data.shape[1]
            // GGML_QUANT_SIZES[GGMLQuantizationType[kind]][1]
            * GGML_QUANT_SIZES[GGMLQuantizationType[kind]][0],
            data.shape[0],
        )
        assert np.array_equal(found[name][2], data)


@needs_kernel
def test_rows_are_found_reordered_fused_scaled_and_tied(tmp_path: Path) -> None:
    """A matrix made of the file's rows (two matrices' rows permuted, fused, the first one's
    scaled by 1/8 as the runtime's query rows are) is found as blocks that widen to it bit
    for bit; a matrix with one row changed is not found."""
    q = random_blocks("Q5_0", 16, 256, seed=1)
    v = random_blocks("Q6_K", 8, 256, seed=2)
    write_gguf(tmp_path / "m.gguf", {"q": ("Q5_0", q), "v": ("Q6_K", v)})
    rows = FileRows(tmp_path / "m.gguf")
    assert rows.types == {"Q5_0": 1, "Q6_K": 1}
    order = torch.randperm(16, generator=torch.Generator().manual_seed(3))
    fused = torch.cat([widened("Q5_0", q, 256)[order] / 8, widened("Q6_K", v, 256)])
    linear = nn.Linear(256, 24, bias=False)
    with torch.no_grad():
        linear.weight.copy_(fused)
    codes = rows.codes_for(linear.weight)
    assert codes is not None
    block = BlockLinear.from_codes(linear, codes)
    assert block is not None and block.fmt == "q8_16"  # a scale a 16 weights for Q6_K rows
    assert torch.equal(block.dequantized(), fused)
    with torch.no_grad():
        linear.weight[5] = torch.randn(256)
    assert rows.codes_for(linear.weight) is None


# -- a model of K-quant matrices -----------------------------------------------------------

_MIX = {"q_proj": "Q4_K", "k_proj": "Q5_0", "v_proj": "Q6_K", "o_proj": "Q5_K",
        "gate_proj": "Q3_K", "up_proj": "Q2_K", "down_proj": "IQ4_XS"}  # fmt: skip
V = 64


@pytest.fixture(scope="module")
def kquant_source(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path]:
    """A tiny float32 Llama (width 256) whose matrices are widened from random K-quant and
    5-bit blocks, and the GGUF file of those blocks (under the module names, unpermuted:
    rows are found by their values); the embedding and the head are Q8_0."""
    hf = tiny_model(
        "llama", vocab_size=V, seed=1, dtype=torch.float32, hidden_size=256, max_length=128,
    ).hf_model  # fmt: skip
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    with torch.no_grad():
        for seed, (name, module) in enumerate(hf.named_modules()):
            kind = next((k for part, k in _MIX.items() if name.endswith(part)), None)
            tied = module is hf.lm_head and hf.lm_head.weight is hf.model.embed_tokens.weight
            if isinstance(module, nn.Embedding) or (module is hf.lm_head and not tied):
                kind = "Q8_0"
            if kind is None:
                continue
            rows, cols = module.weight.shape
            data = random_blocks(kind, rows, cols, seed)
            module.weight.copy_(widened(kind, data, cols))
            tensors[name] = (kind, data)
    path = tmp_path_factory.mktemp("kquants") / "kquants.gguf"
    write_gguf(path, tensors)
    return hf, path


@pytest.fixture(scope="module")
def kquant_model(kquant_source: tuple[nn.Module, Path]) -> FastModel:
    hf, path = kquant_source
    return FastModel(hf, dtype=torch.float32, weights="blocks", gguf_file=path)


@needs_kernel
def test_a_k_quant_model_reads_every_matrix_from_its_file(kquant_model: FastModel) -> None:
    """weights='blocks' holds: every product (fused ones of mixed formats included) is blocks
    read from the file, in the layout its rows need."""
    products = [
        m for m in kquant_model.transformer.modules() if isinstance(m, nn.Linear | BlockLinear)
    ]
    assert products and all(isinstance(m, BlockLinear) for m in products)
    block = kquant_model.transformer.blocks[0]
    assert block.attention.wqkv.fmt == "q8_2"  # Q4_K, Q5_0 and Q6_K rows together
    assert block.attention.wo.fmt == "q5_1"  # Q5_K
    assert block.feed_forward.w2.fmt == "q8_0"  # IQ4_XS: table values times a scale
    assert kquant_model.transformer.output.fmt == "q8_0"


@needs_kernel
@settings(max_examples=8, deadline=None)
@given(prompt=st.lists(st.integers(0, V - 1), min_size=1, max_size=8), tree=draft_trees(V, 14))
def test_k_quant_tree_rows_are_bitwise_sequential(
    kquant_model: FastModel, prompt: list[int], tree: DraftTree
) -> None:
    """On blocks read from K-quant and 5-bit files, each tree row is bit for bit the row that
    decoding its path one token at a time gives."""
    kquant_model.prefill(torch.tensor(prompt))
    got = kquant_model.forward_tree(tree)
    assert torch.equal(got, tree_reference(kquant_model, prompt, tree))


@needs_kernel
def test_int8_arithmetic_keeps_the_file_codes_it_has_a_product_for(
    kquant_source: tuple[nn.Module, Path],
) -> None:
    """With arithmetic='int8', Q4_1- and Q8_0-shaped blocks keep the file's codes (the
    IQ4_XS down projection); a matrix that needs Q8_2 is rounded to Q8_0, as any matrix
    without blocks is."""
    hf, path = kquant_source
    model = FastModel(hf, dtype=torch.float32, arithmetic="int8", gguf_file=path)
    block = model.transformer.blocks[0]
    down = block.feed_forward.w2
    assert down.arithmetic == "int8" and down.fmt == "q8_0"
    assert torch.equal(down.dequantized(), hf.model.layers[0].mlp.down_proj.weight)
    wqkv = block.attention.wqkv
    assert wqkv.arithmetic == "int8" and wqkv.fmt == "q8_0"  # rounded


def test_a_missing_gguf_file_is_named(kquant_source: tuple[nn.Module, Path]) -> None:
    hf, path = kquant_source
    with pytest.raises(ConfigError, match=r"`gguf_file` must be a GGUF file; got '.*nowhere"):
        FastModel(hf, gguf_file=path.parent / "nowhere.gguf")


@needs_kernel
def test_auto_dtype_keeps_float32_for_a_file_the_kernels_read(
    kquant_source: tuple[nn.Module, Path],
) -> None:
    """dtype='auto' keeps float32 (where the blocks run) for a model whose file holds block
    matrices, even where its float32 weights give no blocks back and the CPU multiplies
    bfloat16 natively (the AVX-512 BF16 EPYC)."""
    hf, path = kquant_source
    model = FastModel(hf, dtype="auto", gguf_file=path)
    assert model.dtype == torch.float32
    assert isinstance(model.transformer.blocks[0].attention.wqkv, BlockLinear)


# -- F16 and BF16 matrices ----------------------------------------------------------------


@needs_kernel
@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_half_matrices_are_read_as_halves_bit_for_bit(fmt: str) -> None:
    """A float32 matrix whose every weight is a half (a bfloat16) is read as halves that widen
    to it bit for bit, its product equals the float32 twin's bit for bit for 1 to 40 rows on
    one or two threads; a weight that is not one refuses the format."""
    dtype = torch.float16 if fmt == "f16" else torch.bfloat16
    linear = nn.Linear(576, 67, bias=True)
    with torch.no_grad():
        linear.weight.copy_(linear.weight.to(dtype).float())
    block = BlockLinear.from_linear(linear, (fmt,))  # type: ignore[arg-type]
    twin = BlockLinear.from_linear(linear, ("float32",))
    assert block is not None and block.fmt == fmt and twin is not None
    assert torch.equal(block.dequantized().view(torch.int32), linear.weight.view(torch.int32))
    x = torch.randn(40, 576, generator=torch.Generator().manual_seed(2))
    assert torch.equal(block(x), twin(x))
    assert_rows_invariant(block, x)
    with torch.no_grad():
        linear.weight[3, 5] = torch.nextafter(linear.weight[3, 5], torch.tensor(1.0))
    assert BlockLinear.from_linear(linear, (fmt,)) is None  # type: ignore[arg-type]


@needs_kernel
def test_an_f16_file_runs_every_product_on_halves(tmp_path: Path) -> None:
    """A model whose GGUF file holds F16 matrices reads them as halves (2 bytes a weight, not
    4), its tree rows still equal sequential decoding; without the file it stays dense."""
    hf = tiny_model(
        "llama", vocab_size=V, seed=3, dtype=torch.float32, hidden_size=64, max_length=64,
    ).hf_model  # fmt: skip
    writer = GGUFWriter(str(tmp_path / "f16.gguf"), "llama")
    with torch.no_grad():
        for name, module in hf.named_modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                # halves, none so small that the query rows' folded softmax scale would
                # make them subnormal (then they are no halves any more: docs/models.rst)
                weight = module.weight.half().float()
                module.weight.copy_(torch.where(weight.abs() < 2**-10, 0.0, weight))
                writer.add_tensor(name, module.weight.half().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model = FastModel(hf, dtype=torch.float32, weights="blocks", gguf_file=tmp_path / "f16.gguf")
    products = [m for m in model.transformer.modules() if isinstance(m, nn.Linear | BlockLinear)]
    assert products and all(isinstance(m, BlockLinear) and m.fmt == "f16" for m in products)
    tree = DraftTree.from_parents([5, 9, 11, 2], [-1, 0, 0, 1])
    prompt = [1, 2, 3]
    model.prefill(torch.tensor(prompt))
    assert torch.equal(model.forward_tree(tree), tree_reference(model, prompt, tree))
    assert "GGUF blocks" not in FastModel(hf, dtype=torch.float32).runtime
