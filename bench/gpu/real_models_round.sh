#!/usr/bin/env bash
# Real Hugging Face models (bench/hf_configs: Qwen2.5-0.5B, SmolLM2-360M, Qwen3-0.6B,
# TinyLlama-1.1B) trained as users train them: DeepSpeed with transformers' Trainer configs
# (bench/ds_configs, "auto" wherever the Trainer fills a value) and torch DDP /
# ZeroRedundancyOptimizer, at batch shapes and checkpointing other than the family tables', on a
# 4-GPU host: two Nd-2 lanes side by side (GPUs 0,1 and 2,3), then Nd 4 on all four while time
# is left. Each job is one `python -m measure` process; its arguments are kept beside its result.
# SET=2 adds Gemma-2-2B (sliding windows the sequence reaches, soft-capping, a 256k vocabulary),
# FSDP2 with checkpointing, gradient accumulation and a 4,096-token sequence; SET=3 Gemma-3-1B
# (one key/value head, 512-token windows over 22 of its 26 layers). SET=4 and SET=5 run
# Phi-4-mini (3.8B: LongRoPE, which switches to its long factors past 4,096 positions; a partial
# rotary of 0.75; a tied 200,064-token vocabulary) at Nd 2 on GPUs 0,1 (a 2-GPU host): FSDP2, then
# DeepSpeed. SET=6 and SET=7 run 7-12B models at Nd 4 on all four GPUs: Llama-3.1-8B, Qwen2.5-7B,
# Gemma-2-9B (4,096-token windows the sequence reaches, a 256,000-token tied vocabulary) and
# Mistral-Nemo-12B (128-wide heads over a 5,120-wide model). SET=8 runs a real-size mixture of
# experts at Nd 4: Qwen1.5-MoE-A2.7B (14.3B: 24 layers of 60 routed experts, four per token, and
# a gated shared expert) under FSDP2 stage 3, DeepSpeed stage 3 and FSDP2 stage 2
# (JOB_TIMEOUT_S=280 BUDGET_S=330: building it takes longer). SET=9 runs Llama-3.2-3B (a tied
# 128,256-token vocabulary) and Gemma-3-4B's text model (five sliding layers to each global one,
# a tied 262,208-token vocabulary) at Nd 4: FSDP2 without checkpointing at 8,192 tokens, and
# DeepSpeed stages 2 and 3 and FSDP2 stage 2 with it. SET=10 runs DeepSpeed with the CPU optimizer
# offload of transformers' sample ZeRO-2/3 configs (bench/ds_configs/*_offload.json) at Nd 2 on
# GPUs 0,1: Qwen2.5-0.5B, TinyLlama-1.1B, Qwen3-0.6B, SmolLM2-360M and Gemma-3-1B. SET=11 runs
# the torch engines in pure bf16 (bf16 parameters, gradients and Adam states, no fp32 master) at
# Nd 2 on GPUs 0,1: Qwen3-0.6B, Llama-3.2-3B, Gemma-3-1B, SmolLM2-360M and TinyLlama-1.1B.
# SET=12 runs transformers' sample ZeRO-3 config as written, optimizer and parameters offloaded
# to the CPU (bench/ds_configs/trainer_auto_zero3_offload_all.json), at Nd 2 on GPUs 0,1.
# SET=13 trains on padded batches (an attention_mask with zeros: the last sequence padded from
# its middle, as a padding collator pads a shorter one) at Nd 2 on GPUs 0,1: FSDP2, DDP and
# DeepSpeed over Llama-3.2-3B, Qwen2.5-0.5B, TinyLlama-1.1B, Gemma-3-1B, Qwen3-0.6B (a
# 1,000-token sequence) and SmolLM2-360M. SET=14 does the same for Phi-4-mini (a partial rotary
# built with torch.cat: cuDNN attention's output follows q's layout, so it is copied for
# o_proj) and Gemma-2-2B (4,096-token windows, so a padded batch builds a full and a
# sliding-window mask) at Nd 2 on GPUs 0,1. SET=15 runs Llama-3.1-8B on padded batches at Nd 4:
# FSDP2 stage 3 without checkpointing, DeepSpeed stage 3 at 8,192 tokens with it. SET=16 trains
# in fp32 on padded 1,000-token batches (the memory-efficient kernel with grouped-query heads
# expanded) at Nd 2 on GPUs 0,1: Qwen3-0.6B and SmolLM2-360M under the torch engines. SET=17
# runs SET=12's config (optimizer and parameters offloaded) on other models and batch shapes at
# Nd 2 on GPUs 0,1: SmolLM2-360M, Gemma-3-1B, TinyLlama-1.1B and Qwen3-0.6B. SET=18 runs
# SmolLM3-3B's shape (every fourth of its 36 layers without rotary embeddings, a tied
# 128,256-token vocabulary) at Nd 2 on GPUs 0,1: DDP and ZeroRedundancyOptimizer under autocast,
# DeepSpeed stages 3 and 2, FSDP2 stages 2 and 3, and FSDP2 stage 3 on padded batches. SET=19
# runs it at Nd 4 on all four GPUs: FSDP2 stage 3 at 2 × 4,096 tokens, DeepSpeed stage 3 at one
# 8,192-token sequence with checkpointing, FSDP2 stage 2 with checkpointing and two micro-steps.
# SET=20 runs DeepSpeed stage 2 with the Trainer's config but 5e8-element buckets written in
# (bench/ds_configs/zero2_5e8_buckets.json, as many hand-written configs have them) at Nd 4:
# SmolLM3-3B's shape and Llama-3.2-3B with checkpointing, so buckets are reduced mid-backward.
# SET=21 runs two shapes no earlier set ran, at Nd 4: Gemma-7B (16 heads of 256, no key/value
# grouping, a 256,000-token vocabulary) under FSDP2 stage 3 with checkpointing and DeepSpeed
# stage 3 without, and Phi-3-mini (fused qkv and gate/up projections) under FSDP2 stage 2
# without checkpointing and DeepSpeed stage 2 with it. SET=22 runs Qwen3-30B-A3B (48 layers of
# 128 experts, eight per token) under FSDP2 stage 3 in pure bf16 with checkpointing at Nd 4
# (JOB_TIMEOUT_S=420: its fp32 build takes most of a GPU before it is cast and sharded).
# SET=23 runs the same three shapes otherwise at Nd 4: Phi-3-mini under DDP and
# ZeroRedundancyOptimizer at 4,096 tokens, Gemma-7B under FSDP2 stage 2 with checkpointing, and
# Qwen3-30B-A3B under FSDP2 stage 3 in pure bf16 at 4,096 tokens without checkpointing.
# SET=24 runs DeepSpeed stage 2 (the Trainer's config) at Nd 4 on a real-size mixture of experts,
# Qwen1.5-MoE-A2.7B, and on Gemma-7B, both with checkpointing. SET=25 runs again, at Nd 2 on
# GPUs 0,1, the four real-model runs whose peak read more than 1 % low when they ran before the
# requested peak was measured (SmolLM2-360M under DDP and ZeroRedundancyOptimizer, Qwen2.5-0.5B
# under DeepSpeed with the optimizer, and with everything, offloaded), so the requested peak
# tells a missing tensor from the allocator's blocks. SET=26 runs transformers' checkpoint offload
# (gradient_checkpointing_enable(offload=True)) on real models at long sequences, Nd 2 on GPUs
# 0,1: Llama-3.1-8B under FSDP2 stage 3, Qwen2.5-7B under DeepSpeed stage 3 and SmolLM3-3B under
# DDP and ZeroRedundancyOptimizer, one 8,192-token sequence each. SET=27 runs eager attention
# at one sequence on one GPU (Nd 1, GPU 0), where no key/value cache means attention keeps views
# of v: Phi-3-mini (32 key/value heads, v a view of the fused qkv output, kept whole) and
# Gemma-3-1B (one key/value head, v the projection's own bf16 output), DDP and FSDP2 stage 3
# with checkpointing, and with every second layer checkpointed (every_n_layers 2). SET=28 runs
# Qwen3-0.6B on one GPU (Nd 1, GPU 0) where SDPA takes its math path (fp32, grouped key/value
# heads, no padding) and with attention dropout (attention_dropout 0.1: flash, cuDNN and the
# math path with dropout), DDP and FSDP2. SET=29 runs, on one GPU, Gemma-3-1B with its logits
# soft-capped (final_logit_softcapping 30, which Gemma-3's own config leaves null) and
# TinyLlama-1.1B with a ReLU MLP, DDP and FSDP2.
#
#   bash bench/gpu/real_models_round.sh        # SET=1
#   SET=2 bash bench/gpu/real_models_round.sh
#   python3 bench/real_models_report.py bench/results/real_models/*.json
set -u
out=${OUT:-$PWD/real-models-results}/real_models
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DS_ACCELERATOR=cuda DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=/tmp/tx
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
budget=${BUDGET_S:-520}
start=$SECONDS

