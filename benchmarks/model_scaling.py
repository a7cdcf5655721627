"""How the step cost scales with model size: T(n) of SmolLM2-shaped Llamas with random weights.

Run from the repository root::

    taskset -c 1 .venv/bin/python benchmarks/model_scaling.py --threads 1

For the shapes of SmolLM2-135M, -360M and -1.7B (random weights, rounded to the embedded
GGUF's block formats: Q4_1 for the layers' matrices, Q8_0 for the tied embedding, so the
runtime reads them as it reads the embedded model), one target step of n tokens (the
root and n - 1 tree nodes) after a ``--context``-token prompt, the median of
``--repeats`` (:func:`verispec.drafters.budget.measure_latency`), for ``--targets``:
verispec's runtime (``FastModel``, float32; ``verispec-int8``: with
``arithmetic="int8"``) and the Hugging Face adapter (``HFModel``: transformers'
forward, what ``generate`` runs a step). From them, what speculation would buy at a given
mean accepted tokens per step (MAT): ``MAT * T_hf(1) / T(n)`` against ``generate`` and
``MAT * T(1) / T(n)`` against the runtime's own plain decoding.

Prints a Markdown table with the CPU's flags.
"""

from __future__ import annotations

import argparse
import gc
from typing import Any

import torch
from torch import nn

from verispec.bench.commands.flags import add_threads_option
from verispec.drafters.budget import measure_latency
from verispec.kernels.cpu.features import cpu_features
from verispec.models import FastModel, HFModel
from verispec.models.accelerators.blocks import quantize_blocks

# (name, hidden, layers, heads, kv heads, intermediate): the SmolLM2 family's configs
SHAPES = {
    "135M": (576, 30, 9, 3, 1536),
    "360M": (960, 32, 15, 5, 2560),
    "1.7B": (2048, 24, 32, 32, 8192),
}
VOCAB = 49152


def random_llama(name: str, seed: int = 0) -> Any:
    """A Llama of SmolLM2-``name``'s shape with random weights in the GGUF's block formats."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv_heads, inter = SHAPES[name]
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=2048, tie_word_embeddings=True, rope_theta=100000.0,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.weight.shape[0] != VOCAB:
                module.weight.copy_(quantize_blocks(module.weight, "q4_1"))
        embedding = model.get_input_embeddings().weight
        embedding.copy_(quantize_blocks(embedding, "q8_0"))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="135M,360M,1.7B")
    parser.add_argument("--sizes", default="1,2,4,8,16", help="tokens a step (root included)")
    add_threads_option(parser)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mat", default="1.5,2.0", help="MATs to price the speedup at")
    parser.add_argument(
        "--targets",
        default="verispec,verispec-int8,transformers",
        help="comma-separated: verispec, verispec-int8, transformers",
    )
    args = parser.parse_args()
    makers = {
        "verispec": lambda hf: FastModel(hf, max_length=1024),
        "verispec-int8": lambda hf: FastModel(hf, max_length=1024, arithmetic="int8"),
        "transformers": lambda hf: HFModel(hf, max_length=1024),
    }
    chosen = args.targets.split(",")
    if unknown := set(chosen) - set(makers):
        parser.error(f"--targets: unknown {sorted(unknown)}; allowed: {sorted(makers)}")
    torch.set_num_threads(args.threads)
    sizes = [int(n) for n in args.sizes.split(",")]
    mats = [float(m) for m in args.mat.split(",")]
    print(f"flags: {' '.join(cpu_features())}; {args.threads} thread(s); context {args.context}")
    head = " | ".join(f"T({n})" for n in sizes)
    print(f"\n| model | target | {head} | T(16)/T(1) |")
    print("|---|---|" + "---|" * (len(sizes) + 1))
    rows: dict[str, dict[str, list[float]]] = {}
    for name in args.models.split(","):
        hf = random_llama(name)
        rows[name] = {}
        for label in chosen:
            target = makers[label](hf)
            table = measure_latency(
                target, [n - 1 for n in sizes], context=args.context, repeats=args.repeats
            )
            ms = [1e3 * float(table.at(n - 1)) for n in sizes]
            rows[name][label] = ms
            cells = " | ".join(f"{t:.1f}" for t in ms)
            print(f"| {name} | {label} | {cells} | {ms[-1] / ms[0]:.2f} |", flush=True)
            del target
            gc.collect()
        del hf
        gc.collect()
    print("\nspeedup a step buys at MAT m with n tokens a step (vs generate / vs its own ar):")
    print(
        "\n| model | target | "
        + " | ".join(f"MAT {m:g}, n={n}" for m in mats for n in sizes[1:])
        + " |"
    )
    print("|---|---|" + "---|" * (len(mats) * (len(sizes) - 1)))
    for name, by in rows.items():
        theirs = by.get("transformers")
        for label in (t for t in chosen if t != "transformers"):
            ours = by[label]
            cells = [
                (f"{m * theirs[0] / ours[i]:.2f} / " if theirs else "")
                + f"{m * ours[0] / ours[i]:.2f}"
                for m in mats
                for i in range(1, len(sizes))
            ]
            print(f"| {name} | {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
