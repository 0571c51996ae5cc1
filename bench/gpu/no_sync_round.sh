#!/usr/bin/env bash
# The planner's candidates with DDP deferring its gradient all-reduce to the last micro-step
# (no_sync on the others, as accelerate and the Trainer run accumulation; grad_sync per_step,
# the planner's default), the 1.5B Llama-style model, one run + its host probe calibrating both
# figures. For each GPU set given, candidates timed alone; then one report over all of them.
# Results land in $OUT (or ./no-sync-results).
#
#   bash bench/gpu/no_sync_round.sh 2,3 0,1,2,3     # Nd 2, then Nd 4, on a 4-GPU host
set -u
out=${OUT:-$PWD/no-sync-results}/plan
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
for gpus in "${@:-0,1}"; do
    CUDA_VISIBLE_DEVICES=$gpus timeout "${PLAN_TIMEOUT_S:-200}" python3 bench/validate_plan.py \
        --micro 1,2,8 --stages 0,3 --steps 3 --max-runs 6 --calibration probe \
        --grad-sync per_step --hf-config bench/hf_configs/llama-1b.json \
        --out "$out" >>"$out/run.log" 2>&1
    echo "plan $gpus: exit $?"
done
python3 bench/validate_plan.py --report "$out"/plan_validation_nd*.json --out "$out" \
    >"$out/report.md" 2>&1
tail -40 "$out/report.md"
