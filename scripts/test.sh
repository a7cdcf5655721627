#!/usr/bin/env bash
# The test command: set up (once), then lint, type-check, check the layers' imports
# (import-linter, pyproject.toml), build the docs with warnings as errors, and run every
# test and audit in proofs_tests/ (real-model tests included).
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$ROOT"
echo "== ruff" && ruff check verispec proofs_tests benchmarks && ruff format --check verispec proofs_tests benchmarks
echo "== mypy" && mypy
echo "== import-linter" && lint-imports --no-logo
echo "== sphinx" && python -m sphinx -W --keep-going -q -b html docs docs/_build/html
echo "== pytest" && exec python -m pytest proofs_tests -p no:cacheprovider "$@"
