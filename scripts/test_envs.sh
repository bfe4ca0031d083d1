#!/usr/bin/env bash
# The adapters whose libraries cannot share one environment (verifiers 0.4.0 pins mcp==2.0.0; openenv 0.10.0 needs
# fastmcp, so mcp<2): each gets its own venv with KernelZero and that extra, `pip check`, and its adapter's tests
# (the rest of tests/envs runs in .venv with `make test-e2e`). Venvs live under ${ENVS_VENV_ROOT:-build/envs-venvs}.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
ROOT=${ENVS_VENV_ROOT:-build/envs-venvs}
mkdir -p "$ROOT"
run() {  # name extra test-file
  local venv="$ROOT/$1"
  if [ ! -x "$venv/bin/python" ]; then "$PY" -m venv "$venv"; fi
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -c "import torch" 2>/dev/null || "$venv/bin/python" -m pip install -q "torch==2.13.0"
  "$venv/bin/python" -m pip install -q -e ".[$2,dev]"
  "$venv/bin/python" -m pip check
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "$3"
}
run verifiers envs-verifiers tests/envs/test_verifiers_adapter.py
run openenv envs-openenv tests/envs/test_openenv_adapter.py
