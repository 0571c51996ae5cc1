"""What is alive on the GPU after a Hugging Face family's forward, allocation by allocation.

Builds the model and engine exactly as ``POST /v1/measure`` does (one process, a world of one
over NCCL), runs two warm-up steps, then records the caching allocator's history over one more
forward and writes every live block (size, requested size, stream, the Python frames that
allocated it) with the predicted components beside it::

    NCCL_NVLS_ENABLE=0 PYTHONPATH=$PWD python3 bench/gpu/forward_snapshot.py \\
        --family qwen3 --stages 0,2,3 --out /tmp/snap
    (or --hf-config bench/hf_configs/gemma-3-1b.json --micro-batch-size 1 --seq-len 2048)

Under ``torchrun --nproc-per-node N`` the world is N ranks over NCCL and rank 0 writes;
``--trace-step`` also writes the allocator's events over the whole recorded step (forward,
backward, optimizer step), in order, for replaying it. ``--report FILE...`` prints, without a
GPU, where the live blocks exceed their requests (by allocating site) and which blocks
FSDP2's gathered parameters got::

    python3 bench/gpu/forward_snapshot.py --report bench/results/forward_snapshot/*_nd2.json.gz

``--device cpu`` checks the script on a CPU (no allocator history; block lists stay empty).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench.gpu.world import world_from_env  # noqa: E402
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
                    "stream": b.get("stream", 0),
                    "segment_size": b.get("segment_size", 0),
                    "recorded": addr in history,
                    "frames": _frames(t, depth),
                }
            )
    return out


def addressed_blocks(snap: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """Every block of ``snap``'s segments with its address (a segment's blocks lie end to
    end from the segment's address), each with its segment's stream and size."""
    out = []
    for seg in snap["segments"]:
        addr = seg["address"]
        for b in seg["blocks"]:
            b = {**b, "stream": seg.get("stream", 0), "segment_size": seg.get("total_size", 0)}
            out.append((addr, b))
            addr += b["size"]
    return out


def step_events(snap: dict[str, Any], depth: int) -> list[dict[str, Any]]:
    """The allocator's recorded events in order: action, address, size, stream and the
    allocating frames (``alloc`` only)."""
    out = []
    for t in snap.get("device_traces", [[]])[0]:
        e = {k: t.get(k) for k in ("action", "addr", "size", "stream")}
        if t.get("action") == "alloc":
            e["frames"] = _frames(t, depth)
        out.append(e)
    return out


def report(paths: list[str]) -> None:
    """Per snapshot: the live blocks' bytes beyond their requests by allocating site, and the
    gathered parameters' requests (FSDP2 ``alloc_storage``) with the blocks they got."""
    for name in paths:
        opener = gzip.open if name.endswith(".gz") else open
        with opener(name, "rt") as f:
            record = json.load(f)
        blocks = record["blocks"]
        excess = sum(b["size"] - b["requested"] for b in blocks)
        print(
            f"{Path(name).name}: stage {record['stage']}, Nd {record.get('world', 1)}, "
            f"{len(blocks)} live blocks after forward, {excess / 2**20:.2f} MiB beyond requests"
        )
        by_site: Counter[str] = Counter()
        count: Counter[str] = Counter()
        for b in blocks:
            if b["size"] > b["requested"]:
                site = b["frames"][0] if b["frames"] else "(allocated before the recorded step)"
                by_site[site] += b["size"] - b["requested"]
                count[site] += 1
        for site, n in by_site.most_common():
            print(f"  {n / 2**20:7.2f} MiB over {count[site]:3d} blocks  {site}")
        got: Counter[tuple[int, int]] = Counter(
            (b["requested"], b["size"])
            for b in blocks
            if b["frames"] and "alloc_storage" in b["frames"][0] and b["requested"] > 2**20
        )
        for (asked, size), n in sorted(got.items()):
            mib = f"{asked / 2**20:.3f} MiB handed {size / 2**20:.3f} MiB"
            print(f"  gathered parameter of {mib}: {n}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", nargs="+", help="print what these snapshots hold; no GPU")
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
    ap.add_argument("--trace-step", action="store_true", help="also write the step's events")
    a = ap.parse_args()
    if a.report:
        report(a.report)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = a.device == "cuda"
    device, rank, world = world_from_env(a.device, 29571)
    for stage_n in (int(s) for s in a.stages.split(",")):
        stage = Stage(stage_n)
        if a.hf_config:
            config = json.loads(Path(a.hf_config).read_text())
            name = Path(a.hf_config).stem
        else:
            config, name = family_config(a.family, a.size), a.family
        body = {
            "model": {"hf_config": config},
            "dp": world,
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
        events: list[dict[str, Any]] = []
        after = peak = 0
        if cuda:
            torch.cuda.synchronize()
            after = torch.cuda.memory_allocated()
            blocks = live_blocks(a.depth)
            if a.trace_step:
                torch.cuda.reset_peak_memory_stats()
                loss.backward()
                engine.optimizer.step()
                engine.optimizer.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated()
                events = step_events(torch.cuda.memory._snapshot(), a.depth)
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
            "world": world,
            "peak_after_forward": peak,
            "sites": [
                {"bytes": n, "blocks": count[k], "site": k} for k, n in by_site.most_common()
            ],
            "blocks": blocks,
            "events": events,
        }
        suffix = f"_nd{world}" if world > 1 else ""
        path = out / f"snapshot_{name}_stage{stage_n}_{a.checkpointing}{suffix}.json"
        if rank == 0:
            path.write_text(json.dumps(record, indent=None if events else 1))
            excess = sum(b["size"] - b["requested"] for b in blocks)
            print(path, before, after, len(blocks), "excess", excess, "peak", peak)
        del logits, loss, engine, model
        if cuda:
            torch.cuda.empty_cache()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
