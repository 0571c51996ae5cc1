#!/usr/bin/env bash
# A transformers Trainer ds_config.json ("auto" wherever the Trainer fills a value), ZeRO stage 2
# and stage 3, run as written through `python -m measure` on 2 GPUs (DeepSpeed, GPT-2 124M,
# micro-batch 4 x 512, precision and optimizer from the config's "auto" and AdamW sections).
# Prints, per stage, the resident and peak errors and what each "auto" became; the full results
# land in $OUT (or ./trainer-config-results).
#
#   bash bench/gpu/trainer_config_round.sh
set -u
out=${OUT:-$PWD/trainer-config-results}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DS_ACCELERATOR=cuda DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=/tmp/tx
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}
for stage in 2 3; do
    timeout 280 python3 -m measure --preset gpt2 --dp 2 --engine deepspeed --device cuda \
        --engine-config "bench/ds_configs/trainer_auto_zero$stage.json" \
        --micro-batch-size 4 --seq-len 512 --warmup-steps 2 --steps 2 \
        >"$out/trainer_auto_zero$stage.json" 2>"$out/trainer_auto_zero$stage.log"
    echo "stage $stage: exit $?"
    python3 - "$out/trainer_auto_zero$stage.json" <<'PY'
import json
import sys

try:
    result = json.load(open(sys.argv[1]))
except (OSError, ValueError) as err:
    sys.exit(f"  no result: {err}")
for run in result["runs"]:
    m, p, e = run["measured"], run["predicted"], run["relative_error"]
    for key in ("resident", "peak"):
        err = e.get(key)
        shown = "n/a" if err is None else f"{err:+.2%}"
        print(f"  stage {run['stage']} {key:8} measured {m.get(key)} predicted {p.get(key)} "
              f"error {shown}")
    print(f"  engine {run['engine_name']}, skipped steps {m.get('skipped_steps')}")
resolved = result["resolved_config"]
print(f"  resolved: precision {resolved['precision']}, micro-batch {resolved['micro_batch_size']}, "
      f"accumulation {resolved['gradient_accumulation_steps']}, "
      f"train batch {resolved['train_batch_size']}")
for v in resolved["values"]:
    if v["from"].startswith("auto") and v["value"] is not None:
        print(f"    {v['key']} = {v['value']}  ({v['from']})")
PY
done
