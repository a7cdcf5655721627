#!/usr/bin/env bash
# Issue 25's headline measurement on the CPU at hand, in one command: Spec-Bench (the first
# LIMIT questions of each of the 13 categories) for METHODS at two threads, then at one
# thread in two shards of the categories run at once, one per core under taskset (each with a
# busy neighbour), merged by `verispec report`; the per-category intervals against `ar`; and
# with EXTRAS=1 the T(n) table of our runtime and llama.cpp and the prompt pass's crossover.
#
#   bash benchmarks/headline.sh OUT                 # ~25 min on a 2-core CPU (LIMIT=5)
#   LIMIT=1 METHODS=ar,pld bash benchmarks/headline.sh /tmp/h   # a quick check of the pipeline
#   ARITHMETIC=int8 bash benchmarks/headline.sh OUT  # the integer products (default: exact)
#
# Needs the set-up of `scripts/bench.sh` (.venv) and, for the llama-cpp peer, llama-cpp-python
# built on this machine (VERISPEC_LLAMACPP=1 bash scripts/bench.sh --help builds it once).
# Writes OUT/cpu.txt (lscpu's model and the flags that decide the kernels), OUT/t2.json and
# .jsonl, OUT/t1.json and .jsonl (merged), OUT/t1a.*, OUT/t1b.* (the shards), and the
# printed tables as OUT/*.txt.
set -euo pipefail
OUT=${1:?usage: bash benchmarks/headline.sh OUT_DIR}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
QUESTIONS=${QUESTIONS:-$ROOT/../shared/data/spec_bench/question.jsonl}
LIMIT=${LIMIT:-5}
METHODS=${METHODS:-ar,pld,tr,dtr,llama-cpp}
ARITHMETIC=${ARITHMETIC:-exact}
SHARD_A=writing,roleplay,reasoning,math,translation,summarization
SHARD_B=coding,extraction,stem,humanities,qa,math_reasoning,rag
VS="$ROOT/.venv/bin/verispec"
PY="$ROOT/.venv/bin/python"
[ -x "$VS" ] || { echo "no $VS: run scripts/bench.sh once first" >&2; exit 1; }
mkdir -p "$OUT"
cd "$ROOT"
{
  lscpu | grep -E '^Model name' || true
  echo "flags: $(grep -m1 -o -w -E 'avx2|fma|avx512f|avx512_bf16|avx512_vnni|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); arithmetic: $ARITHMETIC"
} | tee "$OUT/cpu.txt"
bench() {  # bench THREADS NAME [extra arguments]
  local threads=$1 name=$2
  shift 2
  "$VS" bench --questions "$QUESTIONS" --limit "$LIMIT" --threads "$threads" --methods "$METHODS" \
    --arithmetic "$ARITHMETIC" --per-category --no-progress --json "$OUT/$name.json" \
    --records "$OUT/$name.jsonl" "$@" \
    > "$OUT/$name.txt" 2>&1
}
echo "two threads ..." >&2
bench 2 t2
echo "one thread, two shards at once ..." >&2
export VS QUESTIONS LIMIT METHODS ARITHMETIC OUT
export -f bench
taskset -c 0 bash -c "bench 1 t1a --categories $SHARD_A" &
taskset -c 1 bash -c "bench 1 t1b --categories $SHARD_B" &
wait
(cat "$OUT/t1a.jsonl"; tail -n +2 "$OUT/t1b.jsonl") > "$OUT/t1.jsonl"  # one header line
"$VS" report "$OUT/t1a.json" "$OUT/t1b.json" --json "$OUT/t1.json" > "$OUT/t1.txt" 2>&1
for name in t2 t1; do
  "$VS" report "$OUT/$name.json" --intervals ar --records "$OUT/$name.jsonl" \
    > "$OUT/${name}_intervals.txt" 2>&1
done
if [ "${EXTRAS:-0}" = 1 ]; then
  echo "T(n) and the prompt pass ..." >&2
  sizes=1,2,3,4,6,8,12,16  # one thread pinned; two threads need both cores
  taskset -c 1 "$PY" benchmarks/tn_table.py --threads 1 --sizes $sizes \
    --arithmetic "$ARITHMETIC" > "$OUT/tn_1t.txt" 2>&1
  "$PY" benchmarks/tn_table.py --threads 2 --sizes $sizes --arithmetic "$ARITHMETIC" \
    > "$OUT/tn_2t.txt" 2>&1
  taskset -c 1 "$PY" benchmarks/prefill.py --threads 1 --paths --lengths 33,48,63,64,80,96,128 \
    --arithmetic "$ARITHMETIC" > "$OUT/prefill_1t.txt" 2>&1
  "$PY" benchmarks/prefill.py --threads 2 --paths --lengths 33,48,63,64,80,96,128 \
    --arithmetic "$ARITHMETIC" > "$OUT/prefill_2t.txt" 2>&1
fi
for name in t2 t1; do
  echo "== $name" && awk '/^method /{p=1} p&&/^$/{exit} p' "$OUT/$name.txt"
  grep -E '^below ar' "$OUT/${name}_intervals.txt" || true
done
