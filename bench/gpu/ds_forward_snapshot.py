"""What is alive on the GPU after forward under DeepSpeed stage 3, allocation by allocation.

A world over NCCL (torchrun), rank 0 reported: a Hugging Face family built with transformers'
modelling code (``measure.hf_families``), DeepSpeed 0.19.8 stage 3 in bf16 with the default
knobs and a client AdamW, two sequences of 1,024 tokens, two warm-up steps, then the caching
allocator's history over one more forward. Writes every live block of at least ``--min-mib``
with the Python frames that allocated it; ``--variant tied`` or ``untied`` gives the same shape
with and without a tied head::

    NCCL_NVLS_ENABLE=0 DS_ACCELERATOR=cuda PYTHONPATH=$PWD torchrun --nproc-per-node 2 \\
        bench/gpu/ds_forward_snapshot.py --family qwen3 --size medium --variant tied

A world of one gathers nothing (each parameter's gathered copy is its partition).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.forward_snapshot import live_blocks  # noqa: E402


def run(family: str, size: str, tied: bool, depth: int, min_mib: float) -> dict[str, Any]:
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from measure.hf_families import family_config

    body = family_config(family, size)
    body["tie_word_embeddings"] = tied
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(**body), attn_implementation="sdpa", dtype=torch.float32
    )
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": True},
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    x = torch.randint(3, body["vocab_size"], (2, 1024), device=engine.device)
    for _ in range(2):
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    loss = engine(input_ids=x, labels=x).loss
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    blocks = [
        {
            "size": b["size"],
            "requested": b["requested"],
            "in_forward": b["recorded"],
            "frames": b["frames"],
        }
        for b in live_blocks(depth, int(min_mib * 2**20), snap)
    ]
    blocks.sort(key=lambda b: -b["size"])
    engine.backward(loss)
    engine.step()
    return {
        "family": family,
        "size": size,
        "tied": tied,
        "allocated_before_forward": before,
        "allocated_after_forward": after,
        "blocks": blocks,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="qwen3")
    ap.add_argument("--size", default="medium")
    ap.add_argument("--variant", choices=["tied", "untied"], required=True)
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--min-mib", type=float, default=4.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/dssnap"))
    a = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import deepspeed
    import torch

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    deepspeed.init_distributed(dist_backend="nccl")
    result = run(a.family, a.size, a.variant == "tied", a.depth, a.min_mib)
    if int(os.environ["RANK"]) != 0:
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"ds_snapshot_{a.family}_{a.size}_{a.variant}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    mib = 2**20
    print(
        f"{a.family} {a.variant}: allocated {result['allocated_before_forward'] / mib:.1f} -> "
        f"{result['allocated_after_forward'] / mib:.1f} MiB"
    )
    for b in result["blocks"][:40]:
        where = " < ".join(b["frames"][:4])
        print(f"  {b['size'] / mib:9.1f} MiB  fwd={b['in_forward']!s:5}  {where}")


if __name__ == "__main__":
    main()
