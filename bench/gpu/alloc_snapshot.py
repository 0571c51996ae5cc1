# ruff: noqa: T201 (a script: its report goes to stdout)
"""What is alive at the peak of one training step: the caching allocator's history, replayed.

One DDP step (one rank) of a transformers model from ``measure.hf_families`` under bf16
autocast with AdamW, after two warm-up steps, recorded with
``torch.cuda.memory._record_memory_history``. The report gives the peak, the allocation that
reached it (its Python frames) and every block alive at that instant grouped by size and the
first frames that allocated it ("before the step": alive when the step began)::

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 1 bench/gpu/alloc_snapshot.py \\
        --family llama --size medium --seq-len 4096 --every-n-layers 3
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from measure.engines.hf import build_hf, hf_config  # noqa: E402
from measure.hf_families import family_config  # noqa: E402

MIB = 2**20
BEFORE = ("before the step",)


def _frames(event: dict[str, Any]) -> tuple[str, ...]:
    kept = [
        f
        for f in event.get("frames", [])
        if f["filename"].endswith(".py") and not f["filename"].endswith("nn/modules/module.py")
    ]
    return tuple(f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in kept[:5])


def alive_at_start(
    snap: dict[str, Any], label: tuple[str, ...] = BEFORE
) -> dict[int, tuple[int, tuple[str, ...]]]:
    """The blocks alive when the snapshot's history begins (address -> size, ``label``): those
    alive at its end, walked back through the history."""
    live: dict[int, tuple[int, tuple[str, ...]]] = {}
    for seg in snap["segments"]:
        for block in seg["blocks"]:
            if block["state"] == "active_allocated":
                live[block["address"]] = (block["requested_size"], label)
    # back to the trace's start: what it allocated was not there, what it freed was
    for event in reversed(snap["device_traces"][0]):
        if event["action"] == "alloc":
            live.pop(event["addr"], None)
        elif event["action"] == "free_completed":
            live[event["addr"]] = (event["size"], label)
    return live


def replay(snap: dict[str, Any]) -> tuple[int, dict[str, Any], dict[int, tuple[int, tuple]]]:
    """(peak bytes, the event that reached it, the blocks alive then: address -> size, frames)."""
    trace = snap["device_traces"][0]
    live = alive_at_start(snap)
    current = sum(size for size, _ in live.values())
    best, best_event, best_live = current, {}, dict(live)
    for event in trace:
        if event["action"] == "alloc":
            live[event["addr"]] = (event["size"], _frames(event))
            current += event["size"]
            if current > best:
                best, best_event, best_live = current, event, dict(live)
        elif event["action"] == "free_completed":
            current -= live.pop(event["addr"], (0, BEFORE))[0]
    return best, best_event, best_live


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--family", default="llama")
    ap.add_argument("--size", default="medium")
    ap.add_argument("--micro-batch-size", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--every-n-layers", type=int, default=1, help="0: no checkpointing")
    ap.add_argument("--rows", type=int, default=45)
    a = ap.parse_args(argv)
    dist.init_process_group("nccl")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    config = hf_config(family_config(a.family, a.size))
    model = build_hf(config, device, a.every_n_layers > 0, False, max(a.every_n_layers, 1))
    ddp = DistributedDataParallel(model, device_ids=[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (a.micro_batch_size, a.seq_len), device=device)

    def step() -> Any:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = ddp(input_ids=ids, labels=ids)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return out

    # the loop keeps the last step's outputs through the next step, as measure's does
    held = step()
    held = step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=500_000, stacks="python")
    held = step()
    del held
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, event, alive = replay(snap)
    print(f"max_memory_allocated {torch.cuda.max_memory_allocated() / MIB:,.1f} MiB")
    print(f"replayed peak {peak / MIB:,.1f} MiB, reached by: {' <- '.join(_frames(event))}")
    groups: collections.Counter[tuple[int, tuple[str, ...]]] = collections.Counter()
    for size, frames in alive.values():
        groups[(size, frames[:4])] += 1
    rows = sorted(groups.items(), key=lambda kv: -kv[0][0] * kv[1])[: a.rows]
    for (size, frames), count in rows:
        print(
            f"{size / MIB:9.2f} MiB x{count:4d} = {size * count / MIB:9.1f}  {' <- '.join(frames)}"
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
