#!/usr/bin/env bash
# Every GPU measurement of the project in ONE call on a 2-GPU H200 host (device kind nvidia-h200-x2),
# highest priority first, each step under its own limit so the whole call ends inside 10 minutes:
# the GPU suite, the red-team suite on the GPU, the expert's speedups, 1-vs-2-GPU verifier scaling,
# and the KernelBench comparison. Logs under $OUT; a short table is printed last.
#
#   bash scripts/gpu_session.sh          # carry: .whl (the wheels of ../shared/gpu-wheels) and .kb (KernelBench)
set -u
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
LOG="$OUT/session.log"
: > "$LOG"
ROWS=()
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >>"$LOG" 2>&1
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export KERNELZERO_DISABLE_AUTOLOAD=1 TRITON_DEFAULT_FP_FUSION=1 PYTHONUNBUFFERED=1
{ echo "== $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"; } >>"$LOG" 2>&1

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "== step $name (limit ${limit}s): $*" >>"$LOG"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$? dt=$(( $(date +%s) - t0 ))
  cat "$OUT/$name.log" >>"$LOG"
  local result="ok"; [ $rc -ne 0 ] && result="FAILED (rc $rc)"; [ $rc -eq 124 ] && result="TIMEOUT"
  ROWS+=("$(printf '%-14s %-14s %4ss  %s' "$name" "$result" "$dt" "$(grep -E "passed|failed" "$OUT/$name.log" | tail -1 | cut -c1-80)")")
}

step gpu_tests   150 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu tests/redteam_gpu/test_gpu_hacks.py
step redteam_gpu 130 python3 -m pytest -q -rfE -p no:cacheprovider tests/redteam_gpu/test_redteam_on_gpu.py
step expert_gpu  100 python3 benchmarks/expert_gpu.py --out "$OUT" --quick
step pool        90  python3 benchmarks/pool_scaling.py --out "$OUT" --tasks 24 --warm 4 --workers-per-gpu 4
[ -d .kb ] && step kernelbench 80 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb --problems 19_ReLU \
    --dim-scale 64 --out "$OUT/kernelbench_vs_ours.json"
{
  echo; echo "== expert (tail)"; tail -25 "$OUT/expert_gpu.log" 2>/dev/null
  echo "== pool (tail)"; tail -8 "$OUT/pool.log" 2>/dev/null
  echo "== kernelbench (tail)"; tail -12 "$OUT/kernelbench.log" 2>/dev/null
  echo "== summary"; printf '%s\n' "${ROWS[@]}"
} | tee -a "$LOG"