# NAME GPUS ND PORT CONFIG ENGINE(ds2|ds3|ds2off|ds3off|ds3offall|ds2big|torch:STAGES) MICRO SEQ CHECKPOINTING
# [ACCUMULATION [PRECISION [padded|- [offload]]]] (offload: transformers' checkpoint offload)
job() {
    local name=$1 gpus=$2 nd=$3 port=$4 config=$5 engine=$6 micro=$7 seq=$8 ckpt=$9
    local accumulation=${10:-1} precision=${11:-mixed_bf16} padded=${12:-} offload=${13:-}
    local every=${14:-}
    if ((SECONDS - start > budget)); then
        echo "$name: skipped (budget)" >>"$out/status.txt"
        return
    fi
    local args=(--hf-config "bench/hf_configs/$config.json" --dp "$nd" --mode distributed
        --micro-batch-size "$micro" --seq-len "$seq" --activation-checkpointing "$ckpt"
        --grad-accumulation-steps "$accumulation" --precision "$precision"
        --warmup-steps 2 --steps 2 --no-host-probe)
    [[ $padded == padded ]] && args+=(--padded)
    [[ $offload == offload ]] && args+=(--checkpoint-offload)
    [[ -n $every ]] && args+=(--checkpoint-every-n-layers "$every")
    case $engine in
    ds2 | ds3) args+=(--engine deepspeed --engine-config "bench/ds_configs/trainer_auto_zero${engine#ds}.json") ;;
    ds3offall) args+=(--engine deepspeed --engine-config "bench/ds_configs/trainer_auto_zero3_offload_all.json") ;;
    ds2big) args+=(--engine deepspeed --engine-config "bench/ds_configs/zero2_5e8_buckets.json") ;;
    ds2off | ds3off)
        engine=${engine%off}
        args+=(--engine deepspeed --engine-config "bench/ds_configs/trainer_auto_zero${engine#ds}_offload.json")
        ;;
    torch:*) args+=(--engine torch --stages "${engine#torch:}") ;;
    esac
    printf '%s\n' "${args[@]}" >"$out/$name.args"
    CUDA_VISIBLE_DEVICES=$gpus timeout "${JOB_TIMEOUT_S:-170}" python3 -m torch.distributed.run \
        --nproc-per-node "$nd" --master-port "$port" -m measure "${args[@]}" \
        >"$out/$name.json" 2>"$out/$name.log"
    echo "$name: exit $? after $((SECONDS - start)) s" >>"$out/status.txt"
}

