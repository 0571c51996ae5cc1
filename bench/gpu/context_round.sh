#!/usr/bin/env bash
# Device memory outside PyTorch's caching allocator (the CUDA context, loaded kernels, NCCL's
# buffers): nvml_used − reserved of rank 0 after a step, for the torch engines and DeepSpeed,
# at Nd 1 on the host's second GPU (CUDA_VISIBLE_DEVICES=1: its rank is cuda:0, NVML's GPU 1)
# and at Nd 2 on GPUs 0,1. One `python -m measure` process per job, one job at a time; the
# jobs' arguments and results are packed into $OUT/context.json (bench/gpu/pack_jobs.py), which
# python -m bench.accuracy also predicts again (bench/results/context/).
#
#   OUT=/tmp/ctx bash bench/gpu/context_round.sh
#   python3 bench/context_reserve.py /tmp/ctx/context.json
set -u
out=${OUT:-$PWD/context-results}/context
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DS_ACCELERATOR=cuda DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=/tmp/tx
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
common=(--hf-config bench/hf_configs/qwen3-0.6b.json --mode distributed --micro-batch-size 1
    --seq-len 512 --warmup-steps 1 --steps 1 --no-host-probe)
run() {  # NAME GPUS ND ENGINE-ARGS...
    local name=$1 gpus=$2 nd=$3
    shift 3
    local args=("${common[@]}" --dp "$nd" "$@")
    printf '%s\n' "${args[@]}" >"$out/$name.args"
    CUDA_VISIBLE_DEVICES=$gpus timeout 150 python3 -m torch.distributed.run --nproc-per-node "$nd" \
        --master-port $((29700 + RANDOM % 200)) -m measure "${args[@]}" \
        >"$out/$name.json" 2>"$out/$name.log"
    echo "$name: exit $?"
}
run torch_nd1_gpu1 1 1 --engine torch --stages 0,3
run deepspeed_nd1_gpu1 1 1 --engine deepspeed --stages 2 \
    --engine-config bench/ds_configs/trainer_auto_zero2.json
run torch_nd2 0,1 2 --engine torch --stages 0,3
run deepspeed_nd2 0,1 2 --engine deepspeed --stages 2 \
    --engine-config bench/ds_configs/trainer_auto_zero2.json
nvidia-smi --query-gpu=index,uuid,memory.used --format=csv,noheader >"$out/nvidia_smi_after.txt"
python3 bench/gpu/pack_jobs.py "$out" "$out/../context.json"
python3 -c "import pynvml" 2>/dev/null && echo "pynvml: yes" || echo "pynvml: no (nvidia-smi read)"
