#!/usr/bin/env bash
# The main job: set up (once), then benchmark verispec's methods against plain decoding,
# transformers' generate and llama.cpp on the embedded SmolLM2-135M-Instruct, printing a table.
# The default run (8 methods x 8 answers, one thread) took 4.4 minutes on a 2-core CPU.
# Extra arguments go to `verispec bench` (see `verispec bench --help`).
# VERISPEC_LLAMACPP=1 also builds the optional llama.cpp peers (llama-cpp-python, from source:
# a C++ compiler and cmake, ~25 min on 2 cores, once); if that fails the benchmark skips them.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$ROOT"
if [ "${VERISPEC_LLAMACPP:-0}" = 1 ] && ! "$PY" -c "import llama_cpp" >/dev/null 2>&1; then
  echo "[verispec] building llama-cpp-python for the llama-cpp peers (once, ~25 min on 2 cores)..." >&2
  "$PY" -m pip install -q --disable-pip-version-check -e "$ROOT[llamacpp]" >&2 \
    || echo "[verispec] llama-cpp-python did not install; the llama-cpp peers will be skipped" >&2
fi
exec python -m verispec bench "$@"
