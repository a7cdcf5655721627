#!/usr/bin/env bash
# Issue 49's format table on the CPU at hand: the embedded SmolLM2-135M file requantized by
# llama.cpp's own `llama-quantize` to each preset, then for each file the first load (the
# conversion, in an empty cache), and `verispec bench` with llama.cpp on the same file.
#
#   bash benchmarks/gguf_formats.sh OUT                      # every preset, ~4 min each
#   PRESETS="Q4_K_M Q6_K" THREADS=2 bash benchmarks/gguf_formats.sh /tmp/g
#
# For benchmarks only, never for the test command: it builds llama-quantize (~10 min on 2
# cores, once, into OUT/llama.cpp) from the sources the llama-cpp-python sdist vendors,
# unless LLAMA_QUANTIZE names one. Needs the set-up of `scripts/bench.sh` (.venv) and, for
# the llama-cpp peer, llama-cpp-python built on this machine. Writes OUT/cpu.txt,
# OUT/smollm2-PRESET.gguf, OUT/PRESET.json (the bench figures), OUT/PRESET.txt (its table,
# the target line and the load time).
set -euo pipefail
OUT=${1:?usage: bash benchmarks/gguf_formats.sh OUT_DIR}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PRESETS=${PRESETS:-"Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_M Q4_K_S Q4_K_M Q5_K_M Q6_K IQ4_NL IQ4_XS F16 BF16"}
THREADS=${THREADS:-1}
LIMIT=${LIMIT:-1}
TOKENS=${TOKENS:-96}
METHODS=${METHODS:-ar,pld,tr,dtr,llama-cpp}
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || { echo "no $PY: run scripts/bench.sh once first" >&2; exit 1; }
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
{
  lscpu | grep -E '^Model name' || true
  grep -o -w -E 'avx2|fma|avx512f|avx512_vnni|avx_vnni|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '
  echo
} > "$OUT/cpu.txt"

QUANTIZE=${LLAMA_QUANTIZE:-$OUT/llama.cpp/build/bin/llama-quantize}
if [ ! -x "$QUANTIZE" ]; then
  echo "[gguf_formats] building llama-quantize from the llama-cpp-python sdist (once)..." >&2
  mkdir -p "$OUT/llama.cpp"
  "$PY" -m pip download -q --no-deps --no-binary :all: llama-cpp-python -d "$OUT/llama.cpp"
  tar -xzf "$OUT"/llama.cpp/llama_cpp_python-*.tar.gz -C "$OUT/llama.cpp"
  SRC=$(ls -d "$OUT"/llama.cpp/llama_cpp_python-*/vendor/llama.cpp)
  cmake -S "$SRC" -B "$OUT/llama.cpp/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DCMAKE_BUILD_TYPE=Release > "$OUT/llama.cpp/cmake.log"
  cmake --build "$OUT/llama.cpp/build" --target llama-quantize -j 2 > "$OUT/llama.cpp/build.log"
fi

SOURCE=$("$PY" -c "from verispec.models.gguf import embedded_gguf; print(embedded_gguf())")
cd "$ROOT"
for preset in $PRESETS; do
  file="$OUT/smollm2-$(echo "$preset" | tr 'A-Z' 'a-z').gguf"
  [ -f "$file" ] || "$QUANTIZE" --allow-requantize "$SOURCE" "$file" "$preset" 2 \
    > "$OUT/quantize-$preset.log" 2>&1
  cache=$(mktemp -d)
  load=$(VERISPEC_CACHE="$cache" "$PY" - "$file" <<'EOF' 2>/dev/null
import sys, time
start = time.perf_counter()
from verispec.models.loading import load_model
model, _ = load_model(sys.argv[1], max_length=512)
print(f"first load {time.perf_counter() - start:.1f} s; target: {model.runtime_note}")
EOF
)
  rm -rf "$cache"
  "$PY" -m verispec bench --model "$file" --methods "$METHODS" --threads "$THREADS" \
    --limit "$LIMIT" --max-new-tokens "$TOKENS" --no-progress --json "$OUT/$preset.json" \
    > "$OUT/$preset.txt" 2>&1
  echo "$load" >> "$OUT/$preset.txt"
  echo "== $preset ($(du -m "$file" | cut -f1) MB): $load"
  grep -E '^(ar|pld|tr|dtr|llama-cpp) ' "$OUT/$preset.txt"
done
