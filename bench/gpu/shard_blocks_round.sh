#!/usr/bin/env bash
# FSDP2's sharded parameters as the caching allocator hands them out: Hugging Face models built
# on the GPU, sharded, trained a few steps, each stage in a fresh process (so the allocator has
# cached nothing before the model is built), on a 4-GPU host. Two Nd-2 worlds run side by side
# (GPUs 0,1 and 2,3), then the Nd-4 ones; each run's JSON is what `python -m measure` prints.
# SET=1 runs Qwen2.5-0.5B and SmolLM2-360M, SET=2 Qwen3-0.6B and TinyLlama-1.1B.
#
#   SET=2 bash bench/gpu/shard_blocks_round.sh
#   python3 bench/shard_blocks_report.py bench/results/shard_blocks/*.json
set -u
out=${OUT:-$PWD/shard-blocks-results}/shard_blocks
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD

job() {  # NAME GPUS ND CONFIG STAGE PRECISION PORT
    local name=$1 gpus=$2 nd=$3 config=$4 stage=$5 precision=$6 port=$7
    CUDA_VISIBLE_DEVICES=$gpus timeout "${JOB_TIMEOUT_S:-200}" python3 -m torch.distributed.run \
        --nproc-per-node "$nd" --master-port "$port" -m measure \
        --hf-config "bench/hf_configs/$config.json" --engine torch --dp "$nd" --stages "$stage" \
        --precision "$precision" --mode distributed --micro-batch-size 2 --seq-len 1024 \
        --no-host-probe >"$out/$name.json" 2>"$out/$name.log"
    echo "$name: exit $?" >>"$out/status.txt"
}

if [[ ${SET:-1} == 1 ]]; then
    job qwen2.5-0.5b_nd2_s3_mixed 0,1 2 qwen2.5-0.5b 3 mixed_bf16 29701 &
    job smollm2-360m_nd2_s3_mixed 2,3 2 smollm2-360m 3 mixed_bf16 29702 &
    wait
    job qwen2.5-0.5b_nd2_s2_bf16 0,1 2 qwen2.5-0.5b 2 bf16 29703 &
    job smollm2-360m_nd2_s2_bf16 2,3 2 smollm2-360m 2 bf16 29704 &
    wait
    job smollm2-360m_nd4_s3_bf16 0,1,2,3 4 smollm2-360m 3 bf16 29705
    job qwen2.5-0.5b_nd4_s2_mixed 0,1,2,3 4 qwen2.5-0.5b 2 mixed_bf16 29706
else
    job qwen3-0.6b_nd2_s3_mixed 0,1 2 qwen3-0.6b 3 mixed_bf16 29711 &
    job tinyllama-1.1b_nd2_s2_mixed 2,3 2 tinyllama-1.1b 2 mixed_bf16 29712 &
    wait
    job qwen3-0.6b_nd2_s2_bf16 0,1 2 qwen3-0.6b 2 bf16 29713 &
    job tinyllama-1.1b_nd2_s3_bf16 2,3 2 tinyllama-1.1b 3 bf16 29714 &
    wait
    job qwen3-0.6b_nd4_s3_mixed 0,1,2,3 4 qwen3-0.6b 3 mixed_bf16 29715
    job tinyllama-1.1b_nd4_s3_mixed 0,1,2,3 4 tinyllama-1.1b 3 mixed_bf16 29716
fi
# one file back: every run's JSON in a list, the logs packed apart
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
runs = []
for f in sorted(out.glob("*.json")):
    text = f.read_text().strip()
    runs.append({"name": f.stem, "result": json.loads(text) if text else None})
(out.parent / "shard_blocks.json").write_text(json.dumps(runs, indent=1))
PY
tar -C "$out/.." -czf "$out/../shard_blocks_logs.tar.gz" shard_blocks
cat "$out/status.txt"
