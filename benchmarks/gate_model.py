"""What the draft gate costs and gains, by acceptance rate: verispec's DraftGate on a model.

Run from the repository root::

    .venv/bin/python benchmarks/gate_model.py --plain-ms 10.4 --step-ms 13.1 --drafter-ms 1.0

A one-node drafter whose node is accepted with probability ``p`` at every step, independently,
and a clock that advances by what each step costs: ``--plain-ms`` for a plain step,
``--step-ms`` plus ``--drafter-ms`` for a drafted one (measure them with
``verispec bench`` step records, or ``benchmarks/step_profile.py``). The real
:class:`verispec.drafters.gate.DraftGate` decides each step, with the given ``max_skip``
and ``smoothing`` values, on its fake clock. For each ``p`` the script prints tokens per
second over plain decoding's for drafting every step, for plain decoding, and for the gate
with each setting (the mean of ``--seeds`` runs of ``--steps`` steps).

What it shows: where drafting loses (every step drafted < 1), how close the gate stays
to plain decoding (its probes and the drafted steps after a lucky probe are its cost), and
where drafting wins, how much of the gain it keeps. No machine time is measured; the
figures are exact for the model and the gate's code.
"""

from __future__ import annotations

import argparse
import random
import statistics

from verispec.drafters.budget import LatencyTable
from verispec.drafters.gate import DraftGate


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def gated_speed(
    p: float,
    plain_s: float,
    step_s: float,
    drafter_s: float,
    *,
    max_skip: int,
    smoothing: float,
    steps: int,
    seed: int,
    answer_steps: int = 0,
    carry: bool = False,
    unpaid: bool = False,
) -> float:
    """Tokens per second over plain decoding's of the gate on the model (one run).

    ``answer_steps``: a new sequence every that many steps (0: one sequence), the gate
    then restarted (``carry``: :meth:`DraftGate.restart`, the backing off kept, as Token
    Recycling does) or reset (as ``dtr`` and ``pld`` do); ``unpaid``: every probe marked
    :meth:`DraftGate.unpaid` (Token Recycling's node when its budget rule keeps none)."""
    clock = _Clock()
    table = LatencyTable([0, 1], [plain_s, step_s])
    gate = DraftGate(table, max_skip=max_skip, smoothing=smoothing, clock=clock)
    rng = random.Random(seed)
    tokens = 0
    for step in range(steps):
        if answer_steps and step % answer_steps == 0:
            gate.restart() if carry else gate.reset()
        if gate.drafting():  # propose: the drafter's time, then the step
            if unpaid:
                gate.unpaid()
            gate.clock_in()
            clock.now += drafter_s
            gate.clock_out()
            clock.now += step_s
            accepted = 1 if rng.random() < p else 0
            gate.clock_in()  # observe
            gate.record(1, accepted, context=300)
            tokens += 1 + accepted
        else:
            clock.now += plain_s
            gate.clock_in()
            gate.record(0, 0, context=300)
            tokens += 1
    return tokens / clock.now * plain_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain-ms", type=float, default=10.4, help="a plain step (ms)")
    parser.add_argument("--step-ms", type=float, default=13.1, help="a one-node step (ms)")
    parser.add_argument("--drafter-ms", type=float, default=1.0, help="drafting a step (ms)")
    parser.add_argument("--rates", default="0,0.1,0.2,0.25,0.3,0.35,0.4,0.5,0.6,0.8")
    parser.add_argument("--max-skip", default="16,32,64", help="settings to compare")
    parser.add_argument("--smoothing", default="0.3,0.15", help="settings to compare")
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--answer-steps", type=int, default=0, help="a new sequence every N steps (0: one sequence)"
    )
    parser.add_argument(
        "--carry",
        action="store_true",
        help="restart the gate at a new sequence (keep the backing off)",
    )
    parser.add_argument("--unpaid", action="store_true", help="every probe unpaid")
    args = parser.parse_args()
    plain, step, drafter = args.plain_ms / 1e3, args.step_ms / 1e3, args.drafter_ms / 1e3
    settings = [
        (int(m), float(s)) for m in args.max_skip.split(",") for s in args.smoothing.split(",")
    ]
    print(f"plain step {args.plain_ms} ms, one-node step {args.step_ms} ms + drafter "
          f"{args.drafter_ms} ms; tokens/s over plain decoding's (mean of {args.seeds} runs "
          f"of {args.steps} steps; new sequence every {args.answer_steps or 'never'}, "
          f"carry {args.carry}, unpaid {args.unpaid})\n")  # fmt: skip
    head = ["p", "always draft"] + [f"gate {m}/{s}" for m, s in settings]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for p in (float(x) for x in args.rates.split(",")):
        always = (1 + p) * plain / (step + drafter)
        cells = [f"{p:.2f}", f"{always:.3f}"]
        for max_skip, smoothing in settings:
            kw = {"max_skip": max_skip, "smoothing": smoothing, "steps": args.steps,
                  "answer_steps": args.answer_steps, "carry": args.carry,
                  "unpaid": args.unpaid}  # fmt: skip
            runs = [
                gated_speed(p, plain, step, drafter, seed=seed, **kw) for seed in range(args.seeds)
            ]
            cells.append(f"{statistics.fmean(runs):.3f}")
        print("| " + " | ".join(cells) + " |")
    print("\n(gate M/S: max_skip M, smoothing S; the default is 16/0.3)")


if __name__ == "__main__":
    main()
