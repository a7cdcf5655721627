"""Tests of verispec/models/accelerators/graphs.py: the CUDA-graph path's static buffers and
attention.

Without a GPU the wrapper runs its static-buffer path without capturing (``capture=False``):
the same buffers, the same :func:`~verispec.models.attention.attend_static` over the whole cache,
so everything but the capture itself is checked here; the capture runs in the GPU test.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from model_references import tree_reference

from verispec.core import DraftTree
from verispec.errors import ConfigError
from verispec.models import FastModel, tiny_model
from verispec.models.accelerators.buckets import GRAPH_BUCKETS
from verispec.models.accelerators.graphs import GraphedForward

V = 64


def _pair(
    device: str = "cpu", capture: bool = False, compile: bool = False
) -> tuple[FastModel, FastModel]:
    """(eager model, the same weights behind a GraphedForward), float32, head dim 16; both
    with the torch attention, as on CUDA (the C attention is the CPU's); with ``compile``,
    plain ``nn.Linear`` products, as on CUDA (no oneDNN prepacking)."""
    hf = tiny_model("llama", vocab_size=V, seed=2, dtype=torch.float32, hidden_size=64)
    hf_model = hf.hf_model.to(device)
    options: dict[str, Any] = {"prepack": False} if compile else {}
    eager = FastModel(hf_model, cuda_graphs=False, attention="torch", **options)
    graphed = FastModel(hf_model, cuda_graphs=False, attention="torch", **options)
    graphed._shared.wrapper = GraphedForward(graphed.transformer, capture=capture, compile=compile)
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
    assert capacity >= graphed.max_length + GRAPH_BUCKETS[-1] and capacity % 128 == 0


def test_a_tree_of_128_nodes_runs_a_graph() -> None:
    """A tree of 128 nodes and its root (129 tokens) runs in a graph's bucket (160), not
    eagerly past the last one, and its rows are the eager runtime's, bit for bit."""
    eager, graphed = _pair()
    assert graphed._shared.bucket(129) == 160 and 160 in GRAPH_BUCKETS
    calls = []
    wrapper = graphed._shared.wrapper
    assert wrapper is not None
    run_bucket = wrapper.run_bucket
    wrapper.run_bucket = lambda p: (  # type: ignore[method-assign]
        calls.append(len(p.tokens)) or run_bucket(p)
    )
    tree = DraftTree.from_parents(
        torch.arange(128) % V, [i - 1 if i % 8 else -1 for i in range(128)]
    )
    rows = []
    for model in (eager, graphed):
        model.prefill(torch.tensor([3, 1, 4, 1, 5]))
        rows.append(model.forward_tree(tree))
    assert calls[-1] == 160  # (the short prefill ran in bucket 8 before it)
    assert torch.equal(rows[0], rows[1])


def test_compiled_static_path_follows_the_eager_forward() -> None:
    """``compile=True`` with graphs: inductor compiles the static forward once for every
    bucket (the row count symbolic), and its logits follow the eager runtime's (to 1e-5 of
    their scale: fused norms and SwiGLU round differently) for a prefill and trees of three
    bucket sizes."""
    from torch._dynamo.utils import counters

    eager, graphed = _pair(compile=True)
    assert graphed.runtime.startswith("compiled+cuda-graphs")
    before = counters["stats"]["unique_graphs"]
    for model in (eager, graphed):
        model.prefill(torch.tensor([3, 1, 4, 1, 5, 9, 2, 6]))
    for nodes in (3, 9, 40):  # buckets 4, 12 and 48
        tree = DraftTree.from_parents(torch.arange(nodes) % V, [i - 1 for i in range(nodes)])
        rows = [model.forward_tree(tree) for model in (eager, graphed)]
        scale = rows[0].abs().max().item()  # ~3: 1e-5 of it is ~100 float32 ulps there
        assert (rows[0] - rows[1]).abs().max().item() < 1e-5 * scale
    assert counters["stats"]["unique_graphs"] - before <= 2  # not one compile per bucket
    assert graphed.setup_s > 0


def test_cuda_graphs_need_cuda() -> None:
    """cuda_graphs=True on the CPU raises ConfigError naming it, as does a bad value."""
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


def test_triton_options_need_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """``batch_invariant=True`` or ``attention="triton"`` where the graphed runtime's Triton
    kernels cannot run raise ConfigError naming the option and why, before any weight is
    converted; ``attention="auto"`` then keeps the torch attention."""
    import verispec.models.runtime as runtime

    monkeypatch.setattr(runtime, "graph_kernels_unavailable", lambda device: "no CUDA here")
    hf = tiny_model("llama", vocab_size=V).hf_model
    with pytest.raises(
        ConfigError, match=r"`batch_invariant=True` needs the Triton kernels.*no CUDA"
    ):
        FastModel(hf, batch_invariant=True)
    with pytest.raises(ConfigError, match=r"`attention='triton'` needs the Triton kernels"):
        FastModel(hf, attention="triton")
    assert "Triton" not in FastModel(hf, cuda_graphs=False).runtime
