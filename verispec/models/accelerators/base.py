"""The one interface every accelerator implements, and the plan it decides from.

An accelerator runs part of the plain model (:mod:`verispec.models.llama`) faster, and is
handed to it from outside: the reference decoder imports none of them. When
:class:`~verispec.models.runtime.FastModel` is built it makes one :class:`Plan` (the
device, the weights' format and the options asked for) and offers the model to each
accelerator of :data:`~verispec.models.accelerators.registry.ACCELERATORS` in turn; each
:meth:`Accelerator.attach` decides from the plan, the CPU's flags and the model's weights
whether it can run, and if so installs itself in one of three ways:

* a **product**: it replaces weight product modules (``nn.Linear``) by its own (the block
  and integer products, oneDNN's prepacked weights, the batch-invariant Triton products);
  the plain model calls them as it calls ``nn.Linear``, and a prompt pass calls their
  :class:`~verispec.models.llama.Product` form where they have one;
* an **attention core**: it sets ``Attention.cores[kind]`` of each layer (the C attention
  for tree passes, Triton's for CUDA graphs, an opaque operator for compiled graphs);
* a **forward**: it runs whole passes instead of ``Transformer.forward``, with the same
  arguments (the C layers, the compiled and the graphed buckets): :attr:`Accelerator.forward`.

Adding an accelerator touches its own module and its line in the registry.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import attrs
import torch

if TYPE_CHECKING:
    from verispec.models.llama import Transformer

__all__ = ["Accelerator", "Plan", "find"]

A = TypeVar("A", bound="Accelerator")


@attrs.frozen
class Plan:
    """What the runtime was asked for and where it runs: what every accelerator decides from.

    Attributes:
        device: the model's device.
        weights: :class:`~verispec.models.runtime.FastModel`'s ``weights``
            (``"auto"``, ``"blocks"``, ``"dense"``, ``"q4_1"``).
        arithmetic: ``"exact"`` or ``"int8"`` (its ``arithmetic``).
        attention: ``"auto"``, ``"torch"`` or ``"triton"`` (its ``attention``, ``"auto"``
            already resolved to ``"triton"`` where CUDA graphs run Triton's kernel).
        prepack: ``True``, ``False`` or ``"auto"`` (its ``prepack``).
        compile: compile the forward (its ``compile``).
        graphs: replay CUDA graphs (its ``cuda_graphs``, resolved).
        batch_invariant: the batch-invariant Triton kernels (its ``batch_invariant``).
        gguf_file: the GGUF file the weights were read from (its ``gguf_file``), or ``None``.
    """

    device: torch.device
    weights: str = "auto"
    arithmetic: str = "exact"
    attention: str = "auto"
    prepack: bool | str = "auto"
    compile: bool = False
    graphs: bool = False
    batch_invariant: bool = False
    gguf_file: Path | None = None


class Accelerator(abc.ABC):
    """Something that runs part of the plain model faster, installed on it from outside.

    Attributes:
        label: what :attr:`FastModel.runtime <verispec.models.runtime.FastModel.runtime>`
            adds to its description where it runs (``"+GGUF blocks"``; ``""``: nothing).
        replaces: an accelerator whose work this one takes over where both run (the C
            layers run the C attention's): the description names this one only.
        forward: ``None``, or what runs a pass instead of ``Transformer.forward`` (same
            arguments).
    """

    label: ClassVar[str] = ""
    replaces: ClassVar[type[Accelerator] | None] = None
    forward: Callable[..., torch.Tensor] | None = None

    @classmethod
    @abc.abstractmethod
    def attach(
        cls, model: Transformer, plan: Plan, attached: Sequence[Accelerator]
    ) -> Accelerator | None:
        """Install onto ``model`` where this machine, its weights and ``plan`` allow; return
        the accelerator that runs, or ``None`` (nothing changed).

        Args:
            model: the plain model, as built from the source's weights.
            plan: what the runtime was asked for.
            attached: the accelerators installed before this one, in order.

        Raises:
            ConfigError: the plan demands this accelerator (``weights="blocks"``,
                ``arithmetic="int8"``...) and it cannot run here.
        """

    def describe(self) -> str:
        """This accelerator's part of the runtime's description (:attr:`label`)."""
        return self.label


def find(attached: Sequence[Any], kind: type[A]) -> A | None:
    """The installed accelerator of class ``kind`` in ``attached``, or ``None``."""
    return next((a for a in attached if isinstance(a, kind)), None)
