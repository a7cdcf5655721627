"""Tests of hub/verispec-speculative/, the transformers ``custom_generate`` folder wrapping
``verispec.speculative``: loaded offline from its local path by transformers' own loader
(``generate(custom_generate=<path>, trust_remote_code=True)``), it returns transformers'
greedy tokens, the acceptance figures, verispec's refusals, and transformers refuses to run
it without ``trust_remote_code``.

transformers copies the folder's ``custom_generate/generate.py`` into its modules cache
before importing it; the tests point that cache at a temporary folder (and restore
``sys.path``, to which transformers adds the cache)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from streamers import RecordingStreamer

from verispec.custom_generate import SpeculativeGenerateOutput
from verispec.errors import ConfigError
from verispec.models.tiny import ByteTokenizer, tiny_llama

FOLDER = (Path(__file__).resolve().parents[1] / "hub" / "verispec-speculative").resolve()
PROMPT = [[5, 9, 14, 5, 9, 14, 22, 5, 9]]
NEW = 24


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", autouse=True)
def _modules_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """transformers' dynamic-modules cache in a temporary folder; ``sys.path`` and the
    loaded ``transformers_modules`` entries of ``sys.modules`` restored afterwards."""
    import transformers.dynamic_module_utils as dmu

    cache = tmp_path_factory.mktemp("hf_modules")
    before = set(sys.modules)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dmu, "HF_MODULES_CACHE", str(cache))
        patch.setattr(sys, "path", list(sys.path))
        yield cache
    for name in set(sys.modules) - before:
        if name.startswith("transformers_modules"):
            del sys.modules[name]


@pytest.fixture(scope="module")
def expected(hf_model: Any) -> torch.Tensor:
    """transformers' own greedy ``generate`` of the prompt."""
    out = hf_model.generate(_ids(), max_new_tokens=NEW, do_sample=False)
    assert out.shape[1] > len(PROMPT[0]) + 8  # a real continuation, not an instant eos
    return out


def _ids() -> torch.Tensor:
    return torch.tensor(PROMPT)


def _hub(model: Any, ids: torch.Tensor | None = None, **options: Any) -> Any:
    """``model.generate`` with the folder as ``custom_generate``, trusted."""
    ids = _ids() if ids is None else ids
    return model.generate(ids, custom_generate=str(FOLDER), trust_remote_code=True, **options)


def _loaded(model: Any) -> Any:
    """The ``generate`` function transformers loads from the folder (the one generate runs)."""
    return model.load_custom_generate(str(FOLDER), trust_remote_code=True)


def test_transformers_loads_the_folders_file(
    hf_model: Any, _modules_cache: Path, tmp_path: Path
) -> None:
    """transformers finds ``custom_generate/generate.py`` in the local folder and imports a
    copy of it from its modules cache (not verispec's package); it checks
    ``custom_generate/requirements.txt`` against the installed packages, which the folder's
    satisfy here and a copy asking for verispec 999 does not (ImportError naming it)."""
    function = _loaded(hf_model)
    module = sys.modules[function.__module__]
    assert function.__module__.startswith("transformers_modules.")
    assert module.__file__ is not None
    copy = Path(module.__file__)
    assert copy.is_relative_to(_modules_cache)
    assert copy.read_bytes() == (FOLDER / "custom_generate" / "generate.py").read_bytes()
    demanding = tmp_path / "demanding"
    shutil.copytree(FOLDER, demanding)
    (demanding / "custom_generate" / "requirements.txt").write_text("verispec>=999.0\n")
    with pytest.raises(ImportError, match=r"Missing requirements[\s\S]*verispec>=999\.0"):
        hf_model.load_custom_generate(str(demanding), trust_remote_code=True)


@pytest.mark.parametrize("method", ["dtr:budget=16", "tr:template=16", "pld"])
def test_greedy_equals_generate(hf_model: Any, expected: torch.Tensor, method: str) -> None:
    """Through the folder, ``method=`` decodes with ``verispec.speculative(method)`` (its output
    type, its kept callable) and returns exactly transformers' greedy tokens, on two calls in
    a row (the second reuses the kept callable)."""
    out = _hub(hf_model, max_new_tokens=NEW, do_sample=False, method=method)
    assert torch.equal(out, expected)
    out = _hub(hf_model, max_new_tokens=NEW, method=method, return_dict_in_generate=True)
    assert isinstance(out, SpeculativeGenerateOutput) and torch.equal(out.sequences, expected)
    kept = _loaded(hf_model).__globals__["_callables"]
    assert method in {fast.spec for _, fast in kept.values()}


def test_one_callable_per_option_set(hf_model: Any, expected: torch.Tensor) -> None:
    """Calls with the same verispec options share one ``verispec.speculative`` callable (its
    drafter learns across them); other options build another."""
    kept = _loaded(hf_model).__globals__["_callables"]
    kept.clear()
    _hub(hf_model, max_new_tokens=NEW, method="pld")
    _hub(hf_model, max_new_tokens=NEW, method="pld")
    assert len(kept) == 1
    ((_, fast),) = kept.values()
    assert fast.spec == "pld" and fast.runtime == "auto"
    out = _hub(hf_model, max_new_tokens=NEW, method="pld", runtime="hf")
    assert torch.equal(out, expected) and len(kept) == 2
    assert {f.runtime for _, f in kept.values()} == {"auto", "hf"}


