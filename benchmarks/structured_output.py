"""Structured output under draft trees: JSON extraction, constrained and unconstrained.

For each prompt of ``benchmarks/data/json_extraction.jsonl`` (an instruction and a short
passage, with the JSON schema of the fields to extract), in one process and with greedy
decoding, this runs back to back:

* ``hf``: transformers' own ``generate``, unconstrained, and constrained by the schema
  through :class:`verispec.processors.GrammarLogitsProcessor` (a new one per call);
* each verispec method (``ar``, ``tr``, ``dtr``, ``pld``...) as ``custom_generate``:
  unconstrained, ``verispec.speculative(m)``, and constrained,
  ``verispec.speculative(m, tokenizer=tok, json_schema=schema)``.

The peers of one prompt run one after the other, in reversed order on every other prompt,
so that a busy neighbour core weighs on all of them alike: read the ratios, not the
absolute figures. Every callable is warmed first on a prompt outside the set (the first
call measures the device's latency tables and compiles the grammar machinery).

Drafter state (``--drafter-state``): ``mode`` (default) keeps one drafter per method and
mode, the constrained one shared by the callables of every schema, so both modes learn
across prompts as a long-lived ``speculative(m)`` does; ``fresh`` builds every callable
from the spec string at each call (a cold drafter, the literal one-call-per-schema use).

Per (method, constrained?) it reports answers, new tokens, wall seconds (callable or
processor construction included), tokens/s (new tokens over the whole wall time, prefill
included), MAT (tokens committed per target forward; 1.0 for ``hf``), the speedup over
constrained ``hf`` and over ``hf`` in the same mode, the share of answers that parse with
``json.loads`` and hold every required field with its JSON type, how many greedy answers
are token-identical to ``hf``'s in the same mode, the draft nodes sent per step, and
milliseconds per step in the target forward and in verification (which includes the
grammar masks; for ``hf`` constrained, the processor's time per token). Prints a
Markdown table and writes everything as JSON::

    .venv/bin/python benchmarks/structured_output.py --out results/structured_output.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers

import verispec
from verispec.bench.commands.flags import add_threads_option
from verispec.custom_generate import target_for
from verispec.processors import GrammarLogitsProcessor

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "json_extraction.jsonl"
WARMUP_TEXT = (
    "Extract the following fields from the passage as a JSON object: name, age, city.\n\n"
    "Passage: Maria Lopez is 34 years old and lives in Madrid."
)
WARMUP_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


class TimedGrammarProcessor(GrammarLogitsProcessor):
    """The baseline's processor, timing its own calls (the grammar mask per token)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seconds = 0.0
        self.calls = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        out = super().__call__(input_ids, scores)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return out


def cpu_summary() -> str:
    """One line: the CPU model and whether it has AVX2 and which AVX-512 extensions."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return f"lscpu unavailable ({platform.processor() or platform.machine()})"
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    avx512 = sorted(f for f in flags if f.startswith("avx512"))
    model = fields.get("Model name", "?").strip()
    cpus = fields.get("CPU(s)", "?").strip()
    return (
        f"CPU: {model}, {cpus} CPUs; avx2: {'yes' if 'avx2' in flags else 'no'}; "
        f"avx512: {', '.join(avx512) if avx512 else 'none'}"
    )


def valid_json(text: str, schema: dict) -> bool:
    """``text`` parses as a JSON object holding every required field with its type."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    if not isinstance(value, dict):
        return False
    properties = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in value:
            return False
        kind = properties.get(name, {}).get("type")
        field = value[name]
        if kind is None:
            continue
        if isinstance(field, bool) and kind in ("integer", "number"):
            return False
        if not isinstance(field, JSON_TYPES[kind]):
            return False
    return True


