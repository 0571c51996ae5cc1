#!/usr/bin/env bash
# The planner calibrated from one run with its host probe: for each GPU set given, the
# planner's candidates timed alone (1B GPT, 8 × 1024 tokens per GPU, up to six candidates,
# 3 timed steps each), every run with the measure runner's host probe; the JSON is rewritten
# after each run, so the time limit (PLAN_TIMEOUT_S, 110 s per GPU set) keeps the runs done.
# Then one report over all of them. Results land in $OUT (or ./probe-results).
#
#   bash bench/gpu/probe_round.sh 0                # one GPU
#   bash bench/gpu/probe_round.sh 0,1 0,1,2,3      # Nd 2 and 4 on a 4-GPU host
#
# PLAN_ARGS adds bench/validate_plan.py options, e.g. the 1.5B Llama-style model with DDP
# deferring its all-reduce to the last micro-step (no_sync, the planner's default):
#   PLAN_ARGS="--grad-sync per_step --hf-config bench/hf_configs/llama-1b.json" \
#       PLAN_TIMEOUT_S=260 bash bench/gpu/probe_round.sh 2,3 0,1,2,3
set -u
out=${OUT:-$PWD/probe-results}
mkdir -p "$out/plan"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
for gpus in "${@:-0}"; do
    CUDA_VISIBLE_DEVICES=$gpus timeout "${PLAN_TIMEOUT_S:-110}" python3 bench/validate_plan.py \
        --micro 1,2,8 --stages 0,3 --steps 3 --max-runs 6 --calibration probe ${PLAN_ARGS:-} \
        --out "$out/plan" >>"$out/plan/run.log" 2>&1
    echo "plan $gpus: exit $?"
done
python3 bench/validate_plan.py --report "$out"/plan/plan_validation_nd*.json --out "$out/plan" \
    >"$out/plan/report.md" 2>&1
tail -60 "$out/plan/report.md"
