#!/usr/bin/env bash
# The test command: set up (once), then lint, type-check, check the layers' imports
# (import-linter, pyproject.toml), build the docs with warnings as errors, and run every
# test and audit in proofs_tests/ (real-model tests included).
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$ROOT"
# One command a line: _env.sh sets -e, which a failure before the last command of an
# `a && b && c` list would not trigger (a lint error once passed CI that way).
echo "== ruff"
ruff check verispec proofs_tests benchmarks
ruff format --check verispec proofs_tests benchmarks
echo "== mypy"
mypy
echo "== import-linter"
lint-imports --no-logo
echo "== sphinx"
python -m sphinx -W --keep-going -q -b html docs docs/_build/html
# one pytest-xdist worker per core (at most 4: each loads the real model once); each
# worker's torch gets its share of the cores (proofs_tests/conftest.py)
echo "== pytest" && exec python -m pytest proofs_tests -p no:cacheprovider -n auto --maxprocesses 4 "$@"