class Bench:
    """The model, its tokenizer and the callables of every method and mode."""

    def __init__(self, methods: list[str], max_new_tokens: int, drafter_state: str) -> None:
        model, self.tok = verispec.load_default_model()
        self.hf = model.hf_model
        self.methods = methods
        self.max_new = max_new_tokens
        self.drafter_state = drafter_state
        self.unconstrained: dict[str, Any] = {}
        self.drafters: dict[str, Any] = {}  # the constrained callables' drafter, per method
        if drafter_state == "mode":
            target = target_for(self.hf)
            for method in methods:
                self.unconstrained[method] = verispec.speculative(method)
                self.drafters[method] = verispec.drafter(method, target=target)

    def ids(self, text: str) -> torch.Tensor:
        messages = [{"role": "user", "content": text}]
        return self.tok.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]

    def callable_for(self, method: str, schema: dict | None) -> Any:
        if self.drafter_state == "fresh":
            if schema is None:
                return verispec.speculative(method)
            return verispec.speculative(method, tokenizer=self.tok, json_schema=schema)
        if schema is None:
            return self.unconstrained[method]
        # a drafter object in place of the spec: the same drafter for every schema
        return verispec.speculative(self.drafters[method], tokenizer=self.tok, json_schema=schema)

    def run(self, method: str, ids: torch.Tensor, schema: dict | None) -> dict[str, Any]:
        """One generation; the wall time includes building the processor or callable."""
        prompt = ids.shape[1]
        record: dict[str, Any] = {"method": method, "constrained": schema is not None}
        start = time.perf_counter()
        if method == "hf":
            processors = []
            if schema is not None:
                processor = TimedGrammarProcessor(
                    self.tok, vocab_size=self.hf.config.vocab_size, json_schema=schema
                )
                processors.append(processor)
            built = time.perf_counter()
            sequences = self.hf.generate(
                ids, max_new_tokens=self.max_new, do_sample=False, logits_processor=processors
            )
            wall = time.perf_counter() - start
            tokens = sequences[0, prompt:].tolist()
            record.update(steps=len(tokens), mat=1.0, tree_nodes=0, prefill_s=None, split=None)
            if schema is not None:
                record["mask_s"] = processor.seconds
                record["mask_calls"] = processor.calls
        else:
            fast = self.callable_for(method, schema)
            built = time.perf_counter()
            out = self.hf.generate(
                ids,
                custom_generate=fast,
                max_new_tokens=self.max_new,
                do_sample=False,
                return_dict_in_generate=True,
            )
            wall = time.perf_counter() - start
            result = out.result
            tokens = out.sequences[0, prompt:].tolist()
            record.update(
                steps=result.num_steps,
                mat=result.mean_accepted_tokens,
                tree_nodes=sum(s.tree_size for s in result.steps),
                prefill_s=result.prefill_s,
                engine_s=result.total_s,
                split=result.time_split(),
                finish=result.finish_reason,
            )
        text = self.tok.decode(tokens, skip_special_tokens=True)
        record.update(build_s=built - start, wall_s=wall, tokens=tokens, text=text)
        return record


