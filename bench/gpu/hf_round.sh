#!/usr/bin/env bash
# One device call of the Hugging Face families validation on a 4-GPU host, for one engine:
# phase 1 runs Nd 2 (GPUs 0,1), Nd 1 (GPU 2) and, for torch, the simulated worlds (GPU 3) side
# by side; phase 2 runs Nd 4 over all four GPUs. Results (hf_*.json / hf_*.md and logs) land in
# $OUT/hf (or ./hf-results) and are packed into one archive for the trip back.
#
#   bash bench/gpu/hf_round.sh torch      # or: deepspeed
#
# FAMILIES_ND1 / FAMILIES_ND2 / FAMILIES_ND4 pick the families of each world (default: all, in
# order, until BUDGET_S runs out). Needs DeepSpeed importable for the deepspeed engine (see docs/VALIDATION.md: wheels in .whl).
set -u
engine=${1:?engine: torch or deepspeed}
budget=${BUDGET_S:-200}
out=${OUT:-$PWD/hf-results}/hf
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DS_ACCELERATOR=cuda DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=/tmp/tx
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
run() {  # run LOG CUDA_DEVICES ARGS...: one validation process set, its output in LOG
    local log=$1 devices=$2; shift 2
    CUDA_VISIBLE_DEVICES=$devices timeout $((budget + 150)) "$@" --engines "$engine" \
        --budget-s "$budget" --out "$out" >"$out/$log.log" 2>&1
    echo "$log: exit $?" >>"$out/status.txt"
}
all=llama,mistral,qwen2,qwen3,gemma,gemma2,gemma3_text,phi3,mixtral,qwen2_moe
run nd2 0,1 python3 -m torch.distributed.run --nproc-per-node 2 --master-port 29512 \
    -m measure.validate_hf --families "${FAMILIES_ND2:-$all}" &
run nd1 2 python3 -m torch.distributed.run --nproc-per-node 1 --master-port 29513 \
    -m measure.validate_hf --families "${FAMILIES_ND1:-$all}" &
if [ "$engine" = torch ]; then
    (
        run simulated 3 python3 -m measure.validate_hf --simulated 8,64
        # transformers' saved activations on the GPU against the formula, every regime
        for f in bench/hf_configs/*-small.json bench/hf_configs/llama-1b.json; do
            CUDA_VISIBLE_DEVICES=3 timeout 120 python3 -m measure.trace "$f" --batch 2 --seq 2048 --gpu
        done >"$out/trace_gpu.log" 2>&1
    ) &
fi
wait
run nd4 0,1,2,3 python3 -m torch.distributed.run --nproc-per-node 4 --master-port 29514 \
    -m measure.validate_hf --families "${FAMILIES_ND4:-$all}"
tar -C "$out/.." -czf "${OUT:-$PWD/hf-results}/hf-$engine.tar.gz" hf
cat "$out/status.txt"
