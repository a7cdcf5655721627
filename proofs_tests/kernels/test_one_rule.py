"""One rejection rule and one backend switch.

* ``RecursiveRejection`` on the PyTorch path returns, for random trees, laws, sampling
  settings and seeds, exactly the verdict of the rejection kernel's twin
  (``reference.rejection_verify``) with the coins the verifier draws; ``RowRejection``
  (the exact laws the audits sum) is the twin's row class.
* The backend is picked in ``verispec.kernels`` only: no module outside it imports the
  switch (``backend_for``...) or a Triton kernel module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import verispec
from verispec.core.sampling import SamplingParams
from verispec.core.tree import DETERMINISTIC, IID, DraftTree, WithoutReplacement
from verispec.kernels import ops, reference
from verispec.verifiers import RecursiveRejection, RowRejection

_LAWS = ("deterministic", "iid", "without_replacement")


@st.composite
def _cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    """A tree whose stochastic rows' children are drawn from their law, logits, settings."""
    vocab = draw(st.integers(2, 40))
    n = draw(st.integers(0, 10))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    shape = DraftTree.from_parents([0] * n, parents)
    tokens = [0] * n
    laws: list = []
    for row in range(n + 1):
        kids = shape.children[row]
        if not kids:
            laws.append(None)
            continue
        kind = draw(st.sampled_from(_LAWS))
        draft = torch.softmax(2 * torch.randn(vocab, generator=g, dtype=torch.float64), 0)
        if kind == "iid":
            drawn = torch.multinomial(draft, len(kids), replacement=True, generator=g)
            laws.append(IID(draft))
        elif kind == "without_replacement" and len(kids) <= vocab:
            drawn = torch.multinomial(draft, len(kids), replacement=False, generator=g)
            laws.append(WithoutReplacement(draft))
        else:
            drawn = torch.randint(0, vocab, (len(kids),), generator=g)
            laws.append(DETERMINISTIC)
        for node, token in zip(kids, drawn.tolist(), strict=True):
            tokens[node] = token
    tree = DraftTree.from_parents(tokens, parents, laws)
    logits = draw(st.sampled_from([1.0, 3.0])) * torch.randn(n + 1, vocab, generator=g)
    sampling = SamplingParams(
        temperature=draw(st.sampled_from([0.5, 1.0])),
        top_k=draw(st.sampled_from([0, 5])),
        top_p=draw(st.sampled_from([1.0, 0.9])),
    )
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    return tree, logits, sampling, dtype, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=150, deadline=None)
@given(_cases())
def test_cpu_verifier_is_the_kernels_twin(case) -> None:  # type: ignore[no-untyped-def]
    """The CPU verifier's verdict (and ``sample_verdicts``' for 3 samples) equals the
    twin's with the same coins, the rows processed as the verifier processes them."""
    tree, logits, sampling, dtype, seed = case
    n = tree.num_nodes
    verifier = RecursiveRejection(dtype, kernels="torch")
    probs = torch.stack([sampling.probs(logits[row], dtype) for row in range(n + 1)])
    codes, draft_row, drafts = ops.law_tensors(tree, logits.shape[1], logits.device)
    tokens, child_ptr, child_idx = ops.tree_csr(tree, logits.device)
    coins = torch.rand(3, n + 1, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    twins = [
        ops.unpack_verdict(
            reference.rejection_verify(
                probs, drafts, draft_row, codes, tokens, child_ptr, child_idx, coins[s]
            )
        )
        for s in range(3)
    ]
    gen = torch.Generator().manual_seed(seed)
    assert verifier.verify(tree, logits, sampling, gen) == twins[0]
    gen = torch.Generator().manual_seed(seed)
    assert verifier.sample_verdicts(tree, logits, sampling, gen, 3) == twins


def test_row_rejection_is_the_twins_row() -> None:
    """The audits' ``RowRejection`` is the twin's ``RejectionRow``: one implementation."""
    assert issubclass(RowRejection, reference.RejectionRow)
    assert RowRejection.reject is reference.RejectionRow.reject
    assert RowRejection.acceptance_probability is reference.RejectionRow.acceptance_probability


_SWITCH = {"backend_for", "tree_attention_backend", "kernel_module", "interpreting"}
_KERNEL_MODULES = {
    "verispec.kernels.triton.greedy_verify",
    "verispec.kernels.triton.rejection_verify",
    "verispec.kernels.triton.token_recycling",
    "verispec.kernels.triton.kv_compaction",
    "verispec.kernels.triton.tree_attention",
}


def test_the_backend_is_chosen_in_verispec_kernels_only() -> None:
    """Outside ``verispec/kernels`` (and its subpackages) no module imports the switch's
    functions, ``triton`` or a kernel module: the verifiers, drafters and models call
    ``kernels.ops``, which picks Triton or the PyTorch twin."""
    package = Path(verispec.__file__).parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if (package / "kernels") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                names = {alias.name for alias in node.names}
                bad = (
                    module.split(".")[0] == "triton"
                    or module in _KERNEL_MODULES
                    or (module.startswith("verispec.kernels") and names & (_SWITCH | {"backend"}))
                    or (module == "verispec.kernels.triton" and names & _KERNEL_MODULES_SHORT)
                )
            elif isinstance(node, ast.Import):
                bad = any(
                    a.name.split(".")[0] == "triton" or a.name in _KERNEL_MODULES
                    for a in node.names
                )
            else:
                continue
            if bad:
                offenders.append(f"{path.relative_to(package)}:{node.lineno}")
    assert offenders == []


_KERNEL_MODULES_SHORT = {name.rsplit(".", 1)[1] for name in _KERNEL_MODULES}
