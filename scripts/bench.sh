#!/usr/bin/env bash
# The main job: set up (once), then benchmark Token Recycling against plain decoding and
# transformers' generate on the embedded SmolLM2-135M-Instruct, printing a table.
# Extra arguments go to `verispec bench` (see `verispec bench --help`).
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$ROOT"
exec python -m verispec bench "$@"
