"""What is alive on the GPU after a Hugging Face family's forward, allocation by allocation.

Builds the model and engine exactly as ``POST /v1/measure`` does (one process, a world of one
over NCCL), runs two warm-up steps, then records the caching allocator's history over one more
forward and writes every live block (size, requested size, the Python frames that allocated
it) with the predicted components beside it::

    NCCL_NVLS_ENABLE=0 PYTHONPATH=$PWD python3 bench/gpu/forward_snapshot.py \\
        --family qwen3 --stages 0,2,3 --out /tmp/snap
    (or --hf-config bench/hf_configs/gemma-3-1b.json --micro-batch-size 1 --seq-len 2048)

``--device cpu`` checks the script on a CPU (no allocator history; block lists stay empty).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench.gpu.world import world_of_one  # noqa: E402
from calculators.conventions import Stage  # noqa: E402
from measure.engines.pytorch import build_engine  # noqa: E402
from measure.hf_families import family_config  # noqa: E402
from measure.spec import parse_spec  # noqa: E402
from measure.workloads import build_workload  # noqa: E402


def _frames(block: dict[str, Any], depth: int) -> list[str]:
    frames = block.get("frames") or []
    out = []
    for f in frames:
        name = f.get("filename", "")
        if name.endswith(".py"):
            out.append(
                f"{Path(name).parent.name}/{Path(name).name}:{f.get('line')}:{f.get('name')}"
            )
        if len(out) >= depth:
            break
    return out


def live_blocks(
    depth: int, min_size: int = 0, snap: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every allocated block of at least ``min_size`` bytes in ``snap`` (default: a snapshot
    taken now), with the frames that allocated it; ``recorded``: its allocation is in the
    recorded history (it was allocated while the history was on)."""
    snap = torch.cuda.memory._snapshot() if snap is None else snap
    history: dict[int, dict[str, Any]] = {}
    for trace in snap.get("device_traces", [[]])[0]:
        if trace.get("action") == "alloc":
            history[trace["addr"]] = trace
    out = []
    for addr, b in addressed_blocks(snap):
        if b["state"] == "active_allocated" and b["size"] >= min_size:
            t = b if b.get("frames") else history.get(addr, {})
            out.append(
                {
                    "size": b["size"],
                    "requested": b.get("requested_size", b["size"]),
                    "recorded": addr in history,
                    "frames": _frames(t, depth),
                }
            )
    return out


def addressed_blocks(snap: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """Every block of ``snap``'s segments with its address (a segment's blocks lie end to
    end from the segment's address)."""
    out = []
    for seg in snap["segments"]:
        addr = seg["address"]
        for b in seg["blocks"]:
            out.append((addr, b))
            addr += b["size"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="qwen3")
    ap.add_argument("--stages", default="0,2,3")
    ap.add_argument("--checkpointing", default="none")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--size", default="small")
    ap.add_argument("--hf-config", help="a config.json to build instead of --family at --size")
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/snap"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = a.device == "cuda"
    device = world_of_one(a.device, 29571)
    for stage_n in (int(s) for s in a.stages.split(",")):
        stage = Stage(stage_n)
        if a.hf_config:
            config = json.loads(Path(a.hf_config).read_text())
            name = Path(a.hf_config).stem
        else:
            config, name = family_config(a.family, a.size), a.family
        body = {
            "model": {"hf_config": config},
            "dp": 1,
            "stages": [stage_n],
            "precision": "mixed_bf16",
            "optimizer": "adamw",
            "engine": "torch",
            "device": a.device,
            "batch": {
                "micro_batch_size": a.micro_batch_size,
                "seq_len": a.seq_len if cuda else 32,
                "activation_checkpointing": a.checkpointing,
            },
        }
        ms = parse_spec(body)
        workload = build_workload(ms)
        model = workload.build(device)
        engine = build_engine(
            model, workload.shard_units(model), stage, ms.precision, ms.optimizer, device, False
        )
        gen = torch.Generator().manual_seed(0)
        x, y = workload.make_batch(device, gen)
        for _ in range(2):
            with engine.autocast():
                _, loss = workload.forward(engine.module, x, y)
            loss.backward()
            del loss
            engine.optimizer.step()
            engine.optimizer.zero_grad(set_to_none=True)
        before = torch.cuda.memory_allocated() if cuda else 0
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.memory._record_memory_history(max_entries=500_000)
        with engine.autocast():
            logits, loss = workload.forward(engine.module, x, y)
        blocks: list[dict[str, Any]] = []
        after = 0
        if cuda:
            torch.cuda.synchronize()
            after = torch.cuda.memory_allocated()
            blocks = live_blocks(a.depth)
            torch.cuda.memory._record_memory_history(enabled=None)
        by_site: Counter[str] = Counter()
        count: Counter[str] = Counter()
        for b in blocks:
            key = " <- ".join(b["frames"][:4]) or "(before recording)"
            by_site[key] += b["size"]
            count[key] += 1
        record = {
            "family": name,
            "stage": stage_n,
            "checkpointing": a.checkpointing,
            "allocated_before_forward": before,
            "allocated_after_forward": after,
            "sites": [
                {"bytes": n, "blocks": count[k], "site": k} for k, n in by_site.most_common()
            ],
            "blocks": blocks,
        }
        path = out / f"snapshot_{name}_stage{stage_n}_{a.checkpointing}.json"
        path.write_text(json.dumps(record, indent=1))
        print(path, before, after, len(blocks))
        del logits, loss, engine, model
        if cuda:
            torch.cuda.empty_cache()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
