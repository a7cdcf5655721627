"""The autoregressive baseline as a drafter: it always sends the empty tree.

With this drafter the speculative engine decodes one token per target forward,
exactly like plain greedy or sampled decoding, through the same code path as every
other method; benchmarks use it as the ``ar`` baseline. It lives in the core (the
decoder uses it when no drafter is given) and is re-exported here.
"""

from verispec.core.engine import Autoregressive

__all__ = ["Autoregressive"]
