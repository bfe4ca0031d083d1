#!/bin/bash
# usage: g.sh NAME [overrides...]  -- GRPO only from the s400 warm start, fixed tier-0 curriculum unless overridden
name=$1; shift
cd /work/wt/learn2
start=$(date +%s)
PYTHONPATH=/work/wt/learn2 /work/main/.venv/bin/python -m core.run hydra.run.dir=/tmp/kzl2/$name \
  coder.model=${MODEL:-/tmp/kzl/s400/models/distill} trainer.phases.distill.steps=0 trainer.phases.more_sft.steps=0 \
  coder.max_new_tokens=192 trainer.resume=never "$@" > /tmp/kzl2/$name.log 2>&1
echo "$name rc=$? wall=$(( $(date +%s) - start ))s $*" >> /tmp/kzl2/index.txt
