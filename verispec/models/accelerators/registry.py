"""The accelerators the runtime offers a model, in order, and the call that offers them.

The order is the order of installing: the products first (blocks, then oneDNN for what is
left), then a forward that replaces the eager one (compiled or graphed buckets), then the
attention cores and the C layers (which need to know whether a forward was replaced and
which products run), then the Triton kernels of CUDA graphs. It is also the order in which
:attr:`FastModel.runtime <verispec.models.runtime.FastModel.runtime>` names them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from verispec.models.accelerators.base import Accelerator, Plan
from verispec.models.accelerators.blocks import BlockProducts
from verispec.models.accelerators.c_attention import CAttention
from verispec.models.accelerators.c_layers import CLayers
from verispec.models.accelerators.compiled import CompiledForward
from verispec.models.accelerators.graphs import GraphedForward
from verispec.models.accelerators.invariant import InvariantKernels, TritonAttention
from verispec.models.accelerators.onednn import Prepacked

if TYPE_CHECKING:
    from verispec.models.llama import Transformer

__all__ = ["ACCELERATORS", "accelerate"]

ACCELERATORS: tuple[type[Accelerator], ...] = (
    BlockProducts,
    Prepacked,
    CompiledForward,
    GraphedForward,
    CAttention,
    CLayers,
    TritonAttention,
    InvariantKernels,
)
"""Every accelerator, in the order :func:`accelerate` offers them the model."""


def accelerate(model: Transformer, plan: Plan) -> tuple[Accelerator, ...]:
    """Offer ``model`` to each of :data:`ACCELERATORS` in turn; return those that attached.

    Raises:
        ConfigError: an option of ``plan`` demands an accelerator that cannot run here.
    """
    attached: list[Accelerator] = []
    for kind in ACCELERATORS:
        accelerator = kind.attach(model, plan, tuple(attached))
        if accelerator is not None:
            attached.append(accelerator)
    return tuple(attached)
