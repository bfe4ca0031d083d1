#!/usr/bin/env bash
# Every GPU measurement of the project in TWO calls of under 10 minutes on a 2-GPU H200 host
# (device kind nvidia-h200-x2); a 1-GPU host works too, the lanes then share GPU 0.
#
#   bash scripts/gpu_session.sh 1   # lane A (GPU 0): GPU timing tests, timer repeatability, then the GPU
#                                   #   suite and the red-team suite on the GPU (pytest -n 6);
#                                   # lane B (last GPU): the expert's speedups and ResNet-50 convs vs cuDNN
#   bash scripts/gpu_session.sh 2   # timer repeatability alone on a quiet host, KernelBench vs ours,
#                                   # 1-vs-2-GPU verifier scaling, multi-GPU GRPO
#   ONLY="repeatability kernelbench pool" bash scripts/gpu_session.sh 2    # a subset
#   bash scripts/gpu_session.sh 5   # timer policies side by side on a quiet host (launch filler, longer
#                                   # warm-up); then lane A (GPU 0): KernelBench vs ours without and with
#                                   # memcheck; lane B (last GPU): the timer's GPU tests, the inductor
#                                   # teacher's GPU test, elementwise fusion
#   bash scripts/gpu_session.sh 6   # throughput, each alone on the host: KernelBench vs ours (GPU 0; three
#                                   # check sets of ours), then 1-vs-2-GPU verifier scaling (SKIP_POOL=1: not)
#   bash scripts/gpu_session.sh 7   # lane A (GPU 0): timer tests, repeatability, GPU suite + red-team suite;
#                                   # lane B (last GPU): the inductor teacher's GPU test, expert speedups
#   bash scripts/gpu_session.sh 8   # lane A (GPU 0): timer tests, GPU suite + red-team suite; lane B (last
#                                   # GPU): the inductor teacher's GPU test, repeatability on a busy host;
#                                   # then 1-vs-2-GPU verifier scaling alone (SKIP_POOL=1: not)
#   bash scripts/gpu_session.sh 9   # 1-vs-2-GPU verifier scaling alone, 96 tasks, time for both runs
#   bash scripts/gpu_session.sh 10  # lane A (GPU 0): compare_on_device's GPU tests, GPU suite + red-team suite;
#                                   # lane B (last GPU): KernelBench vs ours, on the device and in the judge
#   bash scripts/gpu_session.sh 11  # what a compute-sanitizer verdict costs (start-up vs checking)
#   bash scripts/gpu_session.sh 12  # inputs digested on the GPU: its tests, red-team input cases, KernelBench vs ours
#   bash scripts/gpu_session.sh 13  # the timed stage stopping once its median settles (settle_rel): repeatability
#                                   # against the planned runs, then KernelBench vs ours with it
#   bash scripts/gpu_session.sh 14  # the timed stage times only the candidate (set-up shared, baseline once per
#                                   # task): lane A (GPU 0) GPU suite + red-team suite, lane B (last GPU) timer
#                                   # tests and shorter timing policies' repeatability; then KernelBench vs
#                                   # ours alone (KB_CONFIGS, ROUNDS)
#   bash scripts/gpu_session.sh 15  # the timer's new default (settle 0.5%, 5 ms warm-up) against the planned runs,
#                                   # alone; KernelBench vs ours alone (warm workers); then GPU suite + red-team
#                                   # suite (GPU 0) beside the timer tests (last GPU)
#   bash scripts/gpu_session.sh 16  # each alone: 1-vs-2-GPU scaling without compute-sanitizer, KernelBench vs ours
#                                   # (warm pool, rounds 3), 1-vs-2-GPU scaling with memcheck
#   bash scripts/gpu_session.sh 17  # cheaper timed runs (filler 1.3x the launch, flush 2x L2): repeatability
#                                   # alone, then on a busy host beside the suites; KernelBench vs ours alone
#   bash scripts/gpu_session.sh 18  # each alone: KernelBench vs ours with cheaper timed runs (@lean) and more
#                                   # workers (@w12, @w16), then timer repeatability of those runs (4 variants)
#   bash scripts/gpu_session.sh 19  # the new timer default (filler 1.3x, flush 2x L2): lane A (GPU 0) GPU suite +
#                                   # red-team suite, lane B (last GPU) timer tests and repeatability on a busy
#                                   # host against the previous default; then KernelBench vs ours alone
#   bash scripts/gpu_session.sh 20  # each alone: timer repeatability (default, previous), KernelBench vs ours
#   bash scripts/gpu_session.sh 21  # the load's compile ahead of the GPU lock: KernelBench vs ours alone, then
#                                   # lane A (GPU 0) GPU suite + red-team suite, lane B (last GPU) timer tests
#   bash scripts/gpu_session.sh 4   # re-measure what is still open: repeatability and KernelBench vs ours
#                                   # (GPU 0); the inductor teacher's GPU test and elementwise fusion (last GPU)
#
# carry: .whl (the wheels of ../shared/gpu-wheels) and .kb (a KernelBench checkout). Each step has
# its own limit. Step logs are packed into $OUT/steps.tgz (only 8 files come back from $OUT); the
# JSON results are copied to $OUT; a short table is printed last.
set -u
PART=${1:-1}
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
LOG="$OUT/session$PART.log"
: > "$LOG"
STEP_DIR=$(mktemp -d /tmp/kz-steps.XXXX)
. "$(dirname "$0")/gpu_lib.sh"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
LAST=$(( NGPU > 1 ? NGPU - 1 : 0 ))
echo "== part $PART on $NGPU GPU(s)" | tee -a "$LOG"

