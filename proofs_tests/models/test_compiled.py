"""Tests of verispec/models/accelerators/compiled.py: the runtime compiled per tree-size bucket.

Compiling costs tens of seconds per graph on a small CPU, so these tests compile only the
buckets they use (2 and 8), on a tiny float32 model.
"""

from __future__ import annotations

import pytest
import torch
from model_references import tree_reference

from verispec.core import DraftTree
from verispec.models import FastModel, tiny_model


@pytest.fixture(scope="module")
def models() -> tuple[FastModel, FastModel]:
    """(eager, compiled) over one tiny float32 Llama with head dim 16."""
    hf = tiny_model("llama", vocab_size=64, seed=5, dtype=torch.float32, hidden_size=64).hf_model
    return FastModel(hf), FastModel(hf, compile=True)


def test_compiled_tree_rows_equal_compiled_sequential_rows(models) -> None:
    """Compiled, each tree row is the row of decoding its path one token at a time (bit for bit
    where the kernels are row-invariant, else to 1e-5), and agrees with eager mode to 1e-5
    (inductor's fused kernels round in their own order)."""
    eager, compiled = models
    assert compiled.runtime == "compiled+oneDNN"
    prompt, tree = [5, 6, 7, 8, 9], DraftTree.from_parents([1, 2, 3, 4, 5], [-1, 0, 1, -1, 3])
    compiled.prefill(torch.tensor(prompt))
    rows = compiled.forward_tree(tree)  # 6 tokens: bucket 8
    reference = tree_reference(compiled, prompt, tree)  # one token at a time: bucket 2
    if compiled.row_invariant:
        assert torch.equal(rows, reference)
    else:
        assert (rows - reference).abs().max().item() < 1e-5
    eager.prefill(torch.tensor(prompt))
    assert (rows - eager.forward_tree(tree)).abs().max().item() < 1e-5
    assert compiled.setup_s > 0


def test_a_growing_sequence_does_not_recompile(models) -> None:
    """Once a bucket is compiled, passes at new positions reuse its graph: no new graph is built
    and no compile time is added."""
    from torch._dynamo.utils import counters

    _, compiled = models
    compiled.prefill(torch.tensor([1, 2, 3]))
    compiled.forward_tree(DraftTree.empty())  # bucket 2, compiled (or already)
    graphs, seconds = counters["stats"]["unique_graphs"], compiled.setup_s
    for token in range(10, 30):
        compiled.commit([], token)
        compiled.forward_tree(DraftTree.empty())
    assert counters["stats"]["unique_graphs"] == graphs
    assert compiled.setup_s == seconds


def test_after_warm_up_real_passes_build_no_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """After warm_up, a prompt longer than the last bucket and decoding steps build no new graph
    and add no compile time: warm_up makes its inputs as the runtime's passes do, and a pass
    past the last bucket runs eagerly (a new prompt length must not compile)."""
    from torch._dynamo.utils import counters

    from verispec.models.accelerators.compiled import CompiledForward

    monkeypatch.setattr(CompiledForward, "buckets", (2,))  # build one bucket only
    hf = tiny_model("llama", vocab_size=64, seed=6, dtype=torch.float32, hidden_size=64).hf_model
    model = FastModel(hf, compile=True)
    assert model.warm_up() > 0
    graphs, seconds = counters["stats"]["unique_graphs"], model.setup_s
    for length in (140, 151):  # past the last bucket (128)
        model.prefill(torch.arange(length) % 64)
        for token in range(3):
            model.forward_tree(DraftTree.empty())  # bucket 2
            model.commit([], token)
    assert counters["stats"]["unique_graphs"] == graphs
    assert model.setup_s == seconds


def test_a_large_tree_runs_in_a_compiled_bucket(models) -> None:
    """A 70-node tree (71 tokens, past 64) runs in a compiled bucket like any smaller step, so
    its rows equal compiled decoding one token at a time bit for bit where the kernels are
    row-invariant (an eager pass among compiled ones would differ by rounding)."""
    _, compiled = models
    prompt = [5, 6, 7]
    tree = DraftTree.from_parents([i % 64 for i in range(70)], [-1, *range(69)])
    compiled.prefill(torch.tensor(prompt))
    rows = compiled.forward_tree(tree)
    reference = tree_reference(compiled, prompt, tree)
    if compiled.row_invariant:
        assert torch.equal(rows, reference)
    else:
        assert (rows - reference).abs().max().item() < 1e-5
