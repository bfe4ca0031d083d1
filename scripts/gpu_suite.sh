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
ROWS=()

python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >>"$LOG" 2>&1
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export KERNELZERO_DISABLE_AUTOLOAD=1
export TRITON_DEFAULT_FP_FUSION=1

{
  echo "== $(date -u +%FT%TZ)  $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, triton, cupy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__)"
  which compute-sanitizer ncu nvcc
} >>"$LOG" 2>&1

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "== step $name (limit ${limit}s): $*" >>"$LOG"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$? dt=$(( $(date +%s) - t0 ))
  cat "$OUT/$name.log" >>"$LOG"
  local result="ok"
  [ $rc -ne 0 ] && result="FAILED (rc $rc)"
  [ $rc -eq 124 ] && result="TIMEOUT"
  local tail_line
  tail_line=$(grep -E "passed|failed|error|skipped|xfailed" "$OUT/$name.log" | tail -1 | cut -c1-90)
  ROWS+=("$(printf '%-22s %-16s %5ss  %s' "$name" "$result" "$dt" "$tail_line")")
}

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