def test_return_dict_carries_mean_accepted_tokens(hf_model: Any, expected: torch.Tensor) -> None:
    """``return_dict_in_generate=True`` returns verispec's output: the greedy sequences and a
    ``mean_accepted_tokens`` equal to the tokens committed per step."""
    out = _hub(hf_model, max_new_tokens=NEW, method="dtr:budget=16", return_dict_in_generate=True)
    assert isinstance(out, SpeculativeGenerateOutput)
    assert out.accepted_lengths is not None and out.num_steps is not None
    assert out.mean_accepted_tokens is not None
    assert torch.equal(out.sequences, expected)
    assert out.num_steps == len(out.accepted_lengths) > 0
    assert out.mean_accepted_tokens == pytest.approx(
        sum(a + 1 for a in out.accepted_lengths) / out.num_steps
    )
    assert out.mean_accepted_tokens >= 1.0


def test_loader_options_do_not_reach_generate(hf_model: Any, expected: torch.Tensor) -> None:
    """``revision=`` (which transformers reads to fetch the file, then also hands to the
    folder's ``generate``) is dropped there, not refused as an unused model argument."""
    out = _hub(hf_model, max_new_tokens=NEW, method="pld", revision="v0.1.0")
    assert torch.equal(out, expected)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"num_beams": 2}, "`num_beams` must be 1"),
        ({"do_sample": True, "num_return_sequences": 2}, "`num_return_sequences` must be 1"),
        ({"return_dict_in_generate": True, "output_scores": True}, "`output_scores` must be"),
        ({"method": "nope"}, "unknown method `nope`"),
        ({"runtime": "fastest"}, "`runtime` must be one of"),
    ],
)
def test_refused_options_raise_config_error(hf_model: Any, options: dict, match: str) -> None:
    """A ``generate`` option verispec cannot honour exactly, or a bad verispec option, raises
    verispec's ConfigError naming it."""
    with pytest.raises(ConfigError, match=match):
        _hub(hf_model, max_new_tokens=5, **options)


def test_streamer_and_stop_strings_pass_through() -> None:
    """The streamer reaches verispec through the folder (the prompt, then the new tokens,
    then one ``end``), and ``tokenizer=`` plus ``stop_strings=`` end the answer at the
    string."""
    model = tiny_llama(vocab_size=258, hidden_size=32, num_layers=2, max_length=512).hf_model
    tokenizer = ByteTokenizer()
    ids = torch.tensor([tokenizer.encode("abcabcabc")])
    full = model.generate(ids, max_new_tokens=40, do_sample=False)
    text = tokenizer.decode(full[0, ids.shape[1] :].tolist())

    streamer = RecordingStreamer()
    out = _hub(model, ids, max_new_tokens=40, method="pld", streamer=streamer)
    assert torch.equal(out, full)
    assert streamer.puts[0] == ids[0].tolist() and streamer.ended == 1
    assert [t for put in streamer.puts[1:] for t in put] == full[0, ids.shape[1] :].tolist()

    stop = text[10:12]
    out = _hub(model, ids, max_new_tokens=40, method="ar", tokenizer=tokenizer, stop_strings=[stop])
    answer = tokenizer.decode(out[0, ids.shape[1] :].tolist())
    assert answer.endswith(stop) and answer.count(stop) == 1 and text.startswith(answer)


def test_transformers_refuses_the_folder_without_trust(
    hf_model: Any, tmp_path: Path, _modules_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``trust_remote_code=True`` transformers raises ValueError and never runs the
    folder's code: ``trust_remote_code=False`` at once; left out, after asking on the
    terminal, where the default answer (Enter) is no. Nothing is copied or imported."""
    folder = tmp_path / "untrusted-copy"
    shutil.copytree(FOLDER, folder)
    prompts: list[str] = []

    def answer(prompt: str = "") -> str:
        prompts.append(prompt)
        return ""

    monkeypatch.setattr("builtins.input", answer)
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        hf_model.generate(_ids(), max_new_tokens=5, custom_generate=str(folder),
                          trust_remote_code=False)  # fmt: skip
    assert prompts == []
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        hf_model.generate(_ids(), max_new_tokens=5, custom_generate=str(folder))
    assert len(prompts) == 1 and "custom generation code" in prompts[0]
    assert not any("untrusted_hyphen_copy" in name for name in sys.modules)
    assert not list(_modules_cache.rglob("*untrusted_hyphen_copy*"))


def test_a_model_repository_holding_the_folder(
    hf_model: Any, expected: torch.Tensor, tmp_path: Path
) -> None:
    """A saved model with the folder's ``custom_generate/`` loaded with
    ``trust_remote_code=True`` has its ``generate`` replaced by the folder's, which takes
    ``model.generate(ids, ...)`` and returns the greedy tokens; loaded without it,
    transformers keeps its own ``generate`` (silently)."""
    from transformers import AutoModelForCausalLM

    hf_model.save_pretrained(tmp_path)
    shutil.copytree(FOLDER / "custom_generate", tmp_path / "custom_generate")
    trusted = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True)
    assert getattr(trusted.generate, "func", None) is not None  # the folder's, bound to it
    out = trusted.generate(_ids(), max_new_tokens=NEW, do_sample=False, method="tr:template=16")
    assert torch.equal(out, expected)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert plain.generate.__func__ is type(plain).generate
