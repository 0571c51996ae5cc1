# ruff: noqa: T201 (a script: its report goes to stdout)
"""What is alive at the measured peak of a ``/v1/measure`` run, beside the predicted moments.

Reruns bodies that ``bench/gpu/step_fuzz.py`` recorded (the ``--worst`` most negative errors
against the requested peak, or ``--pick`` line numbers) through ``measure.runner.run`` with the
CUDA allocator's history recorded. ``measure/engines/pytorch.py`` resets the peak four times in
its measured step (the step's start, then after forward, after backward and after the optimizer
step); a marker allocation at each reset finds that step in the history. The report gives, per
run, the predicted moments (``peak_candidate_*``), the measured and replayed requested peak, the
phase it falls in, the allocation that reached it and the blocks alive then, grouped by size and
first Python frames, largest first::

    NCCL_NVLS_ENABLE=0 python3 bench/gpu/step_snapshot.py \\
        --jsonl bench/results/step_fuzz/*.jsonl --worst 12
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.alloc_snapshot import alive_at_start  # noqa: E402

MIB = 2**20
MARK = 777  # bytes: a size nothing else in a step asks for
MARK_END = 779
BEFORE = ("alive before the history",)
PHASES = ("forward", "backward", "optimizer step", "zero_grad")


def _frames(event: dict[str, Any]) -> tuple[str, ...]:
    kept = [
        f
        for f in event.get("frames", [])
        if f["filename"].endswith(".py")
        and not f["filename"].endswith(("nn/modules/module.py", "step_snapshot.py"))
    ]
    return tuple(f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in kept[:4])


def _mark(size: int = MARK) -> None:
    torch.cuda.synchronize()
    m = torch.empty(size, dtype=torch.uint8, device="cuda")
    del m


def window_peak(snap: dict[str, Any]) -> tuple[int, int, dict[str, Any], dict[int, Any]]:
    """(requested peak in the measured step, its phase, the event reaching it, alive then)."""
    trace = snap["device_traces"][0]
    live = alive_at_start(snap, BEFORE)
    allocs = [(i, e["size"]) for i, e in enumerate(trace) if e["action"] == "alloc"]
    end = next(i for i, size in allocs if size == MARK_END)
    marks = [i for i, size in allocs if size == MARK and i < end][-4:]
    start = marks[0]
    current = sum(size for size, _ in live.values())
    best, best_at, best_event, best_live, phase = -1, 0, {}, {}, 0
    for i, event in enumerate(trace[:end]):
        if event["action"] == "alloc":
            if event["size"] == MARK and i >= start:
                phase = sum(1 for m in marks if m <= i) - 1
            where = (PHASES[phase],) if i >= start else ("before the step",)
            live[event["addr"]] = (event["size"], where + _frames(event))
            current += event["size"]
            if i >= start and event["size"] != MARK and current > best:
                best, best_at, best_event, best_live = current, phase, event, dict(live)
        elif event["action"] == "free_completed":
            current -= live.pop(event["addr"], (0, BEFORE))[0]
    return best, best_at, best_event, best_live


def one(body: dict[str, Any], rows: int) -> None:
    from measure import memory
    from measure.runner import run

    reset, nvml = memory.DeviceMemory.reset_peak, memory.DeviceMemory.nvml_used

    def marked_reset(self: memory.DeviceMemory) -> None:
        _mark()
        reset(self)

    def marked_nvml(self: memory.DeviceMemory) -> int | None:  # read just after the step
        _mark(MARK_END)
        return nvml(self)

    memory.DeviceMemory.reset_peak = marked_reset  # type: ignore[method-assign]
    memory.DeviceMemory.nvml_used = marked_nvml  # type: ignore[method-assign]
    torch.cuda.memory._record_memory_history(
        max_entries=2_000_000, stacks="python", clear_history=True
    )
    try:
        result = run(body)
    finally:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        memory.DeviceMemory.reset_peak = reset  # type: ignore[method-assign]
        memory.DeviceMemory.nvml_used = nvml  # type: ignore[method-assign]
    r = result["runs"][0]
    m, p = r["measured"], r["predicted"]
    comps = p.get("components", {})
    print(
        "predicted:",
        f"peak {p['peak'] / MIB:.3f} MiB,",
        f"requested {(p.get('peak_requested') or 0) / MIB:.3f} MiB,",
        *[n for n in p.get("notes", []) if n.startswith("peak at")][:1],
    )
    for k, v in sorted(comps.items()):
        if isinstance(v, int | float) and v:
            print(f"   {k:48s} {v / MIB:10.3f} MiB")
    peak, phase, event, alive = window_peak(snap)
    print(
        f"measured: peak_requested {m['peak_requested'] / MIB:.3f} MiB, replayed {peak / MIB:.3f}"
        f" MiB in {PHASES[max(phase, 0)]}; after_forward {m['after_forward'] / MIB:.3f} MiB"
        f" (predicted {p['after_forward'] / MIB:.3f})"
    )
    print(
        f"   reached by {event.get('size', 0)} B at {' <- '.join(_frames(event)) or '(no frames)'}"
    )
    groups: collections.Counter[tuple[int, tuple[str, ...]]] = collections.Counter()
    for size, frames in alive.values():
        groups[(size, frames[:4])] += 1
    for (size, frames), count in sorted(groups.items(), key=lambda kv: -kv[0][0] * kv[1])[:rows]:
        print(
            f"   {size:>11,d} B x{count:3d} = {size * count / MIB:8.3f} MiB  {' <- '.join(frames)}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jsonl", nargs="+", required=True)
    ap.add_argument("--worst", type=int, default=0, help="the N most negative errors")
    ap.add_argument("--best", type=int, default=0, help="the N most positive errors")
    ap.add_argument("--pick", nargs="*", default=[], help="FILE:LINE (1-based)")
    ap.add_argument("--rows", type=int, default=30)
    a = ap.parse_args(argv)
    found = []
    for name in a.jsonl:
        for n, line in enumerate(Path(name).read_text().splitlines(), 1):
            d = json.loads(line)
            if "error" in d:
                continue
            err = (d["pred_peak"] - d["peak_requested"]) / d["peak_requested"] * 100
            found.append((err, f"{Path(name).name}:{n}", d))
    found.sort(key=lambda t: t[0])
    chosen = found[: a.worst] + (found[-a.best :] if a.best else [])
    chosen += [t for t in found if t[1] in a.pick or any(t[1].endswith(p) for p in a.pick)]
    for err, where, d in chosen:
        print(f"\n=== {where}: recorded error {err:+.2f} %")
        print(json.dumps(d["body"]))
        try:
            one(d["body"], a.rows)
        except Exception as e:  # noqa: BLE001 (one run failing must not end the others)
            print(f"failed: {e!r}"[:400])
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
