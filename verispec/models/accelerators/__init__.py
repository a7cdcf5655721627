"""The runtime's accelerators: what makes the plain model fast, handed to it from outside.

The reference decoder (:mod:`verispec.models.llama`, :mod:`verispec.models.attention`)
imports none of these modules. Each implements :class:`~.base.Accelerator` and is offered
the model once, when :class:`~verispec.models.runtime.FastModel` is built
(:func:`~.registry.accelerate`, in the order of :data:`~.registry.ACCELERATORS`):

* :mod:`.blocks`: the block products of GGUF Q4_1, Q4_0 and Q8_0 weights, float32 or integer
  (``arithmetic="int8"``), on the C kernels of :mod:`verispec.kernels.cpu`;
* :mod:`.onednn`: the other weights prepacked for oneDNN;
* :mod:`.compiled` and :mod:`.graphs`: the forward compiled, or replayed from CUDA graphs,
  once per bucket of tree sizes (:mod:`.buckets`; the products inside as opaque operators,
  :mod:`.linear_op`);
* :mod:`.c_attention` and :mod:`.c_layers`: the attention, then every layer and a whole
  decoding step, in one C call;
* :mod:`.invariant`: the Triton kernels of CUDA graphs (static attention, batch-invariant
  products);
* :mod:`.probe`: whether this machine's products give a row the same bits whatever else
  runs (:mod:`verispec.models.invariance` is the rule).
"""
