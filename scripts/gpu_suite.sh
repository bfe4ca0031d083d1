#!/usr/bin/env bash
# The GPU suite in ONE call on the H200: GPU tests, GPU red-team hacks, the Triton red-team suite on
# the GPU, the timing-repeatability measurement and KernelBench-vs-ours. Logs under $OUT; a short
# table is printed last.
#
#   bash scripts/gpu_suite.sh            # carry: .whl (the wheels) and .kb (a KernelBench checkout)
#
# Every step has its own time limit so the whole script stays under ~9.5 minutes.
set -u
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
LOG="$OUT/gpu_suite.log"
: > "$LOG"
. "$(dirname "$0")/gpu_lib.sh"

step gpu_tests        170 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu tests/redteam_gpu/test_gpu_hacks.py \
                           tests/test_cuda_backend.py tests/test_timing.py tests/test_roofline.py tests/test_gpu_checks_cpu.py
step repeatability     60 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability.json"
if [ -d .kb ]; then
  step kernelbench    170 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb --out "$OUT/kernelbench_vs_ours.json"
else
  ROWS+=("kernelbench            SKIPPED          (no .kb KernelBench checkout carried)")
fi
step redteam_triton_gpu 140 python3 -m pytest -q -rA -p no:cacheprovider tests/redteam_gpu/test_redteam_on_gpu.py

{
  echo
  echo "== repeatability"; cat "$OUT/repeatability.log" 2>/dev/null | tail -6
  echo "== kernelbench vs ours"; grep -A12 '"device"' "$OUT/kernelbench.log" 2>/dev/null | head -14
  echo "== summary"
  printf '%s\n' "${ROWS[@]}"
} | tee -a "$LOG"
