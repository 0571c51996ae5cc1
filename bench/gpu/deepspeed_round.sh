#!/usr/bin/env bash
# The DeepSpeed validation through the shipped measure path, on a 4-GPU host, in one call:
# GPUs 0,1 run the main set (Nd 2); GPUs 2,3 the knobs set (Nd 2), then GPU 2 the single set
# (Nd 1) while GPU 3 runs the torch engine on Hugging Face families given in FAMILIES (Nd 1).
# Results land in $OUT (or ./ds-results); `python3 bench/validate_deepspeed.py report FILES`
# compares them with the current model anywhere.
set -u
out=${OUT:-$PWD/ds-results}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DS_ACCELERATOR=cuda DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=/tmp/tx
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
ds() {  # ds DEVICES NPROC PORT SET
    CUDA_VISIBLE_DEVICES=$1 timeout 360 python3 -m torch.distributed.run --nproc_per_node "$2" \
        --master-port "$3" bench/validate_deepspeed.py run --set "$4" \
        --out "$out/deepspeed_$4.json" >"$out/ds_$4.log" 2>&1
    echo "deepspeed $4: exit $?" >>"$out/status.txt"
}
ds 0,1 2 29600 main &
(
    ds 2,3 2 29601 knobs
    ds 2 1 29602 single &
    if [ -n "${FAMILIES:-}" ]; then
        CUDA_VISIBLE_DEVICES=3 timeout 300 python3 -m torch.distributed.run --nproc-per-node 1 \
            --master-port 29603 -m measure.validate_hf --engines torch --families "$FAMILIES" \
            --budget-s "${BUDGET_S:-150}" --out "$out" >"$out/hf_nd1.log" 2>&1
        echo "hf torch nd1: exit $?" >>"$out/status.txt"
    fi
    wait
) &
wait
cat "$out/status.txt"
