#!/usr/bin/env bash
# One device call of the Hugging Face families validation that packs several worlds onto one
# 4-GPU host at once: each job is its own process group (torchrun) or simulated world, several
# may share a GPU. Memory figures are per process (PyTorch's allocator), so sharing changes only
# the step times, which this round does not validate.
#
#   bash bench/gpu/families_round.sh            # the default job list below
#   JOBS="torch 2 0,1 llama,gemma;deepspeed 1 2 phi3" bash bench/gpu/families_round.sh
#
# A job is "ENGINE ND GPUS FAMILIES [ARGS...]" (ND 8s/64s: a simulated world of 8/64 on the
# first GPU listed; ARGS go to measure.validate_hf as they are, e.g. "--micro-batch-size 1
# --seq-len 2048", and name the job's folder too). SIZE picks the configs
# (measure.hf_families.SIZES, default small). Each job starts no new case after BUDGET_S
# seconds; results land in $OUT/families/job<N>_<job>/hf_*.{json,md} with a log, packed into
# $OUT/families.tar.gz (keep the archive: a remote runner may bring back only a few files).
set -u
budget=${BUDGET_S:-280}
out=${OUT:-$PWD/families-results}/families
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DS_ACCELERATOR=cuda DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=/tmp/tx
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
default_jobs="torch 2 0,1 gemma,gemma3_text,phi3,mixtral,qwen2_moe,qwen3_moe,qwen3"
default_jobs+=";deepspeed 2 2,3 mistral,qwen2,gemma2,phi3,mixtral,qwen2_moe,qwen3,gemma3_text"
default_jobs+=";torch 4 0,1,2,3 mixtral,gemma,phi3,gemma3_text,qwen2_moe"
default_jobs+=";deepspeed 4 0,1,2,3 mistral,gemma2,qwen2_moe,phi3,mixtral"
default_jobs+=";torch 1 0 llama,gemma2,mixtral,phi3,qwen3"
default_jobs+=";deepspeed 1 1 llama,mistral,qwen2_moe,gemma"
default_jobs+=";torch 64s 2 llama,gemma2,mixtral,phi3,qwen2"
default_jobs+=";torch 8s 3 gemma,gemma3_text,phi3,mixtral,qwen2_moe"
port=29600
IFS=';' read -ra jobs <<<"${JOBS:-$default_jobs}"
for k in "${!jobs[@]}"; do
    read -r engine nd gpus families extra <<<"${jobs[$k]}"
    name="job${k}_${engine}_nd${nd}_gpu${gpus//,/}"  # two jobs never share a folder
    [[ -n ${extra:-} ]] && name+="_$(tr -cd 'a-z0-9' <<<"$extra")"
    dir="$out/$name"
    mkdir -p "$dir"
    port=$((port + 1))
    if [[ $nd == *s ]]; then
        cmd=(python3 -m measure.validate_hf --simulated "${nd%s}")
        gpus=${gpus%%,*}
    else
        cmd=(python3 -m torch.distributed.run --nproc-per-node "$nd" --master-port "$port"
            -m measure.validate_hf)
    fi
    (
        CUDA_VISIBLE_DEVICES=$gpus timeout $((budget + 200)) "${cmd[@]}" --engines "$engine" \
            --families "$families" --budget-s "$budget" --size "${SIZE:-small}" --out "$dir" \
            ${extra:-} >"$dir/run.log" 2>&1
        echo "$name: exit $?" >>"$out/status.txt"
    ) &
done
wait
tar -C "$out/.." -czf "${OUT:-$PWD/families-results}/families.tar.gz" families
cat "$out/status.txt"
