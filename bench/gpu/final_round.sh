#!/usr/bin/env bash
# One device call on a 4-GPU host: the planner's candidates timed alone (Nd 1, 2, 4 on the 1B
# GPT, Nd 1 on a 1B Llama-style model), then memory-only checks side by side (FSDP2 stage 3 in
# simulated worlds, a transformers Trainer ds_config through measure, deepseek_v3 and the
# families' remaining gaps). Results land in $OUT (or ./final-results).
#
#   bash bench/gpu/final_round.sh
set -u
out=${OUT:-$PWD/final-results}
mkdir -p "$out/plan"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
plan() {  # plan GPUS ARGS...: one validation of the plan's candidates on those GPUs
    local gpus=$1; shift
    CUDA_VISIBLE_DEVICES=$gpus timeout "${PLAN_TIMEOUT_S:-110}" python3 bench/validate_plan.py \
        --micro 1,2,8 --stages 0,3 --steps 3 --out "$out/plan" "$@" >>"$out/plan/run.log" 2>&1
    echo "plan $gpus $*: exit $?"
}
plan 0 --max-runs 5
plan 0,1 --max-runs 5
plan 0,1,2,3 --max-runs 5
plan 0 --max-runs 4 --hf-config bench/hf_configs/llama-1b.json --out "$out/plan_llama"
python3 bench/validate_plan.py --report "$out"/plan/plan_validation_nd*.json \
    "$out"/plan_llama/plan_validation_nd*.json --out "$out/plan" >"$out/plan/report.md" 2>&1
tail -30 "$out/plan/report.md"
CUDA_VISIBLE_DEVICES=1 OUT=$out/fsdp timeout 200 bash bench/gpu/fsdp_sim_peak.sh \
    >"$out/fsdp_sim_peak.txt" 2>&1 &
CUDA_VISIBLE_DEVICES=2,3 OUT=$out/trainer timeout 230 bash bench/gpu/trainer_config_round.sh \
    >"$out/trainer_config.txt" 2>&1 &
OUT=$out BUDGET_S=${BUDGET_S:-120} JOBS="torch 2 0,1 deepseek_v3;deepspeed 2 2,3 deepseek_v3,phi3;\
torch 64s 0 deepseek_v3,gemma3_text;deepspeed 1 1 deepseek_v3" \
    timeout 240 bash bench/gpu/families_round.sh >"$out/families.txt" 2>&1 &
wait
cat "$out/fsdp_sim_peak.txt" "$out/trainer_config.txt" "$out/families.txt"
