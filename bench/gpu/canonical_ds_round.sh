#!/usr/bin/env bash
# The canonical decoder (a model given as `architecture`) under DeepSpeed stages 1 and 2 at
# one long sequence over a small vocabulary, so the last block's MLP backward, not the head's
# gradient, sets the peak after the first hook (and, with checkpointing at stage 1, the first
# block's): a Llama-style block (RMSNorm, gated SiLU, no biases) and a GPT-2-style one (LayerNorm,
# GELU, biases, tied head), Nd 2 on GPUs 0,1. One JSON back, each run's arguments beside it.
#
#   bash bench/gpu/canonical_ds_round.sh
#   python3 -m bench.accuracy --runs | grep -- -style_
set -u
out=${OUT:-$PWD/canonical-results}/canonical_ds
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 DS_ACCELERATOR=cuda DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=/tmp/tx
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
llama='{"layers": 8, "hidden": 1024, "heads": 16, "vocab_size": 8192, "max_seq_len": 4096, "ffn_hidden": 4096, "norm": "rmsnorm", "activation": "silu", "gated_mlp": true, "bias": false, "position_embedding": "rope"}'
gpt2='{"layers": 8, "hidden": 1024, "heads": 16, "vocab_size": 8192, "max_seq_len": 4096, "tied_embeddings": true}'

# NAME PORT ARCHITECTURE CHECKPOINTING
job() {
    local args=(--architecture "$3" --engine deepspeed --stages 1,2 --dp 2 --mode distributed
        --micro-batch-size 1 --seq-len 4096 --activation-checkpointing "$4"
        --warmup-steps 2 --steps 2 --no-host-probe)
    printf '%s\n' "${args[@]}" >"$out/$1.args"
    CUDA_VISIBLE_DEVICES=0,1 timeout 240 python3 -m torch.distributed.run --nproc-per-node 2 \
        --master-port "$2" -m measure "${args[@]}" >"$out/$1.json" 2>"$out/$1.log"
    echo "$1: exit $?" >>"$out/status.txt"
}

job llama-style_none 29901 "$llama" none
job llama-style_full 29902 "$llama" full
job gpt2-style_none 29903 "$gpt2" none

python3 bench/gpu/pack_jobs.py "$out" "$out/../canonical_ds.json"
cat "$out/status.txt"