if [[ ${SET:-1} == 1 ]]; then
    lane_a() {
        job qwen2.5-0.5b_ds2_b2s1024_none 0,1 2 29801 qwen2.5-0.5b ds2 2 1024 none
        job qwen2.5-0.5b_ds3_b2s1024_none 0,1 2 29802 qwen2.5-0.5b ds3 2 1024 none
        job smollm2-360m_ds2_b4s512_full 0,1 2 29803 smollm2-360m ds2 4 512 full
        job tinyllama-1.1b_ds3_b1s2048_full 0,1 2 29804 tinyllama-1.1b ds3 1 2048 full
        job qwen3-0.6b_torch01_b4s512_none 0,1 2 29805 qwen3-0.6b torch:0,1 4 512 none
        job smollm2-360m_ds3_b4s512_none 0,1 2 29806 smollm2-360m ds3 4 512 none
        job smollm2-360m_torch01_b2s1024_full 0,1 2 29807 smollm2-360m torch:0,1 2 1024 full
    }

    lane_b() {
        job qwen3-0.6b_ds2_b1s2048_none 2,3 2 29811 qwen3-0.6b ds2 1 2048 none
        job qwen3-0.6b_ds3_b2s1024_full 2,3 2 29812 qwen3-0.6b ds3 2 1024 full
        job tinyllama-1.1b_ds2_b1s2048_none 2,3 2 29813 tinyllama-1.1b ds2 1 2048 none
        job qwen2.5-0.5b_torch01_b2s1024_none 2,3 2 29814 qwen2.5-0.5b torch:0,1 2 1024 none
        job qwen2.5-0.5b_ds3_b4s512_full 2,3 2 29815 qwen2.5-0.5b ds3 4 512 full
        job tinyllama-1.1b_torch01_b1s2048_full 2,3 2 29816 tinyllama-1.1b torch:0,1 1 2048 full
    }

    lane_a &
    lane_b &
    wait
    job qwen3-0.6b_ds3_nd4_b2s1024_none 0,1,2,3 4 29821 qwen3-0.6b ds3 2 1024 none
    job tinyllama-1.1b_ds2_nd4_b2s1024_none 0,1,2,3 4 29822 tinyllama-1.1b ds2 2 1024 none
