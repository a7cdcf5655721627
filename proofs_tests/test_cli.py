"""Tests of verispec/cli.py and verispec/__main__.py: help, usage errors, and tiny real runs."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import torch

from verispec import cli
from verispec.bench.commands import target
from verispec.bench.methods import METHODS


@pytest.fixture(autouse=True)
def _restore_threads() -> Iterator[None]:
    """`--threads` sets torch's global thread count: put it back after each test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _questions(tmp_path: Path) -> Path:
    path = tmp_path / "q.jsonl"
    lines = [
        {"question_id": 1, "category": "chat", "turns": ["Say hi.", "Again."]},
        {"question_id": 2, "category": "qa", "turns": ["Why?"]},
        {"question_id": 3, "category": "qa", "turns": ["How?"]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_python_m_verispec_help_lists_the_commands() -> None:
    """`python -m verispec --help` exits 0 and names bench, generate and methods."""
    out = subprocess.run(
        [sys.executable, "-m", "verispec", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("bench", "generate", "methods"):
        assert command in out.stdout


def test_bench_help_documents_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    """`verispec bench --help` documents every option of the benchmark."""
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--methods", "--questions", "--limit", "--max-new-tokens", "--temperature",
                   "--dtype", "--json", "--markdown", "--plot", "--warmup", "--seed",
                   "--carry-corpus"):  # fmt: skip
        assert option in text


def test_methods_lists_every_registered_method(capsys: pytest.CaptureFixture[str]) -> None:
    """`verispec methods` prints each method once with its parameters."""
    assert cli.main(["methods"]) == 0
    text = capsys.readouterr().out
    starts = [line.split()[0] for line in text.splitlines() if line and not line[0].isspace()]
    assert starts == list(METHODS)
    assert "template (auto|2.2.2|80|8|16|32" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--methods", "ar,eagle"], "unknown method `eagle`; allowed: ar, hf"),
        (["bench", "--methods", "tr:size=3"], "no parameter `size`; allowed: template, k"),
        (["bench", "--limit", "0"], "`--limit` must be >= 1"),
        (["bench", "--questions", "no/such/file.jsonl"], "no/such/file.jsonl"),
        (["bench", "--categories", "poetry"], "'poetry' does not occur"),
        (["bench", "--temperature", "-1"], "argument --temperature: must be in [0, inf)"),
        (["bench", "--json", "no/such/dir/out.json"], "does not exist"),
        (["generate", "--method", "ar,hf", "--prompt", "x"], "takes one method spec"),
        (["generate", "--method", "tr", "--prompt", "  "], "`--prompt` must not be empty"),
        (["generate", "--prompt", "x", "--json-schema", "no/such.json"], "cannot be read"),
        (["generate", "--prompt", "x", "--repetition-penalty", "0"], "`repetition_penalty`"),
        (["generate", "--prompt", "x", "--regex", "a", "--grammar", "g"], "not allowed with"),
        (["bench", "--device", "cpu", "--kernels", "triton"], "`--kernels triton` needs"),
        (
            ["generate", "--prompt", "x", "--device", "cpu", "--kernels", "triton"],
            "TRITON_INTERPRET",
        ),
    ],
)
def test_usage_errors_exit_2_before_loading_the_model(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bad input prints one clear error line and exits with status 2 (``--kernels triton`` on
    the CPU with Triton's interpreter off included), before any note about an optional peer
    that will be skipped (made unavailable here, as on a machine without llama-cpp-python)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for name, entry in METHODS.items():
        if entry.extra is not None:
            unavailable = attrs.evolve(entry, availability=lambda: "not installed here")
            monkeypatch.setitem(METHODS, name, unavailable)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith(f"verispec {argv[0]}: error:")


def test_a_malformed_questions_file_names_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken second line is reported with its file and line number; nothing is written."""
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 1, "category": "qa", "turns": ["a"]}\n{"oops": 1}\n')
    out = tmp_path / "out.json"
    assert cli.main(["bench", "--questions", str(path), "--json", str(out)]) == 2
    assert f"{path}, line 2" in capsys.readouterr().err
    assert not out.exists()


def test_argparse_rejects_non_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    """A non-integer `--max-new-tokens` is a usage error: one line, status 2."""
    assert cli.main(["bench", "--max-new-tokens", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --max-new-tokens: must be an integer" in err


def test_tiny_bench_writes_json_markdown_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full `verispec bench` on the tiny model prints the table and writes all three files."""
    out = {key: tmp_path / f"bench.{ext}" for key, ext in
           (("json", "json"), ("markdown", "md"), ("plot", "png"))}  # fmt: skip
    argv = [
        "bench", "--model", "tiny", "--threads", "1", "--questions", str(_questions(tmp_path)),
        "--limit", "1", "--max-new-tokens", "4", "--methods", "ar,hf,tr:template=8",
        "--no-progress", "--per-category",
        *(arg for key, path in out.items() for arg in (f"--{key}", str(path))),
    ]  # fmt: skip
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "tr:template=8" in printed and "vs hf" in printed and "category" in printed
    data = json.loads(out["json"].read_text())
    assert list(data["methods"]) == ["ar", "hf", "tr:template=8"]
    assert data["methods"]["hf"]["speedup_vs_hf"] == 1.0
    assert data["config"]["answers_per_method"] == 3  # 2 chat turns + the first qa question
    assert data["command"].startswith("verispec bench --model tiny")
    assert data["machine"]["torch_threads"] == 1
    assert "| tr:template=8 |" in out["markdown"].read_text()
    assert out["plot"].read_bytes()[:4] == b"\x89PNG"


def test_an_interrupted_bench_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C during the run exits 130 and leaves no output file."""
    import verispec.bench.loop as loop

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "run_bench", interrupted)
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", "tiny", "--threads", "1", "--methods", "ar", "--json", str(out)]
    assert cli.main(argv) == 130
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert "nothing written" in capsys.readouterr().err


def test_generate_prints_the_answer_and_its_statistics(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`verispec generate` prints the method, token count, tokens/s, MAT and the time split."""
    argv = ["generate", "--model", "tiny", "--threads", "1", "--method", "tr:template=8",
            "--prompt", "Hello", "--max-new-tokens", "6", "--no-chat"]  # fmt: skip
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "method: tr:template=8" in text
    assert "tokens: " in text and "tokens/s" in text
    assert "mean accepted tokens per step (MAT)" in text
    assert "time: draft" in text


def test_generate_follows_a_regex_and_writes_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verispec generate --regex R --json PATH` prints an answer that matches R and writes
    the answer with its per-request figures, which agree with each other."""
    out = tmp_path / "answer.json"
    argv = ["generate", "--model", "tiny", "--threads", "1", "--method", "dtr:budget=8",
            "--prompt", "Hello", "--max-new-tokens", "12", "--no-chat",
            "--regex", "(yes|no|maybe)!", "--repetition-penalty", "1.2",
            "--json", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["finish_reason"] == "eos"
    assert record["text"] in ("yes!", "no!", "maybe!")
    assert record["text"] in capsys.readouterr().out
    figures = record["spec_decode"]
    assert figures["num_steps"] >= 1
    assert figures["num_accepted_tokens"] == sum(figures["num_accepted_tokens_per_pos"])
    assert figures["num_accepted_tokens"] <= figures["num_draft_tokens"]
    per_pos = figures["num_accepted_tokens_per_pos"]
    assert all(a >= b for a, b in itertools.pairwise(per_pos))


# (flag, the file's bytes or the regex, what the one error line says after the value); each
# was refused only once the model had loaded (a file not UTF-8: with a traceback)
BAD_STRUCTURE = [
    pytest.param("--json-schema", b"\xff\xfe{}", "cannot be read: not UTF-8 text (byte 0)",
                 id="schema-not-utf8"),
    pytest.param("--json-schema", b"", "is empty", id="schema-empty"),
    pytest.param("--json-schema", b"{'type': 'object'}", "is not JSON (Expecting property name",
                 id="schema-not-json"),
    pytest.param("--json-schema", b"[1, 2]", "holds an array", id="schema-array"),
    pytest.param("--json-schema", b'{"type": "foo"}', "does not compile: Invalid type: foo",
                 id="schema-unknown-type"),
    pytest.param("--json-schema", b'{"type": "string", "format": "weird"}',
                 "Unknown format: weird", id="schema-unknown-format"),
    pytest.param("--json-schema", b'{"type": "integer", "minimum": 5, "maximum": 1}',
                 "Unsatisfiable", id="schema-unsatisfiable"),
    pytest.param("--json-schema", b'{"type": "string", "pattern": "(?=a)b"}', "look-around",
                 id="schema-unsupported-pattern"),
    pytest.param("--regex", "a(", "does not compile: unclosed group; it must be a regex",
                 id="regex-unclosed"),
    pytest.param("--regex", "(a)\\1", "does not compile: backreferences are not supported",
                 id="regex-backreference"),
    pytest.param("--regex", "", "is empty", id="regex-empty"),
    pytest.param("--grammar", b"this is not a grammar",
                 "does not compile: line 1, column 6: Expected", id="grammar-not-lark"),
    pytest.param("--grammar", b'greeting: "hi"', "does not compile: no start rule found",
                 id="grammar-no-start"),
    pytest.param("--grammar", b'start: "a"\nstart: "b"', "line 2, column 8: duplicate rule",
                 id="grammar-duplicate-rule"),
    pytest.param("--grammar", b"\n", "is empty", id="grammar-empty"),
]  # fmt: skip


@pytest.mark.parametrize(("flag", "value", "message"), BAD_STRUCTURE)
def test_structured_output_that_cannot_compile_is_refused_before_the_model_loads(
    flag: str,
    value: bytes | str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A `--json-schema` file that cannot be read, is not JSON or not a schema llguidance
    can follow, a `--regex` that does not compile and a `--grammar` that is not a grammar
    exit with status 2 before the model loads, on one line naming the flag, the value,
    what is wrong and what is allowed."""

    def no_model(*args: object) -> None:
        raise AssertionError("the model was loaded before the bad input was reported")

    monkeypatch.setattr(target, "load", no_model)
    if isinstance(value, bytes):
        path = tmp_path / ("schema.json" if flag == "--json-schema" else "grammar.lark")
        path.write_bytes(value)
        given = str(path)
    else:
        given = value
    assert cli.main(["generate", "--prompt", "x", "--model", "tiny", flag, given]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"verispec generate: error: `{flag}` {given!r} "), err
    assert message in err and "; it must be " in err, err
    assert flag == "--regex" or "it must be a file holding a " in err


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--json-schema", b'{"type": "object", "properties": {"a": {"type": "integer"}}}'),
        ("--json-schema", b"true"),
        ("--regex", "(yes|no) "),
        ("--regex", " "),
        ("--grammar", b'start: "a"+ | NUMBER\n%import common.NUMBER\n'),
    ],
)
def test_structured_output_that_compiles_reaches_the_model(
    flag: str,
    value: bytes | str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The early checks refuse nothing llguidance compiles: the command reaches the model."""
    from verispec.errors import ConfigError

    def stop(*args: object) -> None:
        raise ConfigError("stopped by the test at the model")

    monkeypatch.setattr(target, "load", stop)
    path = tmp_path / "constraint"
    if isinstance(value, bytes):
        path.write_bytes(value)
    given = str(path) if isinstance(value, bytes) else value
    assert cli.main(["generate", "--prompt", "x", "--model", "tiny", flag, given]) == 2
    assert "stopped by the test at the model" in capsys.readouterr().err


def _records_with_one_answer(tmp_path: Path) -> Path:
    """A records file holding one answer of an earlier run."""
    path = tmp_path / "old.records.jsonl"
    header = {"format": "verispec-bench-records/1", "config": {}}
    answer = {"question_id": 1, "turn": 0, "method": "ar", "category": "qa", "result": {}}
    path.write_text(json.dumps(header) + "\n" + json.dumps(answer) + "\n")
    return path


_NO_CUDA = [] if torch.cuda.is_available() else [(["bench", "--device", "cuda"], "`--device cuda`")]

# (argv, text the one error line must contain: the argument it names)
BAD_CLI_INPUT = [
    (["bench", "--json", "/proc/verispec-report.json"], "`--json` must be writable"),
    (["bench", "--markdown", "/proc/report.md"], "`--markdown` must be writable"),
    (["bench", "--records", "/proc/r.jsonl"], "`--records` must be writable"),
    (["bench", "--device", "bogus"], "`--device` must be auto, cpu, cuda"),
    (["bench", "--device", "cuda:99"], "`--device"),
    *_NO_CUDA,
    (["generate", "--prompt", "x", "--device", "bogus"], "`--device` must be"),
    (["bench", "--seed", str(2**70)], "argument --seed: must be in [0, 2**64)"),
    (["bench", "--seed", "1.5"], "argument --seed: must be an integer"),
    (["bench", "--seed", "-1"], "argument --seed: must be in [0, 2**64)"),
    (["generate", "--prompt", "x", "--seed", "1.5"], "argument --seed"),
    (["bench", "--top-p", "1.5"], "argument --top-p: must be in (0, 1]"),
    (["bench", "--top-p", "0"], "argument --top-p: must be in (0, 1]"),
    (["bench", "--top-k", "-1"], "argument --top-k: must be >= 0"),
    (["bench", "--min-p", "1"], "argument --min-p: must be in [0, 1)"),
    (["generate", "--prompt", "x", "--top-p", "nan"], "argument --top-p"),
    (["bench", "--temperature", "inf"], "argument --temperature"),
    (["bench", "--verifier", "coupled"], "argument --verifier: invalid choice"),
    (["bench", "--resume"], "`--resume` needs the records"),
    (["bench", "--repeats", "0"], "argument --repeats: must be >= 1; got 0"),
    (["bench", "--threads", "0"], f"argument --threads: must be in [1, {os.cpu_count()}]"),
    (["bench", "--dtype", "float8"], "argument --dtype: invalid choice"),
    (["bench", "--methods", "tr:template=7"], "`tr:template` must be one of"),
    (["report", "no/such/report.json"], "`no/such/report.json` must be an existing"),
    (["bench", "--threads", "999"], f"--threads: must be in [1, {os.cpu_count()}]; got 999"),
    (["bench", "--arithmetic", "int4"], "argument --arithmetic: invalid choice"),
    (["bench", "--arithmetic", "int8", "--runtime", "hf"], "got --runtime hf"),
    (["bench", "--arithmetic", "int8", "--weights", "dense"], "got --weights dense"),
    (["generate", "--prompt", "x", "--arithmetic", "int8", "--dtype", "bfloat16"],
     "`--arithmetic int8` runs on the fast runtime's CPU kernels in float32"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"), BAD_CLI_INPUT, ids=[" ".join(b[0]) for b in BAD_CLI_INPUT]
)
def test_bad_cli_input_is_one_line_naming_the_argument(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each bad input exits with status 2 before the model loads, printing one line on
    stderr that names the option (and no traceback)."""

    def no_model(*args: object) -> None:
        raise AssertionError("the model was loaded before the bad input was reported")

    monkeypatch.setattr(target, "load", no_model)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"verispec {argv[0]}: error:"), err
    assert message in err and "Traceback" not in err


def test_existing_records_are_not_replaced_without_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A records file that holds answers makes `bench` stop (status 2) unless --resume."""
    path = _records_with_one_answer(tmp_path)
    assert cli.main(["bench", "--model", "tiny", "--records", str(path)]) == 2
    assert "pass --resume to continue it" in capsys.readouterr().err
    assert path.read_text().count("\n") == 2  # untouched


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--device", "bogus"],
        ["bench", "--json", "/proc/verispec-report.json"],
    ],
    ids=["device", "json"],
)
def test_the_installed_command_prints_no_traceback(argv: list[str]) -> None:
    """`python -m verispec` with a bad input exits 2 with one line on stderr, no traceback."""
    out = subprocess.run(
        [sys.executable, "-m", "verispec", *argv], capture_output=True, text=True, check=False
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr


@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["bench"]])
def test_no_progress_turns_the_notices_of_long_waits_off(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--no-progress` turns off the notices of long waits (conversion, latency tables,
    compilation) for the command; without it they are on."""
    from verispec.core.notices import notices_enabled
    from verispec.errors import ConfigError

    seen = []

    def probe(*args: object) -> None:
        seen.append(notices_enabled())
        raise ConfigError("stopped by the test")

    monkeypatch.setattr(target, "load", probe)
    assert cli.main([*command, "--model", "tiny", "--no-progress"]) == 2
    assert cli.main([*command, "--model", "tiny"]) == 2
    assert seen == [False, True]