if [ "$PART" = 1 ]; then
  lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    step gpu_timing   100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_timing_gpu.py
    step repeatability 90 python3 -m benchmarks.timing_repeatability --out "$STEP_DIR/repeatability.json"
    step gpu_suites   290 python3 -m pytest -q -rA -p no:cacheprovider -n 6 tests/gpu/test_cuda_gpu.py tests/redteam_gpu
  }
  lane_b() {
    export CUDA_VISIBLE_DEVICES=$LAST
    step expert_gpu   470 python3 benchmarks/expert_gpu.py --out "$STEP_DIR" --budget-s 400
  }
  lane_a & lane_b & wait
  TAILS="repeatability:8 expert_gpu:30"
elif [ "$PART" = 8 ]; then
  lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    step gpu_timing    90 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_timing_gpu.py
    step gpu_suites   260 python3 -m pytest -q -rA -p no:cacheprovider -n 6 tests/gpu/test_cuda_gpu.py tests/redteam_gpu
  }
  lane_b() {
    export CUDA_VISIBLE_DEVICES=$LAST
    step inductor_gpu  90 python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/test_inductor.py
    step repeatability_busy 120 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability_busy.json" \
        --sizes-mib 32,128,2048 --repeats 8 --variants default,launch_timed
    # one worker, nothing else on this GPU: what one verdict costs stage by stage, uncontended
    [ -d .kb ] && step kb_profile 150 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
        --problems 19_ReLU --dim-scale 0.015625 --threads 256,1024 --workers 1 --ours-configs kb_scope \
        --out "$OUT/kb_profile.json"
  }
  lane_a & lane_b & wait
  unset CUDA_VISIBLE_DEVICES
  [ -z "${SKIP_POOL:-}" ] && step pool 230 python3 benchmarks/pool_scaling.py --out "$OUT" --tasks 96 --warm 4 \
      --workers-per-gpu 8
  TAILS="gpu_timing:8 gpu_suites:40 inductor_gpu:6 repeatability_busy:8 kb_profile:12 pool:6"
