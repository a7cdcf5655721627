"""Tests of verispec/decoder.py and of the core's independence from it.

The core decoder is handed its drafter and verifier and holds no module-level state;
``verispec.SpeculativeDecoder`` supplies the defaults (its policy by temperature and
``kernels=`` are covered with the loop in ``core/test_engine.py``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import verispec
import verispec.core
from verispec.decoder import SpeculativeDecoder
from verispec.drafters import Autoregressive
from verispec.errors import ConfigError
from verispec.models.markov import MarkovModel


def _model() -> MarkovModel:
    return MarkovModel(torch.zeros(4, 4))


# A fresh interpreter: a fake target, drafter and verifier written here, and only
# verispec.core imported; it prints the verispec modules that got loaded.
_CORE_ONLY = textwrap.dedent(
    """
    import sys
    import torch
    import verispec.core as core

    class Target:
        vocab_size, max_length = 5, 32

        def prefill(self, ids):
            self.last = int(ids[-1])

        def forward_tree(self, tree):
            logits = torch.zeros(tree.num_nodes + 1, 5)
            logits[0, (self.last + 1) % 5] = 1.0
            return logits

        def commit(self, accepted, extra_token):
            self.last = extra_token

        def reset(self):
            pass

    class Empty:
        def begin(self, state):
            pass

        def propose(self, state):
            return core.DraftTree.empty()

        def observe(self, outcome):
            pass

    class Argmax:
        def verify(self, tree, target_logits, sampling, generator):
            return core.Verdict(accepted=(), extra_token=int(target_logits[0].argmax()))

    decoder = core.Engine(Target(), Empty(), Argmax())
    assert decoder.generate([1], max_new_tokens=6).tokens == [2, 3, 4, 0, 1, 2]
    print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] == "verispec")))
    """
)


def test_core_alone_decodes_and_imports_nothing_else_of_verispec() -> None:
    """In a fresh interpreter, ``verispec.core`` builds a decoder from an explicit drafter
    and verifier and decodes, and no verispec module outside ``verispec.core`` and
    ``verispec.errors`` (no drafters, verifiers, models, kernels) gets imported."""
    done = subprocess.run(
        [sys.executable, "-c", _CORE_ONLY], capture_output=True, text=True, check=True
    )
    loaded = done.stdout.split()
    assert "verispec.core.engine" in loaded
    outside = [
        m for m in loaded if m not in ("verispec", "verispec.errors", "verispec.core")
        and not m.startswith("verispec.core.")
    ]  # fmt: skip
    assert outside == []


@pytest.mark.parametrize("missing", ["drafter", "verifier"])
def test_core_decoder_needs_its_drafter_and_verifier(missing: str) -> None:
    """The core decoder has no defaults: a missing drafter or verifier is a ConfigError
    naming it, where ``verispec.SpeculativeDecoder`` fills both in."""
    parts = {"drafter": Autoregressive(), "verifier": lambda sampling: None}
    parts[missing] = None  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=f"`{missing}` must be given"):
        verispec.core.Engine(_model(), **parts)  # type: ignore[arg-type]
    decoder = SpeculativeDecoder(_model())
    assert isinstance(decoder.drafter, Autoregressive)
    assert verispec.SpeculativeDecoder is SpeculativeDecoder