elif [[ ${SET:-1} == 4 ]]; then
    job phi-4-mini_torch23_b1s8192_full 0,1 2 29871 phi-4-mini torch:2,3 1 8192 full
    job phi-4-mini_torch23_b1s4096_none 0,1 2 29872 phi-4-mini torch:2,3 1 4096 none
elif [[ ${SET:-1} == 5 ]]; then
    job phi-4-mini_ds3_b1s6144_full 0,1 2 29881 phi-4-mini ds3 1 6144 full
    job phi-4-mini_ds2_b1s2048_none 0,1 2 29882 phi-4-mini ds2 1 2048 none
elif [[ ${SET:-1} == 6 ]]; then
    job llama-3.1-8b_torch23_nd4_b1s4096_full 0,1,2,3 4 29891 llama-3.1-8b torch:2,3 1 4096 full
    job llama-3.1-8b_ds3_nd4_b1s4096_full 0,1,2,3 4 29892 llama-3.1-8b ds3 1 4096 full
    job qwen2.5-7b_torch23_nd4_b2s2048_none 0,1,2,3 4 29893 qwen2.5-7b torch:2,3 2 2048 none
elif [[ ${SET:-1} == 7 ]]; then
    job qwen2.5-7b_ds2_nd4_b1s4096_full 0,1,2,3 4 29894 qwen2.5-7b ds2 1 4096 full
    job gemma-2-9b_ds3_nd4_b1s4096_full 0,1,2,3 4 29895 gemma-2-9b ds3 1 4096 full
    job mistral-nemo-12b_torch3_nd4_b1s4096_full 0,1,2,3 4 29896 mistral-nemo-12b torch:3 1 4096 full
