"""Mutation testing of verispec's exactness-critical code: a benchmark-time audit.

Not part of the test command. For each group below, `mutmut <https://mutmut.readthedocs.io>`_
(3.x) changes the group's functions one small edit at a time (an operator, a constant, a
name, an argument) and runs the group's fast tests against each change; a change that no
test notices *survives*. A survivor is either equivalent (it cannot change an output: say
why) or a missing test (write it). docs/exactness.rst, "Mutation testing", has the last
run's score and every survivor with its reason.

Nothing in the checkout is modified: each group runs in its own copy of ``verispec/``,
``proofs_tests/`` and ``pyproject.toml`` under ``--workdir`` (mutmut writes its mutants
into that copy's ``mutants/``), with a ``setup.cfg`` holding the group's mutmut settings.
Error messages are not mutated (lines that start with a string, and ``raise X("...")``):
their text cannot change what is generated. Tests run in order of their measured duration,
fastest first, and stop at the first failure.

Usage (mutmut is not a dependency of verispec: ``pip install 'mutmut==3.8.1'``)::

    .venv/bin/python benchmarks/mutation.py                   # every group, every mutant
    .venv/bin/python benchmarks/mutation.py processors kv     # some groups
    .venv/bin/python benchmarks/mutation.py reference --sample 6   # every 6th mutant
    .venv/bin/python benchmarks/mutation.py verifiers --mutants names.txt   # a recheck
    .venv/bin/python benchmarks/mutation.py --list            # the groups, their code and tests

On one core of a shared 2-core CPU the processors group (232 mutants) took 36 minutes;
the others' tests are slower per mutant (about 11 s for the reference group). It prints each
group's score and the diff of every survivor (a timeout counts as detected: the tests did
not pass), and writes ``WORKDIR/summary.json``; ``mutmut show NAME`` in ``WORKDIR/GROUP``
shows a mutant. The commands of the recorded run are in docs/exactness.rst.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("verispec", "proofs_tests", "pyproject.toml")
NOT_MESSAGES = (r"""^\s*[rfb]*["']""", r"""raise \w+\([rfb]*["']""")
NOT_SLOW = "not slow and not gpu"
STATUS = {  # mutmut's exit codes (mutmut.stats.status_by_exit_code)
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    -11: "segfault",
    -9: "segfault",
    None: "not checked",
}

# Sorts the selected tests by the durations mutmut measured (its stats file, in the working
# directory of every run), fastest first: with -x a mutant dies on its fastest failing test.
ORDER_PLUGIN = """
import json


def pytest_collection_modifyitems(session, config, items):
    try:
        with open("mutmut-stats.json") as f:
            durations = json.load(f)["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return
    items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
"""


@dataclass(frozen=True)
class Group:
    """Code to mutate and the tests that judge it."""

    files: tuple[str, ...]  # paths under verispec/
    functions: tuple[str, ...]  # mutmut names of the functions to mutate (fnmatch patterns)
    tests: tuple[str, ...]  # pytest node ids or paths
    deselect: tuple[str, ...] = ()  # node ids left out (slow, and covered by a faster test)
    about: str = ""


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _all(path: str) -> str:
    return _module(path) + ".*"


def _functions(path: str, *names: str) -> tuple[str, ...]:
    """mutmut's names of functions (``f``) and methods (``Class.method``) of one file."""
    module = _module(path)
    out = []
    for name in names:
        if "." in name:
            cls, method = name.split(".")
            out.append(f"{module}.x\u01c1{cls}\u01c1{method}__mutmut_*")
        else:
            out.append(f"{module}.x_{name}__mutmut_*")
    return tuple(out)


