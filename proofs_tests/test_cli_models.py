"""Tests of verispec/cli.py's model options: ``--model`` a directory or a GGUF file,
``--tokenizer``, ``--draft-model``, and the llama.cpp peers skipped where they cannot run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from saved_models import save_tiny_model

from verispec import cli
from verispec.bench.commands import target
from verispec.bench.methods import METHODS


@pytest.fixture(autouse=True)
def _restore_threads() -> Iterator[None]:
    """`--threads` sets torch's global thread count: put it back after each test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama and its byte-level tokenizer saved with ``save_pretrained``."""
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny", num_layers=4)


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-layer tiny Llama over the same tokenizer: a separate draft model."""
    return save_tiny_model(tmp_path_factory.mktemp("models") / "draft", seed=1, num_layers=1)


def _questions(tmp_path: Path) -> Path:
    path = tmp_path / "q.jsonl"
    lines = [{"question_id": 1, "category": "qa", "turns": ["abcabcabc"]}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_generate_with_a_model_directory(model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    """`verispec generate --model DIR` loads the saved model and its tokenizer and answers."""
    argv = ["generate", "--model", str(model_dir), "--threads", "1", "--method", "pld",
            "--prompt", "abcabc", "--max-new-tokens", "6"]  # fmt: skip
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "method: pld" in captured.out and "tokens: " in captured.out
    assert "fast runtime" in captured.err


def test_a_directory_without_tokenizer_needs_tokenizer(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    """A model directory with no tokenizer fails with a hint to pass `--tokenizer`, and
    runs once `--tokenizer` names one."""
    bare = save_tiny_model(tmp_path / "bare", tokenizer=False)
    argv = ["generate", "--model", str(bare), "--threads", "1", "--prompt", "ab",
            "--max-new-tokens", "3", "--method", "ar"]  # fmt: skip
    assert cli.main(argv) == 2
    assert "--tokenizer" in capsys.readouterr().err
    assert cli.main([*argv, "--tokenizer", str(model_dir)]) == 0


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--model", "/nonexistent/model"], "does not exist"),
        (["--model", "README.md"], "must be a GGUF file"),
        (["--model", "tiny", "--tokenizer", "x"], "`--tokenizer` goes with a model directory"),
        (["--model", "tiny", "--draft-model", "/nonexistent"], "does not exist"),
    ],
)
def test_bad_model_options_fail_before_loading(
    extra: list[str], match: str, capsys: pytest.CaptureFixture
) -> None:
    """A model path that is not a model, or `--tokenizer` with a built-in model, exits 2 with
    one line saying what is allowed."""
    argv = ["generate", "--threads", "1", "--prompt", "hi", "--method", "ar", *extra]
    assert cli.main(argv) == 2
    assert match in capsys.readouterr().err


def test_draft_model_drafts_for_the_draft_model_methods(
    model_dir: Path, draft_dir: Path, tmp_path: Path
) -> None:
    """`--draft-model DIR` is loaded like the target and is the draft of the draft-model
    methods (not a self-draft); the answers stay token-identical to `ar`."""
    parser = cli.build_parser()
    args = parser.parse_args(["bench", "--model", str(model_dir), "--draft-model", str(draft_dir)])
    model, tokenizer = target.load(args, [])
    context = target.context(args, model, tokenizer)
    assert context.draft_model is not None and context.draft_model.num_layers == 1
    spec = METHODS["chain"]
    runner = spec.build(context, {"draft_layers": None, "k": None})
    assert runner.drafter.draft is context.draft_model
    out = tmp_path / "r.json"
    argv = ["bench", "--model", str(model_dir), "--draft-model", str(draft_dir), "--threads",
            "1", "--methods", "ar,chain,dyspec", "--questions", str(_questions(tmp_path)),
            "--max-new-tokens", "12", "--no-progress", "--json", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    methods = report["methods"]
    assert methods["chain"]["identical"] == methods["dyspec"]["identical"] == 1


def test_the_runtime_keeps_the_transformers_model_only_for_the_hf_peers() -> None:
    """The CLI's target keeps its transformers model (`hf_model`) when an `hf` peer will run
    it, and drops it otherwise, so that its weights can be freed."""
    from verispec.specs import parse_methods

    args = cli.build_parser().parse_args(["bench", "--model", "tiny"])
    alone, _ = target.load(args, parse_methods("ar,dtr", METHODS))
    with_peer, _ = target.load(args, parse_methods("ar,hf-pld", METHODS))
    assert alone.runtime_note.startswith("fast runtime") and alone.hf_model is None
    assert with_peer.hf_model is not None


def test_draft_model_vocabulary_mismatch(tmp_path: Path, model_dir: Path) -> None:
    """A draft directory whose model has another vocabulary size raises IncompatibleModelsError."""
    from verispec.errors import IncompatibleModelsError
    from verispec.models.tiny import tiny_llama

    other = tmp_path / "other"
    tiny_llama(
        vocab_size=300, hidden_size=32, num_layers=1, dtype=torch.float32
    ).hf_model.save_pretrained(other)
    save = save_tiny_model(tmp_path / "tok", tokenizer=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (other / name).write_bytes((save / name).read_bytes())
    args = cli.build_parser().parse_args(
        ["bench", "--model", str(model_dir), "--draft-model", str(other)]
    )
    model, tokenizer = target.load(args, [])
    with pytest.raises(IncompatibleModelsError, match="vocabulary"):
        target.context(args, model, tokenizer)


def _fake_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    import verispec.bench.runner as runner

    monkeypatch.setattr(runner, "llama_cpp_available", lambda: "not installed here (test)")


def test_bench_skips_llama_cpp_where_it_cannot_run(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The llama-cpp peers are skipped with a message, and the benchmark carries on, when
    llama-cpp-python is missing or the model has no GGUF file; `verispec methods` says why."""
    questions = str(_questions(tmp_path))
    argv = ["bench", "--model", str(model_dir), "--threads", "1", "--methods",
            "ar,llama-cpp,llama-cpp-pld", "--questions", questions, "--max-new-tokens", "4",
            "--no-progress", "--warmup", "0"]  # fmt: skip
    assert cli.main(argv) == 0  # installed or not: a model directory has no GGUF file
    captured = capsys.readouterr()
    assert "skipping `llama-cpp`" in captured.err and "skipping `llama-cpp-pld`" in captured.err
    assert "llama-cpp" not in captured.out  # the table has only `ar`
    _fake_unavailable(monkeypatch)
    assert cli.main(argv) == 0
    assert "skipping `llama-cpp`: not installed here (test)" in capsys.readouterr().err
    assert cli.main(["methods"]) == 0
    assert "[not available: not installed here (test)]" in capsys.readouterr().out
    assert cli.main([*argv[:5], "--methods", "llama-cpp", *argv[7:]]) == 2
    assert "no method left to run" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_with_the_embedded_gguf_file(capsys: pytest.CaptureFixture) -> None:
    """`--model FILE.gguf` (the embedded SmolLM2 file, whose converted copy is shared with
    the default model's cache) loads the model and its tokenizer from the file."""
    from verispec.models.gguf import embedded_gguf

    argv = ["generate", "--model", str(embedded_gguf()), "--threads", "1", "--method", "pld",
            "--prompt", "Name three colours.", "--max-new-tokens", "8"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "tokens: 8 new" in out or "finish: eos" in out