elif [[ ${SET:-1} == 8 ]]; then
    job qwen1.5-moe-a2.7b_torch3_nd4_b1s4096_full 0,1,2,3 4 29897 qwen1.5-moe-a2.7b torch:3 1 4096 full
    job qwen1.5-moe-a2.7b_ds3_nd4_b1s4096_full 0,1,2,3 4 29898 qwen1.5-moe-a2.7b ds3 1 4096 full
    job qwen1.5-moe-a2.7b_torch2_nd4_b1s4096_full 0,1,2,3 4 29899 qwen1.5-moe-a2.7b torch:2 1 4096 full
elif [[ ${SET:-1} == 9 ]]; then
    job llama-3.2-3b_torch3_nd4_b1s8192_none 0,1,2,3 4 29901 llama-3.2-3b torch:3 1 8192 none
    job gemma-3-4b-text_ds3_nd4_b1s4096_full 0,1,2,3 4 29902 gemma-3-4b-text ds3 1 4096 full
    job llama-3.2-3b_ds2_nd4_b2s2048_full 0,1,2,3 4 29903 llama-3.2-3b ds2 2 2048 full
    job gemma-3-4b-text_torch2_nd4_b2s4096_full 0,1,2,3 4 29904 gemma-3-4b-text torch:2 2 4096 full
elif [[ ${SET:-1} == 10 ]]; then
    job qwen2.5-0.5b_ds2off_b2s1024_none 0,1 2 29911 qwen2.5-0.5b ds2off 2 1024 none
    job tinyllama-1.1b_ds3off_b1s2048_full 0,1 2 29912 tinyllama-1.1b ds3off 1 2048 full
    job qwen3-0.6b_ds3off_b2s1024_none 0,1 2 29913 qwen3-0.6b ds3off 2 1024 none
    job smollm2-360m_ds2off_b4s512_full_ga2 0,1 2 29914 smollm2-360m ds2off 4 512 full 2
    job gemma-3-1b_ds2off_b1s2048_none 0,1 2 29915 gemma-3-1b ds2off 1 2048 none
elif [[ ${SET:-1} == 11 ]]; then
    job qwen3-0.6b_torch0123_bf16_b2s1024_none 0,1 2 29921 qwen3-0.6b torch:0,1,2,3 2 1024 none 1 bf16
    job llama-3.2-3b_torch23_bf16_b1s4096_full 0,1 2 29922 llama-3.2-3b torch:2,3 1 4096 full 1 bf16
    job gemma-3-1b_torch3_bf16_b2s1024_none 0,1 2 29923 gemma-3-1b torch:3 2 1024 none 1 bf16
    job smollm2-360m_torch01_bf16_b4s512_full_ga2 0,1 2 29924 smollm2-360m torch:0,1 4 512 full 2 bf16
    job tinyllama-1.1b_torch23_bf16_b1s2048_none 0,1 2 29925 tinyllama-1.1b torch:2,3 1 2048 none 1 bf16
elif [[ ${SET:-1} == 12 ]]; then
    job qwen2.5-0.5b_ds3offall_b2s1024_none 0,1 2 29931 qwen2.5-0.5b ds3offall 2 1024 none
    job tinyllama-1.1b_ds3offall_b1s2048_full 0,1 2 29932 tinyllama-1.1b ds3offall 1 2048 full
    job llama-3.2-3b_ds3offall_b1s4096_full 0,1 2 29933 llama-3.2-3b ds3offall 1 4096 full
    job qwen3-0.6b_ds3offall_b2s1024_none_ga2 0,1 2 29934 qwen3-0.6b ds3offall 2 1024 none 2
