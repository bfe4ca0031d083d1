#!/usr/bin/env bash
# One-call GPU job (H200): the embedded default at GPU scale (a larger model trained from scratch),
# then both published-claim experiments from its distilled model. Installs nothing system-wide:
# the missing wheels go to /tmp/site. Logs and run directories go under $OUT; a table prints last.
#   OUT=/path/to/logs bash scripts/gpu_train_experiments.sh
set -euo pipefail
OUT="${OUT:?set OUT to a log directory}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WHEELS="${WHEELS:-$ROOT/../shared/gpu-wheels}"
if [ -d "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$ROOT:${PYTHONPATH:-}" KERNELZERO_CACHE="$OUT/cache"
cd "$ROOT"
MODEL="coder.embedded.hidden_size=512 coder.embedded.num_layers=8 coder.embedded.num_heads=8 coder.embedded.num_kv_heads=4 coder.embedded.intermediate_size=1536 coder.embedded.vocab_size=8192 coder.corpus_tasks=1000"
python3 -m core.run trainer=embedded coder=llm curriculum=adaptive $MODEL \
  trainer.torch_threads=null trainer.eval_tasks=64 trainer.tasks_per_step=8 trainer.num_generations=8 \
  trainer.phases.distill.steps=2000 trainer.phases.distill.tasks=1024 trainer.phases.distill.batch_size=16 \
  trainer.phases.distill.learning_rate=5e-4 trainer.phases.correctness.steps=200 trainer.phases.correctness.learning_rate=1e-5 \
  hydra.run.dir="$OUT/embedded_gpu" 2>&1 | tee "$OUT/embedded_gpu.log" | grep -E "held-out|distill:|step +[0-9]+ " || true
python3 scripts/run_experiments.py --out "$OUT/experiments" --seeds 0 1 2 --steps 100 \
  --model "$OUT/embedded_gpu/models/distill" -- $MODEL trainer.torch_threads=null trainer.tasks_per_step=8 \
  trainer.num_generations=8 trainer.eval_tasks=16 2>&1 | tee "$OUT/experiments.log" | tail -30
cat "$OUT/embedded_gpu/result.json"
