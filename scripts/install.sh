#!/usr/bin/env bash
# Create .venv (if needed) and install KernelZero with its dev and CUDA extras.
# torch is installed first and pinned to 2.13.0: on the CPU machines this project is developed
# on, that resolves to a local CPU build; an unpinned torch would pull a multi-GB CUDA build.
# Where torch is already importable (a GPU machine's own build) it is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip
if ! "$VPY" -c "import torch" 2>/dev/null; then
  "$VPY" -m pip install -q "torch==2.13.0" || "$VPY" -m pip install -q torch
fi
"$VPY" -m pip install -q -e ".[dev,cuda,ray,serve]"
"$VPY" -c "import torch, triton, trl, hydra, z3, pluggy; print(f'kernelzero environment ready: torch {torch.__version__}, triton {triton.__version__}')"