def load_prompts(path: Path, limit: int | None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def summarise(runs: list[dict[str, Any]], methods: list[str]) -> list[dict[str, Any]]:
    """One row per (method, constrained?), with ratios to ``hf``."""
    rows = []
    for method in ["hf", *methods]:
        for constrained in (False, True):
            mine = [r for r in runs if r["method"] == method and r["constrained"] == constrained]
            if not mine:
                continue
            tokens = sum(len(r["tokens"]) for r in mine)
            wall = sum(r["wall_s"] for r in mine)
            steps = sum(r["steps"] for r in mine)
            row: dict[str, Any] = {
                "method": method,
                "constrained": constrained,
                "answers": len(mine),
                "new_tokens": tokens,
                "wall_s": wall,
                "tokens_per_s": tokens / wall if wall > 0 else 0.0,
                "mat": 1.0 if method == "hf" else sum(r["mat"] * r["steps"] for r in mine) / steps,
                "valid": sum(r["valid"] for r in mine) / len(mine),
                "build_s": sum(r["build_s"] for r in mine),
            }
            same = [r["same_as_hf"] for r in mine if r["same_as_hf"] is not None]
            row["same_as_hf"] = [sum(same), len(same)] if method != "hf" else None
            if method == "hf":
                row["target_ms_per_step"] = row["nodes_per_step"] = None
                mask = [r for r in mine if "mask_s" in r]
                calls = sum(r["mask_calls"] for r in mask)
                row["verify_ms_per_step"] = (
                    1e3 * sum(r["mask_s"] for r in mask) / calls if calls else None
                )
            else:
                split = {k: sum(r["split"][k] for r in mine) for k in mine[0]["split"]}
                row["split_s"] = split
                row["prefill_s"] = sum(r["prefill_s"] for r in mine)
                row["target_ms_per_step"] = 1e3 * split["target"] / steps
                row["verify_ms_per_step"] = 1e3 * split["verify"] / steps
                row["draft_ms_per_step"] = 1e3 * split["draft"] / steps
                row["nodes_per_step"] = sum(r["tree_nodes"] for r in mine) / steps
            rows.append(row)
    speed = {(r["method"], r["constrained"]): r["tokens_per_s"] for r in rows}
    for row in rows:
        hf_c = speed.get(("hf", True))
        hf_same = speed.get(("hf", row["constrained"]))
        row["speedup_vs_hf_constrained"] = row["tokens_per_s"] / hf_c if hf_c else None
        row["speedup_vs_hf_same_mode"] = row["tokens_per_s"] / hf_same if hf_same else None
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    def num(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    head = (
        "| method | constrained | answers | new tokens | wall s | tok/s | MAT | × hf-c "
        "| × hf same | valid JSON | = hf | nodes/step | target ms/step | verify ms/step |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        same = "-" if r["same_as_hf"] is None else f"{r['same_as_hf'][0]}/{r['same_as_hf'][1]}"
        lines.append(
            f"| {r['method']} | {'yes' if r['constrained'] else 'no'} | {r['answers']} "
            f"| {r['new_tokens']} | {num(r['wall_s'])} | {num(r['tokens_per_s'], 1)} "
            f"| {num(r['mat'])} | {num(r['speedup_vs_hf_constrained'])} "
            f"| {num(r['speedup_vs_hf_same_mode'])} | {r['valid']:.0%} | {same} "
            f"| {num(r['nodes_per_step'], 1)} "
            f"| {num(r['target_ms_per_step'], 1)} | {num(r['verify_ms_per_step'], 2)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="prompts (JSON lines)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--methods", default="ar,tr,dtr,pld", help="verispec method specs")
    add_threads_option(parser)
    parser.add_argument("--limit", type=int, default=None, help="first N prompts only")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up calls per callable")
    parser.add_argument(
        "--drafter-state",
        choices=("mode", "fresh"),
        default="mode",
        help="mode: one drafter per method and mode, learning across prompts; fresh: a new "
        "callable from the spec string at every call",
    )
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    print(cpu_summary())
    print(
        f"torch {torch.__version__} ({args.threads} threads), transformers "
        f"{transformers.__version__}, verispec {verispec.__version__}; "
        f"max_new_tokens={args.max_new_tokens}, drafter state: {args.drafter_state}",
        flush=True,
    )
    began = time.perf_counter()
    bench = Bench(methods, args.max_new_tokens, args.drafter_state)
    prompts = load_prompts(args.data, args.limit)
    peers = [("hf", False), ("hf", True)] + [(m, c) for m in methods for c in (False, True)]

    warm = bench.ids(WARMUP_TEXT)
    start = time.perf_counter()
    for _ in range(args.warmup):
        for method, constrained in peers:
            bench.run(method, warm, WARMUP_SCHEMA if constrained else None)
    warmup_s = time.perf_counter() - start
    print(f"warm-up: {warmup_s:.1f} s", file=sys.stderr, flush=True)

    runs: list[dict[str, Any]] = []
    for i, prompt in enumerate(prompts):
        ids = bench.ids(prompt["text"])
        order = peers if i % 2 == 0 else peers[::-1]
        mine = {}
        for method, constrained in order:
            record = bench.run(method, ids, prompt["schema"] if constrained else None)
            record.update(id=prompt["id"], prompt_tokens=ids.shape[1])
            record["valid"] = valid_json(record["text"], prompt["schema"])
            mine[method, constrained] = record
        for (method, constrained), record in mine.items():
            reference = mine[("hf", constrained)]["tokens"]
            record["same_as_hf"] = None if method == "hf" else record["tokens"] == reference
        runs.extend(mine[p] for p in peers)
        walls = " ".join(f"{m}{'+c' if c else ''}={mine[m, c]['wall_s']:.2f}" for m, c in peers)
        print(f"[{i + 1}/{len(prompts)}] {prompt['id']}: {walls}", file=sys.stderr, flush=True)

    rows = summarise(runs, methods)
    total_s = time.perf_counter() - began
    print()
    print(table(rows))
    print(
        f"\n{len(prompts)} prompts, {args.max_new_tokens} new tokens at most; "
        f"× hf-c: tokens/s over constrained hf; = hf: greedy answers token-identical to "
        f"hf's in the same mode; verify ms/step includes the grammar masks (hf: the "
        f"processor's time per token). Run time {total_s:.0f} s (warm-up {warmup_s:.0f} s)."
    )
    for record in runs:
        if record["method"] != "hf" and record["same_as_hf"] is False:
            print(f"differs from hf: {record['id']} {record['method']} c={record['constrained']}")
    for record in runs:
        if record["constrained"] and not record["valid"]:
            print(f"invalid JSON: {record['id']} {record['method']}+c: {record['text']!r}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "cpu": cpu_summary(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "verispec": verispec.__version__,
            "threads": args.threads,
            "max_new_tokens": args.max_new_tokens,
            "methods": methods,
            "drafter_state": args.drafter_state,
            "data": str(args.data),
            "prompts": len(prompts),
            "warmup_s": warmup_s,
            "total_s": total_s,
        }
        payload = {"meta": meta, "summary": rows, "runs": runs}
        args.out.write_text(json.dumps(payload, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