elif [ "$PART" = 10 ]; then  # compare_on_device: its GPU tests and the suites (GPU 0); KernelBench vs ours (last GPU)
  lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    step on_device_gpu 150 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_compare_on_device_gpu.py
    step gpu_suites   300 python3 -m pytest -q -rA -p no:cacheprovider -n 6 tests/gpu/test_cuda_gpu.py tests/redteam_gpu
  }
  lane_b() {
    export CUDA_VISIBLE_DEVICES=$LAST
    [ -d .kb ] && step kernelbench 440 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
        --dim-scale 0.015625 --threads 256,512,1024 --workers 8 \
        --ours-configs "${KB_CONFIGS:-kb_scope,kb_scope@host,memcheck,kb_equivalent}" \
        --out "$OUT/kernelbench_vs_ours.json"
  }
  lane_a & lane_b & wait
  TAILS="on_device_gpu:30 gpu_suites:40 kernelbench:30"
elif [ "$PART" = 11 ]; then  # what a compute-sanitizer verdict costs: start-up or checking
  export CUDA_VISIBLE_DEVICES=0
  step sanitizer_cost 200 python3 -m benchmarks.sanitizer_cost --repeats 2 --parallel 8 --out "$OUT/sanitizer_cost.json"
  TAILS="sanitizer_cost:8"
elif [ "$PART" = 12 ]; then  # inputs digested on the GPU: its tests and red-team cases, then KernelBench vs ours alone
  export CUDA_VISIBLE_DEVICES=0
  step on_device_gpu 100 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_compare_on_device_gpu.py
  step redteam_inputs 100 python3 -m pytest -q -rA -p no:cacheprovider -n 4 tests/redteam_gpu/test_redteam_on_gpu.py \
      -k "input_mutation or rng_tamper or honest_vector_add or honest_softmax or partial_write"
  [ -d .kb ] && step kernelbench 200 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
      --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --ours-configs "${KB_CONFIGS:-kb_scope,kb_scope@host}" \
      --out "$OUT/kernelbench_vs_ours.json"
  TAILS="on_device_gpu:12 redteam_inputs:8 kernelbench:8"
elif [ "$PART" = 13 ]; then  # a timed stage that stops once its median settles: repeatability, then throughput
  export CUDA_VISIBLE_DEVICES=0
  step repeatability 150 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability_settle.json" \
      --sizes-mib 32,128,2048 --repeats 8 --variants default,settle
  [ -d .kb ] && step kernelbench 200 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
      --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --ours-configs kb_scope --settle-rel 0.002 \
      --out "$OUT/kernelbench_vs_ours_settle.json"
  TAILS="repeatability:8 kernelbench:8"
elif [ "$PART" = 14 ]; then  # the timed stage times only the candidate; shorter policies; then throughput alone
  lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    step gpu_suites   300 python3 -m pytest -q -rA -p no:cacheprovider -n 6 tests/gpu/test_cuda_gpu.py tests/redteam_gpu
  }
  lane_b() {
    export CUDA_VISIBLE_DEVICES=$LAST
    step gpu_timing    90 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_timing_gpu.py
    step repeatability_busy 150 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability_busy.json" \
        --sizes-mib 32,128,2048 --repeats 8 --variants default,settle,settle_warm5,settle_warm5_5pm
  }
  lane_a & lane_b & wait
  export CUDA_VISIBLE_DEVICES=0
  [ -d .kb ] && step kernelbench 240 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
      --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --rounds "${ROUNDS:-2}" \
      --ours-configs "${KB_CONFIGS:-kb_scope,kb_scope@planned,kb_scope@percandidate@planned}" \
      --out "$OUT/kernelbench_vs_ours.json"
  TAILS="gpu_suites:40 gpu_timing:8 repeatability_busy:14 kernelbench:10"
