# Shared by the GPU scripts: install the carried wheels, record the machine, and run steps under
# their own time limits, collecting one summary row each (ROWS, and $STEP_DIR/rows.txt for steps run
# in background lanes).  Source it; needs $OUT and $LOG.  Step logs go to $STEP_DIR (default $OUT):
# only 8 files come back from $OUT, so scripts with many steps point STEP_DIR elsewhere and tar it.
ROWS=()
STEP_DIR=${STEP_DIR:-$OUT}
mkdir -p "$STEP_DIR"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >>"$LOG" 2>&1
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
export KERNELZERO_DISABLE_AUTOLOAD=1 TRITON_DEFAULT_FP_FUSION=1 PYTHONUNBUFFERED=1
{
  echo "== $(date -u +%FT%TZ)  $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, triton, cupy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__)"
  which compute-sanitizer ncu nvcc
} >>"$LOG" 2>&1

step() {  # step NAME LIMIT_S COMMAND...   (output in $STEP_DIR/NAME.log, appended to $LOG)
  local name=$1 limit=$2; shift 2
  # ONLY="a b" runs just the named steps (a short call when device time is scarce).
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
  local t0=$(date +%s)
  echo "== step $name (limit ${limit}s): $*" >>"$LOG"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$STEP_DIR/$name.log" 2>&1
  local rc=$? dt=$(( $(date +%s) - t0 ))
  { echo "== step $name log"; cat "$STEP_DIR/$name.log"; } >>"$LOG"
  local result="ok"
  [ $rc -ne 0 ] && result="FAILED (rc $rc)"
  [ $rc -eq 124 ] && result="TIMEOUT"
  local row
  row="$(printf '%-20s %-14s %5ss  %s' "$name" "$result" "$dt" \
    "$(grep -E "passed|failed|error|skipped|xfailed" "$STEP_DIR/$name.log" | tail -1 | cut -c1-80)")"
  ROWS+=("$row")
  echo "$row" >>"$STEP_DIR/rows.txt"
}