elif [[ ${SET:-1} == 13 ]]; then
    job llama-3.2-3b_torch3_b2s2048_none_padded 0,1 2 29941 llama-3.2-3b torch:3 2 2048 none 1 mixed_bf16 padded
    job qwen2.5-0.5b_ds3_b4s1024_none_padded 0,1 2 29942 qwen2.5-0.5b ds3 4 1024 none 1 mixed_bf16 padded
    job tinyllama-1.1b_ds2_b2s2048_full_padded 0,1 2 29943 tinyllama-1.1b ds2 2 2048 full 1 mixed_bf16 padded
    job gemma-3-1b_torch2_b2s2048_none_padded 0,1 2 29944 gemma-3-1b torch:2 2 2048 none 1 mixed_bf16 padded
    job qwen3-0.6b_torch01_b2s1000_none_padded 0,1 2 29945 qwen3-0.6b torch:0,1 2 1000 none 1 mixed_bf16 padded
    job smollm2-360m_ds3_b4s1024_full_padded 0,1 2 29946 smollm2-360m ds3 4 1024 full 1 mixed_bf16 padded
elif [[ ${SET:-1} == 14 ]]; then
    job phi-4-mini_torch3_b1s4096_none_padded 0,1 2 29951 phi-4-mini torch:3 1 4096 none 1 mixed_bf16 padded
    job gemma-2-2b_ds3_b1s4096_full_padded 0,1 2 29952 gemma-2-2b ds3 1 4096 full 1 mixed_bf16 padded
    job phi-4-mini_ds2_b1s2048_none_padded 0,1 2 29953 phi-4-mini ds2 1 2048 none 1 mixed_bf16 padded
elif [[ ${SET:-1} == 15 ]]; then
    job llama-3.1-8b_torch3_nd4_b2s2048_none_padded 0,1,2,3 4 29961 llama-3.1-8b torch:3 2 2048 none 1 mixed_bf16 padded
    job llama-3.1-8b_ds3_nd4_b1s8192_full_padded 0,1,2,3 4 29962 llama-3.1-8b ds3 1 8192 full 1 mixed_bf16 padded
elif [[ ${SET:-1} == 16 ]]; then
    job qwen3-0.6b_torch03_fp32_b2s1000_none_padded 0,1 2 29971 qwen3-0.6b torch:0,3 2 1000 none 1 fp32 padded
    job smollm2-360m_torch2_fp32_b4s1000_full_padded 0,1 2 29972 smollm2-360m torch:2 4 1000 full 1 fp32 padded
elif [[ ${SET:-1} == 17 ]]; then
    job smollm2-360m_ds3offall_b4s1024_full 0,1 2 29981 smollm2-360m ds3offall 4 1024 full
    job tinyllama-1.1b_ds3offall_b2s1024_none 0,1 2 29982 tinyllama-1.1b ds3offall 2 1024 none
    job qwen3-0.6b_ds3offall_b1s2048_full 0,1 2 29983 qwen3-0.6b ds3offall 1 2048 full
    job gemma-3-1b_ds3offall_b2s1024_none 0,1 2 29984 gemma-3-1b ds3offall 2 1024 none
elif [[ ${SET:-1} == 18 ]]; then
    job smollm3-3b_torch01_b1s2048_none 0,1 2 29991 smollm3-3b torch:0,1 1 2048 none
    job smollm3-3b_ds3_b2s2048_full 0,1 2 29992 smollm3-3b ds3 2 2048 full
    job smollm3-3b_torch23_b1s4096_none 0,1 2 29993 smollm3-3b torch:2,3 1 4096 none
    job smollm3-3b_ds2_b1s4096_none 0,1 2 29994 smollm3-3b ds2 1 4096 none
    job smollm3-3b_torch3_b2s1024_none_padded 0,1 2 29995 smollm3-3b torch:3 2 1024 none 1 mixed_bf16 padded
elif [[ ${SET:-1} == 19 ]]; then
    job smollm3-3b_torch3_nd4_b2s4096_none 0,1,2,3 4 29996 smollm3-3b torch:3 2 4096 none
    job smollm3-3b_ds3_nd4_b1s8192_full 0,1,2,3 4 29997 smollm3-3b ds3 1 8192 full
    job smollm3-3b_torch2_nd4_b2s2048_full_ga2 0,1,2,3 4 29998 smollm3-3b torch:2 2 2048 full 2