elif [ "$PART" = 15 ]; then  # new timer default vs planned runs, throughput, then the suites
  export CUDA_VISIBLE_DEVICES=0
  step repeatability 100 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability.json" \
      --sizes-mib 32,128,2048 --repeats 8 --variants default,planned
  [ -d .kb ] && step kernelbench 230 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
      --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --rounds "${ROUNDS:-3}" \
      --ours-configs "${KB_CONFIGS:-kb_scope,kb_scope@percandidate@planned}" \
      --out "$OUT/kernelbench_vs_ours.json"
  lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    step gpu_suites   250 python3 -m pytest -q -rA -p no:cacheprovider -n 6 tests/gpu/test_cuda_gpu.py tests/redteam_gpu
  }
  lane_b() {
    export CUDA_VISIBLE_DEVICES=$LAST
    step gpu_timing    90 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_timing_gpu.py
  }
  lane_a & lane_b & wait
  TAILS="repeatability:10 kernelbench:8 gpu_suites:40 gpu_timing:8"
elif [ "$PART" = 16 ]; then  # scaling without and with the sanitizer, throughput; each alone on the host
  step pool_none 150 python3 benchmarks/pool_scaling.py --out "$OUT/pool_none" --tasks 96 --warm 8 \
      --workers-per-gpu 8 --sanitizers none
  export CUDA_VISIBLE_DEVICES=0
  [ -d .kb ] && step kernelbench 180 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
      --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --rounds "${ROUNDS:-3}" \
      --ours-configs "${KB_CONFIGS:-kb_scope,memcheck}" --out "$OUT/kernelbench_vs_ours.json"
  unset CUDA_VISIBLE_DEVICES
  step pool_memcheck 230 python3 benchmarks/pool_scaling.py --out "$OUT/pool_memcheck" --tasks 64 --warm 8 \
      --workers-per-gpu 8 --sanitizers memcheck
  TAILS="pool_none:5 kernelbench:8 pool_memcheck:5"
elif [ "$PART" = 17 ]; then  # cheaper timed runs: repeatability quiet and busy, then throughput alone
  export CUDA_VISIBLE_DEVICES=0
  step repeatability 120 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability.json" \
      --sizes-mib 32,128,2048 --repeats 8 --variants default,margin1.3,flush2xL2
  lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    step gpu_suites   280 python3 -m pytest -q -rA -p no:cacheprovider -n 6 tests/gpu/test_cuda_gpu.py tests/redteam_gpu
  }
  lane_b() {
    export CUDA_VISIBLE_DEVICES=$LAST
    step repeatability_busy 150 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability_busy.json" \
        --sizes-mib 32,128,2048 --repeats 8 --variants default,margin1.3,flush2xL2
  }
  lane_a & lane_b & wait
  export CUDA_VISIBLE_DEVICES=0
  [ -d .kb ] && step kernelbench 170 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
      --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --rounds "${ROUNDS:-3}" \
      --ours-configs "${KB_CONFIGS:-kb_scope,kb_scope@lean}" --out "$OUT/kernelbench_vs_ours.json"
  TAILS="repeatability:8 gpu_suites:6 repeatability_busy:8 kernelbench:8"
elif [ "$PART" = 18 ]; then  # throughput levers, then the timer's repeatability with them; each alone
  export CUDA_VISIBLE_DEVICES=0
  [ -d .kb ] && step kernelbench 330 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
      --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --rounds "${ROUNDS:-3}" \
      --ours-configs "${KB_CONFIGS:-kb_scope@lean,kb_scope@lean@w12,kb_scope@lean@w16,kb_scope}" \
      --out "$OUT/kernelbench_vs_ours.json"
  step repeatability 160 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability.json" \
      --sizes-mib 32,128,2048 --repeats 8 --variants default,lean,margin1.3,flush2xL2
  TAILS="kernelbench:12 repeatability:14"
