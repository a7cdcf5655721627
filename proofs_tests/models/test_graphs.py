"""Tests of verispec/models/_graphs.py: the CUDA-graph path's static buffers and attention.

Without a GPU the wrapper runs its static-buffer path without capturing (``capture=False``):
the same buffers, the same :func:`~verispec.models.llama.attend_static` over the whole cache,
so everything but the capture itself is checked here; the capture runs in the GPU test.
"""

from __future__ import annotations

import pytest
import torch
from model_references import tree_reference

from verispec.core import DraftTree
from verispec.errors import ConfigError
from verispec.models import FastModel, tiny_model
from verispec.models._graphs import GraphedForward
from verispec.models.buckets import BUCKETS

V = 64


def _pair(device: str = "cpu", capture: bool = False) -> tuple[FastModel, FastModel]:
    """(eager model, the same weights behind a GraphedForward), float32, head dim 16; both
    with the torch attention, as on CUDA (the C attention is the CPU's)."""
    hf = tiny_model("llama", vocab_size=V, seed=2, dtype=torch.float32, hidden_size=64)
    hf_model = hf.hf_model.to(device)
    eager = FastModel(hf_model, cuda_graphs=False, attention="torch")
    graphed = FastModel(hf_model, cuda_graphs=False, attention="torch")
    graphed._shared.wrapper = GraphedForward(graphed.transformer, capture=capture)
    return eager, graphed


def test_static_path_equals_the_eager_runtime() -> None:
    """Through the static buffers (whole-cache attention, device-side slots), a prefill and then
    a tree pass give exactly the eager runtime's logits, and tree rows equal sequential rows."""
    eager, graphed = _pair()
    assert graphed.runtime == "cuda-graphs+oneDNN"
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    tree = DraftTree.from_parents([7, 8, 9, 10, 11], [-1, 0, 1, -1, 3])
    rows = []
    for model in (eager, graphed):
        model.prefill(torch.tensor(prompt))
        rows.append(model.forward_tree(tree))
        model.commit([3, 4], 12)
        rows.append(model.forward_tree(DraftTree.empty()))
    assert torch.equal(rows[0], rows[2]) and torch.equal(rows[1], rows[3])
    if graphed.row_invariant:
        graphed.prefill(torch.tensor(prompt))
        assert torch.equal(graphed.forward_tree(tree), tree_reference(graphed, prompt, tree))


def test_graphs_allocate_the_whole_context_once() -> None:
    """The graphed model's cache holds the whole context plus the largest bucket from the first
    allocation on (a captured graph holds its addresses), a multiple of 128 slots."""
    _, graphed = _pair()
    graphed.prefill(torch.tensor([1, 2, 3]))
    capacity = graphed._caches[0].capacity
    assert capacity >= graphed.max_length + BUCKETS[-1] and capacity % 128 == 0


def test_cuda_graphs_need_cuda() -> None:
    """cuda_graphs=True on the CPU, or with compile=True, raises ConfigError naming it."""
    hf = tiny_model("llama", vocab_size=V).hf_model
    with pytest.raises(ConfigError, match="`cuda_graphs=True` needs a CUDA model"):
        FastModel(hf, cuda_graphs=True)
    with pytest.raises(ConfigError, match="`cuda_graphs` must be"):
        FastModel(hf, cuda_graphs="yes")


@pytest.mark.gpu
def test_captured_graphs_replay_the_eager_forward() -> None:
    """On CUDA the captured graphs replay the eager runtime's logits (to 1e-4: cuBLAS may
    order sums differently), prefill and tree pass alike, and every bucket captures."""
    eager, graphed = _pair("cuda", capture=True)
    graphed.warm_up()
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    tree = DraftTree.from_parents([7, 8, 9, 10, 11], [-1, 0, 1, -1, 3])
    out = []
    for model in (eager, graphed):
        model.prefill(prompt)
        out.append(model.forward_tree(tree))
    assert (out[0] - out[1]).abs().max().item() < 1e-4
    assert graphed.setup_s > 0
