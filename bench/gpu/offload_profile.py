"""Where the time of an FSDP2 step with ``CPUOffloadPolicy`` goes, phase by phase and op by op.

Builds the model and engine exactly as ``POST /v1/measure`` does (one process, a world of one
over NCCL), runs warm-up steps, then times each phase of a step (forward, backward with FSDP2's
final callback, the optimizer step, ``zero_grad``) synchronised at both ends, with and without
offload, and records one offloaded step under ``torch.profiler``: the time and bytes of every
host–device copy (pinned or pageable, as CUDA names them) and the CPU ops that took longest::

    NCCL_NVLS_ENABLE=0 PYTHONPATH=$PWD python3 bench/gpu/offload_profile.py \\
        --layers 16 --hidden 2048 --stages 2,3 --out /tmp/offload

``--device cpu`` checks the script on a CPU (without offload: pinned shards need CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench.gpu.world import world_of_one  # noqa: E402
from calculators.conventions import Stage  # noqa: E402
from measure.engines.pytorch import build_engine  # noqa: E402
from measure.spec import parse_spec  # noqa: E402
from measure.workloads import build_workload  # noqa: E402


def _body(a: argparse.Namespace, stage: int, offload: bool) -> dict[str, Any]:
    where = "cpu" if offload else "none"
    return {
        "model": {
            "architecture": {
                "layers": a.layers,
                "hidden": a.hidden,
                "heads": a.hidden // 128,
                "vocab_size": 50304,
                "ffn_hidden": 4 * a.hidden,
                "max_seq_len": a.seq_len,
            }
        },
        "dp": 1,
        "stages": [stage],
        "precision": "mixed_bf16",
        "optimizer": "adamw",
        "engine": "torch",
        "device": a.device,
        "offload": {"optimizer": where, "params": where},
        "batch": {"micro_batch_size": a.micro_batch_size, "seq_len": a.seq_len},
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step(engine: Any, workload: Any, x: Any, y: Any, device: torch.device) -> dict[str, float]:
    """One training step, each phase synchronised at both ends: its seconds."""
    t0 = time.perf_counter()
    with engine.autocast():
        _, loss = workload.forward(engine.module, x, y)
    _sync(device)
    t1 = time.perf_counter()
    loss.backward()
    _sync(device)
    t2 = time.perf_counter()
    engine.optimizer.step()
    _sync(device)
    t3 = time.perf_counter()
    engine.optimizer.zero_grad(set_to_none=True)
    _sync(device)
    t4 = time.perf_counter()
    return {
        "forward": t1 - t0,
        "backward": t2 - t1,
        "optimizer_step": t3 - t2,
        "zero_grad": t4 - t3,
        "step": t4 - t0,
    }


def copies(trace: Path) -> dict[str, dict[str, float]]:
    """Every memcpy/memset kind in an exported trace (pinned or pageable, as CUDA names them):
    count, bytes, summed device milliseconds and the rate that implies."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "bytes": 0, "ms": 0.0})
    for e in json.loads(trace.read_text())["traceEvents"]:
        if e.get("cat") in ("gpu_memcpy", "gpu_memset"):
            rec = out[e["name"]]
            rec["count"] += 1
            rec["bytes"] += e.get("args", {}).get("bytes", 0)
            rec["ms"] += e.get("dur", 0) / 1e3
    for rec in out.values():
        rec["gb_per_s"] = rec["bytes"] / rec["ms"] / 1e6 if rec["ms"] else 0.0
    return dict(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--stages", default="2,3")
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/offload"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = a.device == "cuda"
    device = world_of_one(a.device, 29573)
    records = []
    for stage_n in (int(s) for s in a.stages.split(",")):
        for offload in (False, True) if cuda else (False,):  # pinned shards need CUDA
            ms = parse_spec(_body(a, stage_n, offload))
            workload = build_workload(ms)
            model = workload.build(device)
            engine = build_engine(
                model,
                workload.shard_units(model),
                Stage(stage_n),
                ms.precision,
                ms.optimizer,
                device,
                False,
                offload=offload,
            )
            gen = torch.Generator().manual_seed(0)
            x, y = workload.make_batch(device, gen)
            phases: dict[str, list[float]] = defaultdict(list)
            for _ in range(a.warmup):
                _step(engine, workload, x, y, device)
            for _ in range(a.steps):
                for k, v in _step(engine, workload, x, y, device).items():
                    phases[k].append(v)
            record: dict[str, Any] = {
                "stage": stage_n,
                "offload": offload,
                "params": sum(p.numel() for p in model.parameters()),
                "phases_s": {k: sorted(v) for k, v in phases.items()},
            }
            if offload:
                from torch.profiler import ProfilerActivity, profile

                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
                with profile(activities=acts, record_shapes=False) as prof:
                    _step(engine, workload, x, y, device)
                trace = out / f"trace_stage{stage_n}.json"
                prof.export_chrome_trace(str(trace))
                record["copies"] = copies(trace)
                table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
                (out / f"cpu_ops_stage{stage_n}.txt").write_text(table)
                if cuda:
                    table = prof.key_averages().table(
                        sort_by="self_device_time_total", row_limit=40
                    )
                    (out / f"device_ops_stage{stage_n}.txt").write_text(table)
            records.append(record)
            print(json.dumps({k: v for k, v in record.items() if k != "copies"}))
            del engine, model, x, y
            if cuda:
                torch.cuda.empty_cache()
    (out / "offload_profile.json").write_text(json.dumps(records, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