elif [ "$PART" = 19 ]; then  # the new timer default on the suites, busy and alone
  lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    step gpu_suites   280 python3 -m pytest -q -rA -p no:cacheprovider -n 6 tests/gpu/test_cuda_gpu.py tests/redteam_gpu
  }
  lane_b() {
    export CUDA_VISIBLE_DEVICES=$LAST
    step gpu_timing    90 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_timing_gpu.py
    step repeatability_busy 160 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability_busy.json" \
        --sizes-mib 32,128,2048 --repeats 8 --variants default,previous
  }
  lane_a & lane_b & wait
  export CUDA_VISIBLE_DEVICES=0
  [ -d .kb ] && step kernelbench 200 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
      --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --rounds "${ROUNDS:-3}" \
      --ours-configs "${KB_CONFIGS:-kb_scope,kb_scope@previous}" --out "$OUT/kernelbench_vs_ours.json"
  TAILS="gpu_suites:6 gpu_timing:8 repeatability_busy:10 kernelbench:8"
elif [ "$PART" = 20 ]; then  # the new timer default alone on the host: repeatability, then throughput
  export CUDA_VISIBLE_DEVICES=0
  step repeatability 120 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability.json" \
      --sizes-mib 32,128,2048 --repeats 8 --variants default,previous
  [ -d .kb ] && step kernelbench 240 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
      --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --rounds "${ROUNDS:-3}" \
      --ours-configs "${KB_CONFIGS:-kb_scope,memcheck}" --out "$OUT/kernelbench_vs_ours.json"
  TAILS="repeatability:10 kernelbench:8"
elif [ "$PART" = 21 ]; then  # throughput alone, then the suites
  export CUDA_VISIBLE_DEVICES=0
  [ -d .kb ] && step kernelbench 200 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
      --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --rounds "${ROUNDS:-3}" \
      --ours-configs "${KB_CONFIGS:-kb_scope,memcheck}" --out "$OUT/kernelbench_vs_ours.json"
  lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    step gpu_suites   330 python3 -m pytest -q -rA -p no:cacheprovider -n 6 tests/gpu/test_cuda_gpu.py tests/redteam_gpu
  }
  lane_b() {
    export CUDA_VISIBLE_DEVICES=$LAST
    step gpu_timing    90 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_timing_gpu.py
  }
  lane_a & lane_b & wait
  TAILS="kernelbench:10 gpu_suites:40 gpu_timing:8"
elif [ "$PART" = 9 ]; then  # 1-vs-2-GPU scaling alone, with time for both runs of 96 tasks
  step pool 540 python3 benchmarks/pool_scaling.py --out "$OUT" --tasks 96 --warm 4 --workers-per-gpu 8
  TAILS="pool:8"
elif [ "$PART" = 6 ]; then
  export CUDA_VISIBLE_DEVICES=0
  [ -d .kb ] && step kernelbench 330 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
      --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --ours-configs "${KB_CONFIGS:-kb_equivalent,kb_scope,memcheck}" \
      --out "$OUT/kernelbench_vs_ours.json"
  unset CUDA_VISIBLE_DEVICES
  [ -z "${SKIP_POOL:-}" ] && step pool 240 python3 benchmarks/pool_scaling.py --out "$OUT" --tasks 64 --warm 4 \
      --workers-per-gpu 8
  TAILS="kernelbench:22 pool:12"
elif [ "$PART" = 7 ]; then
  lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    step gpu_timing    90 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_timing_gpu.py
    step repeatability 90 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability.json" \
        --sizes-mib 32,128,2048 --repeats 8 --variants default,launch_timed
    step gpu_suites   300 python3 -m pytest -q -rA -p no:cacheprovider -n 6 tests/gpu/test_cuda_gpu.py tests/redteam_gpu
  }
  lane_b() {
    export CUDA_VISIBLE_DEVICES=$LAST
    step inductor_gpu  90 python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/test_inductor.py
    step expert_gpu   400 python3 benchmarks/expert_gpu.py --out "$STEP_DIR" --budget-s 380
  }
  lane_a & lane_b & wait
  TAILS="gpu_timing:8 repeatability:8 gpu_suites:45 inductor_gpu:6 expert_gpu:14"
