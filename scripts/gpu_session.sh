#!/usr/bin/env bash
# Every GPU measurement of the project in ONE call on a 2-GPU H200 host (device kind nvidia-h200-x2),
# highest priority first, each step under its own limit so the whole call ends inside 10 minutes:
# the GPU suite, the red-team suite on the GPU, the expert's speedups, 1-vs-2-GPU verifier scaling,
# and the KernelBench comparison. Logs under $OUT; a short table is printed last.
#
#   bash scripts/gpu_session.sh          # ONLY="gpu_tests redteam_gpu" for a subset; carry: .whl (the wheels of ../shared/gpu-wheels) and .kb (KernelBench)
set -u
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
LOG="$OUT/session.log"
: > "$LOG"
. "$(dirname "$0")/gpu_lib.sh"

step gpu_tests   140 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu tests/redteam_gpu/test_gpu_hacks.py
step redteam_gpu 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/redteam_gpu/test_redteam_on_gpu.py
step expert_gpu  90  python3 benchmarks/expert_gpu.py --out "$OUT" --quick
step pool        80  python3 benchmarks/pool_scaling.py --out "$OUT" --tasks 24 --warm 4 --workers-per-gpu 4
[ -d .kb ] && step kernelbench 60 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb --problems 19_ReLU \
    --dim-scale 64 --out "$OUT/kernelbench_vs_ours.json"
{
  echo; echo "== expert (tail)"; tail -25 "$OUT/expert_gpu.log" 2>/dev/null
  echo "== pool (tail)"; tail -8 "$OUT/pool.log" 2>/dev/null
  echo "== kernelbench (tail)"; tail -12 "$OUT/kernelbench.log" 2>/dev/null
  echo "== summary"; printf '%s\n' "${ROWS[@]}"
} | tee -a "$LOG"
