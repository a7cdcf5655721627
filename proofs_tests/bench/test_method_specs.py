"""Method specs keep their meaning: every spec ``verispec methods`` lists, with good and bad
values of every parameter, parses (and builds) as it did when the table was recorded.

``data/method_specs.json`` was recorded from the table of main at 3d9eadb, before the
drafters' configs replaced the benchmark's own parameter list (issue 14): for each
method and parameter,
the texts of :func:`_texts` (the default, the bounds, one past each bound, and values of
the wrong kind). For each spec the record holds what parsing gave (the label and every
parameter, typed) or the error (its type and the parameter its message names), and,
for verispec's drafters, whether building the drafter for a small target (and a small
draft model) accepted it or which named error refused it. Regenerate only on purpose:
``python proofs_tests/bench/test_method_specs.py``. Changed on purpose once (issue 25):
the defaults of ``dtr``'s ``budget``, ``pld``'s ``max`` and ``tr``'s ``template`` became
``auto`` (sized by the device), so the entries that used those defaults were updated, and
``pld:max=auto`` and ``tr:template=auto``, refused before, are accepted; no other entry
changed. Changed on purpose again (issue 24): ``dtr`` and ``suffix`` take ``prior_strength``
(their classes did), so their accepted entries carry its default and its probes were added;
every earlier entry kept its meaning and stays recorded.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from verispec.bench.methods import METHODS
from verispec.models.markov import MarkovModel
from verispec.specs import parse_method

_DATA = Path(__file__).parent / "data" / "method_specs.json"
_BUILT = ("tr", "dtr", "pld", "suffix")  # model-free drafters: built for a small target
_DRAFTED = ("chain", "specinfer", "dyspec", "rsdc", "rsds")  # built with a small draft too
_PROBES = ("", "x", "-1", "0", "1", "1.5", "2", "auto", "true", "no", "2.2.2", "4.0.2", "1e400")


def _texts(entry: Any, param: Any) -> list[str]:
    """The values tried for one parameter, as ``verispec methods`` shows its bounds."""
    texts = list(_PROBES)
    for bound in (param.minimum, param.maximum):
        if bound is not None:
            texts += [f"{bound:g}", f"{bound - 1:g}", f"{bound + 1:g}", f"{bound + 0.5:g}"]
    if param.choices:
        texts += list(param.choices)
    if param.default is not None:
        texts.append(str(param.default).lower() if isinstance(param.default, bool) else "")
    return list(dict.fromkeys(texts))


def _named(message: str) -> str:
    """The first name in backticks of an error message (the argument it names)."""
    found = re.search(r"`([^`]+)`", message)
    return found.group(1) if found else ""


def _value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _outcome(name: str, spec: str) -> dict[str, Any]:
    try:
        parsed = parse_method(spec, METHODS)
    except Exception as exc:  # recorded: the type and the name it gives
        return {"parse_error": type(exc).__name__, "names": _named(str(exc))}
    got: dict[str, Any] = {
        "label": parsed.label,
        "params": {k: _value(v) for k, v in sorted(parsed.params.items())},
    }
    # dyspec's budget=auto measures the target's latency when built; the model-free
    # drafters' "auto" reads it only when first bound to a decoder
    if name in _BUILT + _DRAFTED and not (
        name == "dyspec" and parsed.params.get("budget") == "auto"
    ):
        target = MarkovModel(torch.zeros(16, 16))
        draft = MarkovModel(torch.zeros(16, 16)) if name in _DRAFTED else None
        try:
            METHODS[name].drafter(target, parsed.params, draft)  # type: ignore[misc]
            got["built"] = True
        except Exception as exc:
            got["build_error"] = type(exc).__name__
            got["names"] = _named(str(exc))
    return got


def _record() -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for name, entry in METHODS.items():
        table[name] = _outcome(name, name)
        for param in entry.params:
            for text in _texts(entry, param):
                spec = f"{name}:{param.name}={text}"
                table[spec] = _outcome(name, spec)
    return table


def _recorded() -> dict[str, dict[str, Any]]:
    return json.loads(_DATA.read_text())  # type: ignore[no-any-return]


def _meaning(outcome: dict[str, Any]) -> tuple[Any, ...]:
    """What a spec means, whichever stage decides: refused (the error and the parameter
    it names, ``dtr:decay`` and ``decay`` alike) or accepted (label, parameters, built)."""
    error = outcome.get("parse_error") or outcome.get("build_error")
    if error is not None:
        return ("refused", error, outcome["names"].split(":")[-1])
    return ("accepted", outcome["label"], outcome["params"], outcome.get("built"))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_listed_spec_means_what_it_meant(method: str) -> None:
    """For one method of ``verispec methods``, every recorded spec (each parameter at its
    default, bounds, one past them, and values of the wrong kind) is accepted with the same
    label and typed parameters (and, for verispec's drafters, builds), or is refused
    with the same error naming the same parameter, whether parsing or building refuses
    it (a drafter's own check now also runs when its spec is parsed)."""
    recorded = {s: o for s, o in _recorded().items() if s.split(":")[0] == method}
    assert recorded, f"no recorded spec for {method}"
    for spec, outcome in recorded.items():
        assert _meaning(_outcome(method, spec)) == _meaning(outcome), spec


def test_the_record_covers_every_method_and_parameter() -> None:
    """Every method and parameter in today's table has recorded specs (so a parameter
    cannot be added or renamed without the record saying what it meant)."""
    recorded = _recorded()
    for name, entry in METHODS.items():
        assert name in recorded
        for param in entry.params:
            assert any(s.startswith(f"{name}:{param.name}=") for s in recorded), (name, param)


if __name__ == "__main__":
    _DATA.write_text(json.dumps(_record(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {_DATA}", file=sys.stderr)