elif [ "$PART" = 5 ]; then
  export CUDA_VISIBLE_DEVICES=0  # alone on the host: nothing else runs while the timer is compared
  step repeatability 150 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability.json" \
      --sizes-mib 32,128,2048 --repeats 8 --variants default,filler,filler_warm200
  lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    [ -d .kb ] && step kernelbench 330 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
        --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --ours-configs kb_scope,memcheck \
        --out "$OUT/kernelbench_vs_ours.json"
  }
  lane_b() {
    export CUDA_VISIBLE_DEVICES=$LAST
    step gpu_timing    90 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_timing_gpu.py
    step inductor_gpu 150 python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/test_inductor.py
    step expert_fusion 90 python3 benchmarks/expert_gpu.py --out "$STEP_DIR" --families fusion
  }
  lane_a & lane_b & wait
  TAILS="repeatability:14 kernelbench:20 gpu_timing:12 inductor_gpu:10 expert_fusion:12"
elif [ "$PART" = 4 ]; then  # what the 2026-11-29 session left to re-measure, in one call
  lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    step repeatability  60 python3 -m benchmarks.timing_repeatability --out "$OUT/repeatability.json"
    [ -d .kb ] && step kernelbench 380 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
        --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --out "$OUT/kernelbench_vs_ours.json"
  }
  lane_b() {
    export CUDA_VISIBLE_DEVICES=$LAST
    step inductor_gpu 150 python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/test_inductor.py
    step expert_fusion 90 python3 benchmarks/expert_gpu.py --out "$STEP_DIR" --families fusion
  }
  lane_a & lane_b & wait
  TAILS="repeatability:8 kernelbench:30 inductor_gpu:10 expert_fusion:12"
elif [ "$PART" = 3 ]; then  # a short call: why the verifier rejects expert candidates on the GPU; expert re-run
  lane_a() {
    export CUDA_VISIBLE_DEVICES=0
    step pool_reasons 110 python3 benchmarks/pool_scaling.py --out "$STEP_DIR" --tasks 16 --warm 0 --shards 1 \
        --workers-per-gpu 8
  }
  lane_b() {
    export CUDA_VISIBLE_DEVICES=$LAST
    step expert_fusion 80 python3 benchmarks/expert_gpu.py --out "$STEP_DIR" --families fusion,pool
    step reuse_demo    30 python3 -m pytest -q -p no:cacheprovider tests/redteam_gpu/test_gpu_hacks.py -k "reuse_trick"
  }
  lane_a & lane_b & wait
  TAILS="pool_reasons:40 expert_fusion:14"
else
  export CUDA_VISIBLE_DEVICES=0
  step repeatability  60 python3 -m benchmarks.timing_repeatability --out "$STEP_DIR/repeatability.json"
  [ -d .kb ] && step kernelbench 200 python3 -m benchmarks.kernelbench_vs_ours --kernelbench .kb \
      --dim-scale 0.015625 --threads 256,512,1024 --workers 8 --out "$STEP_DIR/kernelbench_vs_ours.json"
  unset CUDA_VISIBLE_DEVICES
  step pool         220 python3 benchmarks/pool_scaling.py --out "$OUT" --tasks 32 --warm 2 --workers-per-gpu 8
  step multigpu_grpo 240 env OUT="$STEP_DIR/grpo" STEPS=4 DISTILL_STEPS=20 bash scripts/multigpu_grpo.sh
  TAILS="repeatability:6 kernelbench:40 pool:30 multigpu_grpo:12"
fi

cp "$STEP_DIR"/*.json "$OUT"/ 2>/dev/null
tar czf "$OUT/steps$PART.tgz" --exclude=models --exclude=checkpoints -C "$STEP_DIR" . 2>/dev/null
{
  for t in $TAILS; do echo; echo "== ${t%%:*} (tail)"; tail -n "${t##*:}" "$STEP_DIR/${t%%:*}.log" 2>/dev/null; done
  echo; echo "== summary (part $PART)"; cat "$STEP_DIR/rows.txt" 2>/dev/null
} | tee -a "$LOG"