elif [[ ${SET:-1} == 20 ]]; then
    job smollm3-3b_ds2big_nd4_b1s4096_full 0,1,2,3 4 29999 smollm3-3b ds2big 1 4096 full
    job llama-3.2-3b_ds2big_nd4_b2s2048_full 0,1,2,3 4 29989 llama-3.2-3b ds2big 2 2048 full
elif [[ ${SET:-1} == 21 ]]; then
    job gemma-7b_torch3_nd4_b1s4096_full 0,1,2,3 4 30001 gemma-7b torch:3 1 4096 full
    job phi-3-mini-4k_torch2_nd4_b2s2048_none 0,1,2,3 4 30002 phi-3-mini-4k torch:2 2 2048 none
    job gemma-7b_ds3_nd4_b1s4096_none 0,1,2,3 4 30003 gemma-7b ds3 1 4096 none
    job phi-3-mini-4k_ds2_nd4_b2s4096_full 0,1,2,3 4 30004 phi-3-mini-4k ds2 2 4096 full
elif [[ ${SET:-1} == 22 ]]; then
    job qwen3-30b-a3b_torch3_bf16_nd4_b1s2048_full 0,1,2,3 4 30005 qwen3-30b-a3b torch:3 1 2048 full 1 bf16
elif [[ ${SET:-1} == 23 ]]; then
    job phi-3-mini-4k_torch01_nd4_b1s4096_none 0,1,2,3 4 30006 phi-3-mini-4k torch:0,1 1 4096 none
    job gemma-7b_torch2_nd4_b1s2048_full 0,1,2,3 4 30007 gemma-7b torch:2 1 2048 full
    job qwen3-30b-a3b_torch3_bf16_nd4_b1s4096_none 0,1,2,3 4 30008 qwen3-30b-a3b torch:3 1 4096 none 1 bf16
elif [[ ${SET:-1} == 24 ]]; then
    job qwen1.5-moe-a2.7b_ds2_nd4_b1s4096_full 0,1,2,3 4 30009 qwen1.5-moe-a2.7b ds2 1 4096 full
    job gemma-7b_ds2_nd4_b2s2048_full 0,1,2,3 4 30010 gemma-7b ds2 2 2048 full
elif [[ ${SET:-1} == 25 ]]; then
    job smollm2-360m_torch01_b2s1024_full 0,1 2 30011 smollm2-360m torch:0,1 2 1024 full
    job qwen2.5-0.5b_ds2off_b2s1024_none 0,1 2 30012 qwen2.5-0.5b ds2off 2 1024 none
    job qwen2.5-0.5b_ds3offall_b2s1024_none 0,1 2 30013 qwen2.5-0.5b ds3offall 2 1024 none
    job smollm2-360m_torch01_bf16_b4s512_full_ga2 0,1 2 30014 smollm2-360m torch:0,1 4 512 full 2 bf16
elif [[ ${SET:-1} == 26 ]]; then
    job llama-3.1-8b_torch3_b1s8192_full_offload 0,1 2 30021 llama-3.1-8b torch:3 1 8192 full 1 mixed_bf16 - offload
    job qwen2.5-7b_ds3_b1s8192_full_offload 0,1 2 30022 qwen2.5-7b ds3 1 8192 full 1 mixed_bf16 - offload
    job smollm3-3b_torch01_b1s8192_full_offload 0,1 2 30023 smollm3-3b torch:0,1 1 8192 full 1 mixed_bf16 - offload
