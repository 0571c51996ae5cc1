#!/usr/bin/env bash
# DeepSpeed stage 3 under transformers' gradient checkpointing on two GPUs: small family configs
# with knobs that make forward release layers the recomputation gathers again (a live-parameter
# cap below the model and a reuse distance the recomputed trace outruns), trained through
# `python -m measure`, whose result puts the bytes each rank sent beside the prediction.
#
#   bash bench/gpu/recompute_round.sh      # writes $OUT/recompute.json (jobs, results, logs)
set -u
out=$(mktemp -d)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DS_ACCELERATOR=cuda DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=/tmp/tx
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD

# NAME FAMILY CHECKPOINTING PORT ZERO_OPTIMIZATION_KNOBS
job() {
    local name=$1 family=$2 ckpt=$3 port=$4 knobs=$5
    python3 -c "import json, sys; from measure.hf_families import family_config
json.dump(family_config(sys.argv[1], 'small'), open(sys.argv[2], 'w'))" "$family" "$out/$name.config.json"
    python3 -c "import json, sys
zero = {'stage': 3, **json.loads(sys.argv[1])}
json.dump({'zero_optimization': zero, 'bf16': {'enabled': True}}, open(sys.argv[2], 'w'))" \
        "$knobs" "$out/$name.ds.json"
    local args=(--hf-config "$out/$name.config.json" --dp 2 --mode distributed --engine deepspeed
        --engine-config "$out/$name.ds.json" --stages 3 --micro-batch-size 1 --seq-len 512
        --activation-checkpointing "$ckpt" --warmup-steps 2 --steps 2 --no-host-probe)
    CUDA_VISIBLE_DEVICES=0,1 timeout "${JOB_TIMEOUT_S:-150}" python3 -m torch.distributed.run \
        --nproc-per-node 2 --master-port "$port" -m measure "${args[@]}" \
        >"$out/$name.json" 2>"$out/$name.log"
    echo "$name: exit $?" >>"$out/status.txt"
}

live='"stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": 30000000, "stage3_prefetch_bucket_size": 5000000'
job llama_full llama full 29901 "{$live, \"stage3_max_reuse_distance\": 200000000}"
job llama_none llama none 29902 "{$live, \"stage3_max_reuse_distance\": 200000000}"
job qwen2_full qwen2 full 29903 "{$live, \"stage3_max_reuse_distance\": 100000000}"
job mixtral_full mixtral full 29904 '{"stage3_param_persistence_threshold": 100, "stage3_max_live_parameters": 60000000, "stage3_prefetch_bucket_size": 10000000, "stage3_max_reuse_distance": 0}'

mkdir -p "${OUT:-$PWD}"
python3 - "$out" "${OUT:-$PWD}" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
runs = {}
for f in sorted(out.glob("*.ds.json")):
    name = f.name[: -len(".ds.json")]
    text = (out / f"{name}.json").read_text().strip() if (out / f"{name}.json").exists() else ""
    try:
        result = json.loads(text) if text else None
    except ValueError:
        result = None
    runs[name] = {"engine_config": json.loads(f.read_text()), "result": result,
                  "log_tail": (out / f"{name}.log").read_text()[-3000:]}
pathlib.Path(sys.argv[2], "recompute.json").write_text(json.dumps(runs, indent=1))
PY
cat "$out/status.txt"
