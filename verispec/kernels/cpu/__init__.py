"""verispec's C kernels for the CPU, and how they are built.

* the C sources: ``linear.c`` (the block products of GGUF Q4_1, Q4_0 and Q8_0 weights),
  ``int8.c`` (the integer products of ``arithmetic="int8"``), ``attention.c`` (the tree
  attention of one layer), ``prompt_attention.c`` (the attention of a prompt's causal pass),
  ``layer.c`` (every decoder layer of a pass in one call), ``topk.c`` (the logits' top-k
  rows), ``draw.c`` (the coupled rule's draw of a sampled row), with ``simd.h``, the SIMD
  helpers they share;
* :mod:`.build`: compiles a set of them once per machine and source (``-march=native``) and
  loads the library with ``ctypes``;
* :mod:`.features`: the CPU's instruction sets, read once;
* :mod:`.topk`: the top-k kernel's Python entry;
* :mod:`.draw`: the draw kernel's Python entry (:class:`~verispec.verifiers.Coupled` calls it).

The modules that hand the model its products, attention and layers in C (the runtime's
accelerators) are in :mod:`verispec.models.accelerators`; they find their sources with
:func:`source`.
"""

from pathlib import Path

__all__ = ["source"]


def source(name: str) -> Path:
    """The path of one of this package's C sources or headers, e.g. ``source("linear.c")``."""
    return Path(__file__).with_name(name)