elif [[ ${SET:-1} == 27 ]]; then
    job phi-3-mini-eager_torch03_b1s2048_full 0 1 30031 phi-3-mini-4k-eager torch:0,3 1 2048 full
    job phi-3-mini-eager_torch0_b1s2048_every2 0 1 30032 phi-3-mini-4k-eager torch:0 1 2048 full 1 mixed_bf16 - - 2
    job gemma-3-1b-eager_torch03_b1s2048_full 0 1 30033 gemma-3-1b-eager torch:0,3 1 2048 full
    job gemma-3-1b-eager_torch03_b1s4096_every2 0 1 30034 gemma-3-1b-eager torch:0,3 1 4096 full 1 mixed_bf16 - - 2
elif [[ ${SET:-1} == 28 ]]; then
    job qwen3-0.6b_torch03_fp32_b2s1024_none 0 1 30041 qwen3-0.6b torch:0,3 2 1024 none 1 fp32
    job qwen3-0.6b-dropout_torch03_b2s1024_none 0 1 30042 qwen3-0.6b-dropout torch:0,3 2 1024 none
    job qwen3-0.6b-dropout_torch03_fp32_b2s1024_none 0 1 30043 qwen3-0.6b-dropout torch:0,3 2 1024 none 1 fp32
    job qwen3-0.6b-dropout_torch2_b2s1024_full_padded 0 1 30044 qwen3-0.6b-dropout torch:2 2 1024 full 1 mixed_bf16 padded
    job qwen3-0.6b_torch0_fp32_b1s2048_full 0 1 30045 qwen3-0.6b torch:0 1 2048 full 1 fp32
elif [[ ${SET:-1} == 29 ]]; then
    job gemma-3-1b-softcap_torch03_b1s2048_none 0 1 30051 gemma-3-1b-softcap torch:0,3 1 2048 none
    job tinyllama-1.1b-relu_torch03_b2s1024_none 0 1 30052 tinyllama-1.1b-relu torch:0,3 2 1024 none
    job gemma-3-1b-softcap_torch2_b2s1024_full 0 1 30053 gemma-3-1b-softcap torch:2 2 1024 full
elif [[ ${SET:-1} == 3 ]]; then
    lane_a() {
        job gemma-3-1b_torch23_b2s1024_none 0,1 2 29851 gemma-3-1b torch:2,3 2 1024 none
        job gemma-3-1b_ds2_b2s1024_none 0,1 2 29852 gemma-3-1b ds2 2 1024 none
    }
    lane_b() {
        job gemma-3-1b_ds3_b1s2048_full 2,3 2 29861 gemma-3-1b ds3 1 2048 full
        job gemma-3-1b_torch01_b1s2048_none 2,3 2 29862 gemma-3-1b torch:0,1 1 2048 none
    }
    lane_a &
    lane_b &
    wait
else
    lane_a() {
        job gemma-2-2b_torch3_b1s4096_none 0,1 2 29831 gemma-2-2b torch:3 1 4096 none
        job qwen2.5-0.5b_ds2_b2s1024_none_ga4 0,1 2 29832 qwen2.5-0.5b ds2 2 1024 none 4
        job smollm2-360m_torch23_b4s512_none_ga2 0,1 2 29833 smollm2-360m torch:2,3 4 512 none 2
        job qwen2.5-0.5b_torch0_b1s4096_none 0,1 2 29834 qwen2.5-0.5b torch:0 1 4096 none
    }
    lane_b() {
        job gemma-2-2b_ds3_b1s4096_full 2,3 2 29841 gemma-2-2b ds3 1 4096 full
        job tinyllama-1.1b_torch23_b1s4096_full 2,3 2 29842 tinyllama-1.1b torch:2,3 1 4096 full
        job qwen3-0.6b_ds3_b2s1024_none_ga2 2,3 2 29843 qwen3-0.6b ds3 2 1024 none 2
    }
    lane_a &
    lane_b &
    wait
fi

# one file back: every job's arguments and JSON in a list, the logs packed apart
python3 bench/gpu/pack_jobs.py "$out" "$out/../real_models${SET:-1}.json"
tar -C "$out/.." -czf "$out/../real_models${SET:-1}_logs.tar.gz" real_models
cat "$out/status.txt"
