#!/usr/bin/env bash
# A short multi-GPU GRPO run under accelerate (TRL's own DDP path), one rank per GPU of the host.
#
#   bash scripts/multigpu_grpo.sh                 # on the 2-GPU H200 host; carry .whl (trl, datasets, hydra ...)
#   (the embedded default job of python -m core.run, shortened, with its model and verifier on CUDA)
#   NGPU=2 STEPS=6 bash scripts/multigpu_grpo.sh  # knobs: NGPU, STEPS, DISTILL_STEPS, RUN_DIR
#
# Every accelerate rank re-runs the Hydra main. Hydra's default output dir is a timestamp, which can
# differ between ranks that start a second apart, so the run dir is fixed here ONCE and passed to
# every rank as hydra.run.dir: all ranks read and write the same metrics, checkpoints and state.
# Writes the log to $OUT and prints a short summary last.
set -u
OUT=${OUT:-$PWD/multigpu_out}
mkdir -p "$OUT"
LOG="$OUT/multigpu_grpo.log"
: > "$LOG"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >>"$LOG" 2>&1
  export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
else
  export PYTHONPATH=$PWD:${PYTHONPATH:-}
fi
export KERNELZERO_DISABLE_AUTOLOAD=1 TRITON_DEFAULT_FP_FUSION=1 PYTHONUNBUFFERED=1
NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | wc -l)}
[ "$NGPU" -ge 1 ] || { echo "no GPU visible (nvidia-smi -L printed nothing)"; exit 2; }
STEPS=${STEPS:-6}
DISTILL_STEPS=${DISTILL_STEPS:-30}
RUN_DIR=${RUN_DIR:-$OUT/run}           # the one Hydra output dir shared by every rank
rm -rf "$RUN_DIR"

# per_device_train_batch_size x processes x steps_per_generation must divide by num_generations:
# tasks_per_step=2 x num_generations=4 = 8 per device -> any NGPU works.
t0=$(date +%s)
python3 -m accelerate.commands.launch --num_processes "$NGPU" --num_machines 1 --mixed_precision no \
  --dynamo_backend no -m core.run \
  device=cuda \
  trainer.phases.distill.steps="$DISTILL_STEPS" trainer.phases.distill.tasks=16 \
  trainer.phases.correctness.steps="$STEPS" trainer.eval_tasks=4 trainer.eval_each_phase=false trainer.report_to=[] \
  "hydra.run.dir=$RUN_DIR" >>"$LOG" 2>&1
rc=$?
dt=$(( $(date +%s) - t0 ))
cp "$RUN_DIR"/metrics.jsonl "$OUT"/ 2>/dev/null
echo
echo "multi-GPU GRPO: ranks=$NGPU rc=$rc seconds=$dt run_dir=$RUN_DIR"
echo "hydra configs written (one dir for all ranks): $(ls -d "$RUN_DIR"/.hydra 2>/dev/null | wc -l) dir(s)"
ls "$RUN_DIR" 2>/dev/null | head -20
tail -n 15 "$LOG"
exit $rc
