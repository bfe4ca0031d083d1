#!/usr/bin/env bash
# The adapters whose libraries cannot share one environment (verifiers 0.4.0 pins mcp==2.0.0; openenv 0.10.0 needs
# fastmcp, so mcp<2; verl 0.9.1 pins transformers<5.11 while KernelZero needs transformers>=5.17 for TRL): each gets
# its own venv with KernelZero and that framework, `pip check`, and its adapter's tests (the rest of tests/envs runs
# in .venv with `make test-e2e`). Venvs live under ${ENVS_VENV_ROOT:-build/envs-venvs} and are reused when present.
# Wall time from scratch on a 2-core machine: docs/environments.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
ROOT=${ENVS_VENV_ROOT:-build/envs-venvs}
mkdir -p "$ROOT"
step() { echo "test-envs: $1 (${SECONDS} s since start)"; }
venv_with_torch() {  # name -> the venv's python, created with the CPU torch that scripts/install.sh uses
  local venv="$ROOT/$1"
  if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then  # none yet, or one left half made
    rm -rf "$venv"
    "$PY" -m venv "$venv" >&2
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -c "import torch" 2>/dev/null || "$venv/bin/python" -m pip install -q "torch==2.13.0" >&2
  echo "$venv/bin/python"
}
run() {  # name extra module test-file
  local vpy
  vpy=$(venv_with_torch "$1")
  "$vpy" -m pip install -q -e ".[$2,dev]"
  "$vpy" -m pip check
  "$vpy" -c "import $3"  # the framework itself: its test must not skip
  step "$1: installed"
  "$vpy" -m pytest -q -p no:cacheprovider "$4"
}
run_verl() {
  # verl 0.9.1 with all its own requirements (transformers<5.11 ...), KernelZero with --no-deps, and KernelZero's
  # requirements less the two that clash and that neither the adapter, the service nor the verifier imports
  # (transformers>=5.17 and trl: the trainer's), resolved together with verl's in one pip call.
  local vpy reqs check bad
  vpy=$(venv_with_torch verl)
  reqs="$ROOT/verl-kernelzero-requirements.txt"
  "$vpy" - >"$reqs" <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = project["dependencies"] + project["optional-dependencies"]["serve"] + ["pytest>=8", "pytest-timeout>=2.3"]
print("\n".join(r for r in wanted if re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() not in {"transformers", "trl"}))
PY
  "$vpy" -m pip install -q "verl==0.9.1" -r "$reqs"
  "$vpy" -m pip install -q --no-deps -e .
  # pip check: verl's requirements and every other package's hold; only KernelZero's two left-out pins may not
  check=$("$vpy" -m pip check 2>&1 || true)
  bad=$(echo "$check" | grep -v -E "^WARNING|^No broken requirements|^kernelzero [^ ]+ (requires trl,|has requirement transformers)" || true)
  if [ -n "$bad" ]; then echo "$check" >&2; exit 1; fi
  "$vpy" -c "import verl, ray"
  step "verl: installed"
  "$vpy" -m pytest -q -p no:cacheprovider tests/envs/test_verl_adapter.py
}
step "verifiers"
run verifiers envs verifiers.v1 tests/envs/test_verifiers_adapter.py  # the `envs` extra: those that install together
step "openenv"
run openenv envs-openenv openenv.core.env_server.http_server tests/envs/test_openenv_adapter.py
step "verl"
run_verl
step "done"