REFERENCE = "verispec/kernels/reference.py"
VERIFIERS = "verispec/verifiers"
GROUPS: dict[str, Group] = {
    "processors": Group(
        about="every tree row processed with its own prefix; which processors are exact",
        files=("verispec/processors/tree.py", "verispec/processors/hf.py"),
        functions=(_all("verispec/processors/tree.py"), _all("verispec/processors/hf.py")),
        tests=(
            "proofs_tests/test_processor_rows.py",
            "proofs_tests/test_processors.py",
            "proofs_tests/end_to_end/test_processor_exactness.py",
        ),
        deselect=(  # the chi-square audits: the identity and row tests see these changes first
            "proofs_tests/end_to_end/test_processor_exactness.py::test_a_repetition_penalty_keeps_the_law",
            "proofs_tests/end_to_end/test_processor_exactness.py::test_a_grammar_mask_keeps_the_law",
        ),
    ),
    "verifiers": Group(
        about="greedy, coupled and recursive-rejection verification (not: the Philox noise, "
        "the input checks, the exact-law enumerations the audits use)",
        # not __init__.py (default_verifier): mutmut 3 does not run a package's __init__
        files=tuple(
            f"{VERIFIERS}/{name}.py" for name in ("_rules", "coupled", "greedy", "recursive")
        ),
        functions=(
            *_functions(
                f"{VERIFIERS}/_rules.py",
                "RowRejection.__init__",
                "RowRejection.residual",
                "follow_target",
                "row_acceptance",
                "sample_indices",
                "sample_index",
            ),
            *_functions(
                f"{VERIFIERS}/coupled.py",
                "_race",
                "seeded_sample",
                "_all_deterministic",
                "Coupled.__init__",
                "Coupled.verify",
            ),
            _all(f"{VERIFIERS}/greedy.py"),
            _all(f"{VERIFIERS}/recursive.py"),
        ),
        tests=(
            "proofs_tests/verifiers/test_rules.py",
            "proofs_tests/verifiers/test_recursive.py",
            "proofs_tests/verifiers/test_coupled.py",
            "proofs_tests/verifiers/test_audit_power.py",
            "proofs_tests/kernels/test_greedy_verify.py",
            "proofs_tests/kernels/test_rejection_verify.py",
            "proofs_tests/kernels/test_one_rule.py",
        ),
        deselect=(  # statistical twins of exact enumerations in the same file
            "proofs_tests/verifiers/test_coupled.py::test_sampled_verdicts_of_a_two_level_tree_follow_the_enumerated_law",
            "proofs_tests/verifiers/test_coupled.py::test_draws_over_seeds_or_positions_follow_the_target",
            "proofs_tests/verifiers/test_coupled.py::test_draws_at_neighbouring_positions_are_independent",
        ),
    ),
    "reference": Group(
        about="the PyTorch references the CPU runs: rejection and greedy verification, tree "
        "attention's mask, KV compaction",
        files=(REFERENCE,),
        functions=_functions(
            REFERENCE,
            "tree_attention",
            "children_csr",
            "_children",
            "_pack",
            "_row_argmax",
            "greedy_verify",
            "tree_greedy_walk",
            "fixed_point",
            "_renormalised",
            "_thresholds",
            "law_code",
            "RejectionRow.__init__",
            "RejectionRow._check_draft",
            "RejectionRow.ratios",
            "RejectionRow.accepts",
            "RejectionRow.acceptance_probability",
            "RejectionRow.reject",
            "RejectionRow.residual_weights",
            "RejectionRow.residual",
            "RejectionRow.sample",
            "rejection_walk",
            "rejection_verify",
            "tree_rejection_walk",
            "compact_kv",
        ),
        tests=(
            "proofs_tests/kernels/test_tree_attention.py",
            "proofs_tests/kernels/test_greedy_verify.py",
            "proofs_tests/kernels/test_rejection_verify.py",
            "proofs_tests/kernels/test_one_rule.py",
            "proofs_tests/kernels/test_kv_compaction.py",
            "proofs_tests/verifiers/test_rules.py",
            "proofs_tests/verifiers/test_recursive.py",
        ),
    ),
    "kv": Group(
        about="the commit of the KV cache and the tree's attention mask (transformers adapter)",
        files=(
            "verispec/models/_cache.py",
            "verispec/models/_sequence.py",
            "verispec/models/hf.py",
        ),
        functions=(
            *_functions(
                "verispec/models/_cache.py",
                "_BufferLayer.update",
                "_BufferLayer.valid",
                "_BufferLayer.truncate",
                "TreeKVCache.truncate",
                "TreeKVCache.compact",
            ),
            *_functions(
                "verispec/models/_sequence.py",
                "TreeSequenceModel.commit",
                "TreeSequenceModel._check_path",
            ),
            *_functions("verispec/models/hf.py", "HFModel._attention_mask", "HFModel._compact"),
        ),
        tests=(
            "proofs_tests/models/test_sequence.py",
            "proofs_tests/models/test_hf.py",
            "proofs_tests/kernels/test_kv_compaction.py",
        ),
    ),
}


def _copy(workspace: Path) -> None:
    """The tracked and new (not ignored) files of ``COPIED`` into ``workspace``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *COPIED],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = workspace / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _setup_cfg(group: Group) -> str:
    def lines(values: tuple[str, ...] | list[str]) -> str:
        return "".join(f"\n    {v}" for v in values)

    args = ["-p", "no:cacheprovider", "-p", "mutation_order", "-m", NOT_SLOW]
    for node in group.deselect:
        args += ["--deselect", node]
    return (
        "[mutmut]\n"
        "source_paths = verispec\n"
        f"only_mutate ={lines(group.files)}\n"
        f"also_copy ={lines(['proofs_tests'])}\n"
        f"pytest_add_cli_args_test_selection ={lines(group.tests)}\n"
        f"pytest_add_cli_args ={lines(args)}\n"
        f"do_not_mutate_patterns ={lines(NOT_MESSAGES)}\n"
        "timeout_multiplier = 3\n"  # a mutant that loops is stopped after 6x its tests' time
        "process_isolation = forkserver\n"
        "use_git_change_detection = false\n"
    )


def _mutmut() -> str:
    beside = Path(sys.executable).with_name("mutmut")
    if beside.exists():
        return str(beside)
    found = shutil.which("mutmut")
    if found is None:
        sys.exit("mutmut is not installed: pip install 'mutmut==3.8.1'")
    return found


# Lists the mutants mutmut will make of some files (its own generator, run in a workspace so
# that it reads the workspace's setup.cfg): one name a line.
LIST_MUTANTS = """
import sys
from pathlib import Path
from mutmut.mutation.file_mutation import mutate_file_contents
for path in sys.argv[1:]:
    for name in mutate_file_contents(path, Path(path).read_text()).mutant_names:
        print(path.removesuffix(".py").replace("/", ".") + "." + name)
