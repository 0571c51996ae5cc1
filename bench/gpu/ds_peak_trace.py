"""What is alive on the GPU at a DeepSpeed run's peak, allocation by allocation.

Runs configurations of ``bench/validate_deepspeed.py`` (the shipped measure path) with the caching
allocator's history recorded from an empty device, replays the history to find the moment the
allocated bytes peak within the measured (last) step, and writes the allocations alive there, with
the Python frames that made them, grouped by site::

    NCCL_NVLS_ENABLE=0 DS_ACCELERATOR=cuda DS_BUILD_OPS=0 PYTHONPATH=$PWD \\
        torchrun --nproc_per_node 1 bench/gpu/ds_peak_trace.py \\
        --model gpt2-small-tied-m1 --stages 1,2 --out /tmp/trace

The measured step is found as the last third of the allocation events after the engine's
construction; the replay counts block sizes at ``alloc`` and ``free_requested`` as
``memory_allocated`` does. ``--model tiny`` with no GPU checks the script (empty history).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import validate_deepspeed as vd  # noqa: E402


def _frames(event: dict[str, Any], depth: int) -> list[str]:
    out = []
    for f in event.get("frames") or []:
        name = f.get("filename", "")
        if name.endswith(".py") and "torch/cuda/memory.py" not in name:
            out.append(
                f"{Path(name).parent.name}/{Path(name).name}:{f.get('line')}:{f.get('name')}"
            )
        if len(out) >= depth:
            break
    return out


# C++ frames of the allocator itself and of the recording, skipped to reach the op that asked
_CPP_SKIP = (
    "c10::",
    "CUDACachingAllocator",
    "GatheredContext",
    "CapturedTraceback",
    "??",
    "_start",
)


def _cpp_frames(event: dict[str, Any], depth: int) -> list[str]:
    """The C++ frames (``--stacks all``) of an allocation made outside Python, innermost first."""
    out = []
    for f in event.get("frames") or []:
        name = f.get("name", "")
        if f.get("filename", "").endswith(".py") or any(s in name for s in _CPP_SKIP):
            continue
        out.append(name[:160])
        if len(out) >= depth:
            break
    return out


def _replay(allocs: list[dict[str, Any]]) -> Iterator[tuple[int, int, dict[int, Any]]]:
    """After each allocation or free, in order: its index, the allocated bytes and the live
    allocations by address (one dict, updated in place)."""
    total, live = 0, {}
    for i, e in enumerate(allocs):
        if e["action"] == "alloc":
            total += e["size"]
            live[e["addr"]] = e
        else:
            total -= e["size"]
            live.pop(e["addr"], None)
        yield i, total, live


def peak_blocks(events: list[dict[str, Any]], depth: int) -> dict[str, Any]:
    """Replay the history: the peak of allocated bytes in the last third of the events and the
    allocations alive there."""
    allocs = [e for e in events if e.get("action") in ("alloc", "free_requested")]
    if not allocs:
        return {"events": 0}
    start = len(allocs) * 2 // 3
    # the first event at the largest total
    _, negative = max((total, -i) for i, total, _ in _replay(allocs) if i >= start)
    best_i = -negative
    total, live = next((t, alive) for i, t, alive in _replay(allocs) if i == best_i)
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    blocks = []
    for e in live.values():
        fr = _frames(e, depth)
        site = " <- ".join(fr[:3]) or "(no frames)"
        sites[site][0] += e["size"]
        sites[site][1] += 1
        blocks.append({"size": e["size"], "frames": fr or _cpp_frames(e, depth)})
    blocks.sort(key=lambda b: -b["size"])
    return {
        "events": len(allocs),
        "peak_event": best_i,
        "allocated_at_peak": total,
        "peak_op": _frames(allocs[best_i], depth) or _cpp_frames(allocs[best_i], depth),
        "peak_op_size": allocs[best_i]["size"],
        "sites": sorted(
            ({"site": s, "bytes": v[0], "blocks": v[1]} for s, v in sites.items()),
            key=lambda x: -x["bytes"],
        ),
        "largest_blocks": blocks[:200],
        # the allocations and frees that led to the peak, oldest first
        "before_peak": [
            {
                "action": e["action"],
                "size": e["size"],
                "frames": _frames(e, 4) or _cpp_frames(e, 6),
            }
            for e in allocs[max(0, best_i - 40) : best_i + 1]
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-small-tied-m1")
    ap.add_argument("--stages", default="1,2")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument(
        "--stacks", default="python", choices=("python", "all"), help="all: C++ frames as well"
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/trace"))
    a = ap.parse_args()
    import deepspeed

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank = int(os.environ.get("RANK", "0"))
    for stage in (int(s) for s in a.stages.split(",")):
        c: dict[str, Any] = {
            "model": a.model,
            "precision": a.precision,
            "stage": stage,
            "offload": False,
        }
        vd.clear_device()
        if cuda:
            torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks=a.stacks)
        result = vd.run_one(c, rank)
        events: list[dict[str, Any]] = []
        if cuda:
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            events = snap.get("device_traces", [[]])[torch.cuda.current_device()]
        found = peak_blocks(events, a.depth)
        record = {"config": c, "measured_peak": result.get("peak"), **found}
        if rank == 0:
            (out / f"trace_{a.model}_stage{stage}.json").write_text(json.dumps(record, indent=1))
            print(
                json.dumps(
                    {
                        "stage": stage,
                        "measured_peak": result.get("peak"),
                        "replayed_peak": found.get("allocated_at_peak"),
                        "peak_op": found.get("peak_op"),
                        "top_sites": found.get("sites", [])[:12],
                    },
                    indent=1,
                ),
                flush=True,
            )
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