"""


def _selected(workspace: Path, group: Group, env: dict[str, str], sample: int) -> list[str]:
    """The group's mutants; every ``sample``-th of them in order of function and number."""
    listed = subprocess.run(
        [sys.executable, "-c", LIST_MUTANTS, *group.files],
        cwd=workspace,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    matched = [n for n in listed if any(fnmatch.fnmatch(n, p) for p in group.functions)]

    def key(name: str) -> tuple[str, int]:
        function, _, number = name.rpartition("__mutmut_")
        return function, int(number)

    return sorted(matched, key=key)[::sample]


def _results(workspace: Path, group: Group, names: list[str]) -> dict[str, str]:
    """Status of each of ``names`` after the run."""
    codes: dict[str, int | None] = {}
    for path in group.files:
        meta = workspace / "mutants" / (path + ".meta")
        codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    return {name: STATUS.get(codes.get(name), "suspicious") for name in names}


def run_group(
    name: str,
    group: Group,
    workdir: Path,
    max_children: int,
    sample: int,
    only: set[str] | None = None,
) -> dict[str, object]:
    workspace = workdir / name
    if workspace.exists():
        shutil.rmtree(workspace)
    workspace.mkdir(parents=True)
    _copy(workspace)
    (workspace / "setup.cfg").write_text(_setup_cfg(group))
    plugin = workspace / ".mutation_plugin"
    plugin.mkdir()
    (plugin / "mutation_order.py").write_text(ORDER_PLUGIN)
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(plugin),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    mutmut = _mutmut()
    start = time.monotonic()
    names = _selected(workspace, group, env, sample)
    if only is not None:
        names = [n for n in names if n in only]
    if not names:
        return {"seconds": 0, "sample": sample, "counts": {}, "survivors": []}
    patterns = group.functions if sample == 1 and only is None else names
    command = [mutmut, "run", "--max-children", str(max_children), *patterns]
    print(f"== {name}: {len(names)} mutants; mutmut run in {workspace}", flush=True)
    subprocess.run(command, cwd=workspace, env=env, check=False)
    seconds = time.monotonic() - start
    statuses = _results(workspace, group, names)
    counts: dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    # a timeout is a detection too: the tests did not pass
    survivors = sorted(n for n, s in statuses.items() if s not in ("killed", "timeout"))
    print(
        f"\n== {name}: {counts.get('killed', 0)} killed of {len(statuses)} ({counts}); "
        f"{seconds / 60:.1f} min"
    )
    for mutant in survivors:
        diff = subprocess.run(
            [mutmut, "show", mutant], cwd=workspace, env=env, capture_output=True, text=True
        ).stdout
        print(diff)
    return {"seconds": round(seconds), "sample": sample, "counts": counts, "survivors": survivors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", nargs="*", help=f"some of {', '.join(GROUPS)}; default: all")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/verispec-mutation"))
    parser.add_argument("--max-children", type=int, default=1, help="parallel mutants")
    parser.add_argument(
        "--sample", type=int, default=1, help="run every N-th mutant only (a shorter audit)"
    )
    parser.add_argument(
        "--mutants", type=Path, help="a file of mutant names, one a line: run only those"
    )
    parser.add_argument("--list", action="store_true", help="print the groups and exit")
    args = parser.parse_args()
    names = args.groups or list(GROUPS)
    unknown = [name for name in names if name not in GROUPS]
    if unknown:
        parser.error(f"unknown group(s) {unknown}; choose from {list(GROUPS)}")
    if args.list:
        for name in names:
            group = GROUPS[name]
            print(
                f"{name}: {group.about}\n  mutate: {', '.join(group.functions)}\n"
                f"  tests: {', '.join(group.tests)}\n  left out: {', '.join(group.deselect)}"
            )
        return
    args.workdir.mkdir(parents=True, exist_ok=True)
    only = set(args.mutants.read_text().split()) if args.mutants else None
    summary = {}
    for name in names:
        summary[name] = run_group(
            name, GROUPS[name], args.workdir, args.max_children, args.sample, only
        )
    (args.workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v["counts"] for k, v in summary.items()}, indent=2))


if __name__ == "__main__":
    main()
