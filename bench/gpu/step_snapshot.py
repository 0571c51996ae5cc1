# ruff: noqa: T201 (a script: its report goes to stdout)
"""What is alive at the measured peak of a ``/v1/measure`` run, beside the predicted moments.

Reruns bodies that ``bench/gpu/step_fuzz.py`` recorded (the ``--worst`` most negative errors
against the requested peak, or ``--pick`` line numbers), each at the stage of its row, through
``measure.runner.run`` with the CUDA allocator's history recorded. ``measure/engines/pytorch.py``
resets the peak four times in its measured step (the step's start, then after forward, after
backward and after the optimizer step); ``measure/engines/deepspeed.py`` once, at the step's
start, and the script marks each ``engine.backward`` and ``engine.step`` call. A marker
allocation at each of these finds the step and its phases in the history. The report gives, per
run, the predicted moments (``peak_candidate_*``), the measured and replayed requested peak, the
phase it falls in, the allocation that reached it and the blocks alive then, grouped by size and
first Python frames, largest first. ``--blocks`` replays the run's whole history (every
allocation and free, one allocator per stream) on ``calculators/caching_allocator.py`` and
gives the most its blocks held at once in the step beside the measured ``peak``
(``max_memory_allocated``), and the blocks handed out beyond their requests then; ``--dump DIR``
writes each run's history, gzipped. Run a DeepSpeed row under ``torchrun``, one row per
invocation: there ``measure.runner`` measures in this process (it spawns a child otherwise, whose
history is not recorded), and DeepSpeed keeps the process group it first saw::

    NCCL_NVLS_ENABLE=0 DS_ACCELERATOR=cuda PYTHONPATH=$PWD torchrun --nproc-per-node 1 \\
        bench/gpu/step_snapshot.py --jsonl bench/results/step_fuzz/h200_ds_seed2?.jsonl \\
        --pick h200_ds_seed26.jsonl:12
    NCCL_NVLS_ENABLE=0 python3 bench/gpu/step_snapshot.py --stacks all \\
        --jsonl bench/results/step_fuzz/h200_seed*.jsonl --worst 12
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
from calculators.caching_allocator import CachingAllocator, block  # noqa: E402

MIB = 2**20
MARK = 777  # bytes: a size nothing else in a step asks for
MARK_END = 779
MARK_BACKWARD = 781  # DeepSpeed's engine.backward begins
MARK_STEP = 783  # DeepSpeed's engine.step begins
BEFORE = ("alive before the history",)
PHASES = ("forward", "backward", "optimizer step", "zero_grad")


# frames every allocation in a counted step passes through (dispatch, the collective counter)
_PASS_THROUGH = ("module.py", "step_snapshot.py", "_ops.py", "comms.py", "eval_frame.py")
_PASS_THROUGH += ("_compile.py", "_python_dispatch.py")
# C++ frames of the allocator and of the recording, skipped to reach the op that asked
_CPP_SKIP = ("c10::", "CUDACachingAllocator", "GatheredContext", "CapturedTraceback", "??")


def _frames(event: dict[str, Any]) -> tuple[str, ...]:
    """The allocation's first Python frames; for one autograd made (no Python frame, with
    ``--stacks all``), its first C++ frames."""
    frames = event.get("frames", [])
    kept = [
        f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}"
        for f in frames
        if f["filename"].endswith(".py")
        and not os.path.basename(f["filename"]).endswith(_PASS_THROUGH)
    ]
    if not kept:  # the op, then the autograd node that ran it
        cpp = [
            f["name"][:90]
            for f in frames
            if not f["filename"].endswith(".py") and not any(k in f["name"] for k in _CPP_SKIP)
        ]
        node = [n for n in cpp if "Backward" in n or "autograd::generated" in n]
        kept = [n for n in cpp if n.startswith("at::native") or n.startswith("at::_ops")][:2]
        kept += node[:2]
    return tuple(kept[:4])


def _mark(size: int = MARK) -> None:
    torch.cuda.synchronize()
    m = torch.empty(size, dtype=torch.uint8, device="cuda")
    del m


def window_peak(
    snap: dict[str, Any], deepspeed: bool = False
) -> tuple[int, str, dict[str, Any], dict[int, Any]]:
    """(requested peak in the measured step, its phase, the event reaching it, alive then)."""
    trace = snap["device_traces"][0]
    live = alive_at_start(snap, BEFORE)
    allocs = [(i, e["size"]) for i, e in enumerate(trace) if e["action"] == "alloc"]
    end = next(i for i, size in allocs if size == MARK_END)
    marks = [i for i, size in allocs if size == MARK and i < end][-1 if deepspeed else -4 :]
    start = marks[0]
    named = {MARK_BACKWARD: "backward", MARK_STEP: "optimizer step"}
    current = sum(size for size, _ in live.values())
    best, best_at, best_event, best_live, phase = -1, "", {}, {}, PHASES[0]
    markers = (MARK, MARK_BACKWARD, MARK_STEP)
    for i, event in enumerate(trace[:end]):
        if event["action"] == "alloc":
            if i >= start and event["size"] == MARK:
                phase = PHASES[sum(1 for m in marks if m <= i) - 1]
            elif i >= start and event["size"] in named:
                phase = named[event["size"]]
            where = (phase,) if i >= start else ("before the step",)
            live[event["addr"]] = (event["size"], where + _frames(event))
            current += event["size"]
            if i >= start and event["size"] not in markers and current > best:
                best, best_at, best_event, best_live = current, phase, event, dict(live)
        elif event["action"] == "free_completed":
            current -= live.pop(event["addr"], (0, BEFORE))[0]
    return best, best_at, best_event, best_live


def _mark_deepspeed() -> list[tuple[Any, str, Any]]:
    """Marks each ``engine.backward`` and ``engine.step`` call; the originals, to restore."""
    try:
        from deepspeed.runtime.engine import DeepSpeedEngine
    except ImportError:
        return []
    saved = []
    for name, size in (("backward", MARK_BACKWARD), ("step", MARK_STEP)):
        original = getattr(DeepSpeedEngine, name)

        def marked(self: Any, *args: Any, _f: Any = original, _s: int = size, **kw: Any) -> Any:
            _mark(_s)
            return _f(self, *args, **kw)

        setattr(DeepSpeedEngine, name, marked)
        saved.append((DeepSpeedEngine, name, original))
    return saved


def one(
    body: dict[str, Any],
    rows: int,
    stacks: str = "python",
    blocks: bool = False,
    dump: Path | None = None,
) -> None:
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
    deepspeed = body.get("engine") == "deepspeed"
    restore = _mark_deepspeed() if deepspeed else []
    torch.cuda.memory._record_memory_history(
        max_entries=2_000_000, stacks=stacks, clear_history=True
    )
    try:
        result = run(body)
    finally:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        memory.DeviceMemory.reset_peak = reset  # type: ignore[method-assign]
        memory.DeviceMemory.nvml_used = nvml  # type: ignore[method-assign]
        for owner, name, original in restore:
            setattr(owner, name, original)
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
    peak, phase, event, alive = window_peak(snap, deepspeed)
    forward = p.get("after_forward")
    print(
        f"measured: peak_requested {m['peak_requested'] / MIB:.3f} MiB, replayed {peak / MIB:.3f}"
        f" MiB in {phase}; after_forward {m['after_forward'] / MIB:.3f} MiB"
        f" (predicted {'-' if forward is None else f'{forward / MIB:.3f}'})"
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
    if blocks:
        block_report(snap, deepspeed, m["peak"], rows)
    if dump is not None:
        write_history(snap, dump)


def write_history(snap: dict[str, Any], path: Path) -> None:
    """The history, compact: the blocks alive before it, then one ``[action, address, bytes,
    stream, frames]`` per allocation, completed free and released segment (``frames`` an index
    into ``frames``), gzipped JSON."""
    import gzip

    table: dict[tuple[str, ...], int] = {}
    events = []
    for e in snap["device_traces"][0]:
        if e["action"] in ("alloc", "free_completed", "segment_free", "segment_alloc"):
            where = table.setdefault(_frames(e), len(table))
            events.append([e["action"], e["addr"], e["size"], e.get("stream", 0), where])
    before = sorted((a, n) for a, (n, _) in alive_at_start(snap).items())
    with gzip.open(path, "wt") as f:
        json.dump({"before": before, "events": events, "frames": [list(t) for t in table]}, f)


def _release(sim: CachingAllocator, size: int) -> None:
    """``empty_cache`` gave back a free segment of ``size`` bytes: one whole free block of it."""
    for small in (True, False):
        pool = sim.pools[small]
        for i, entry in enumerate(pool):
            b = entry[3]
            if b.size == size and b.prev is None and b.next is None:
                pool.pop(i)
                return


def block_report(snap: dict[str, Any], deepspeed: bool, measured_peak: int, rows: int) -> None:
    """The whole history replayed on ``calculators.caching_allocator`` (one allocator per
    stream, a released segment dropped): the most bytes its blocks held at once in the measured
    step against the run's ``peak``, and at that moment the blocks handed out beyond their
    requests (rounded to 512 bytes), grouped by size and frames, largest excess first."""
    trace = snap["device_traces"][0]
    allocs = [(i, e["size"]) for i, e in enumerate(trace) if e["action"] == "alloc"]
    end = next(i for i, size in allocs if size == MARK_END)
    marks = [i for i, size in allocs if size == MARK and i < end][-1 if deepspeed else -4 :]
    sims: dict[int, CachingAllocator] = collections.defaultdict(CachingAllocator)
    live: dict[int, tuple[int, Any, int, tuple[str, ...]]] = {}
    for addr, (size, _) in sorted(alive_at_start(snap).items()):
        live[addr] = (-1, sims[-1].malloc(size), size, BEFORE)
    held = sum(b.size for _, b, _, _ in live.values())
    asked = sum(size for _, _, size, _ in live.values())
    best, best_asked = -1, 0
    best_live: dict[int, tuple[int, int, tuple[str, ...]]] = {}
    for i, event in enumerate(trace[:end]):
        action, stream = event["action"], event.get("stream", 0)
        if action == "alloc":
            b = sims[stream].malloc(event["size"])
            live[event["addr"]] = (stream, b, event["size"], _frames(event))
            held += b.size
            asked += event["size"]
            if i >= marks[0] and held > best:  # the sizes now: a freed block merges later
                best, best_asked = held, asked
                best_live = {a: (blk.size, n, f) for a, (_, blk, n, f) in live.items()}
        elif action == "free_completed" and event["addr"] in live:
            s, b, size, _ = live.pop(event["addr"])
            held -= b.size  # before the block merges with its free neighbours
            asked -= size
            sims[s].free(b)
        elif action == "segment_free":
            _release(sims[stream], event["size"])
    print(
        f"blocks replayed: peak {best / MIB:.3f} MiB (measured {measured_peak / MIB:.3f} MiB),"
        f" requested then {best_asked / MIB:.3f} MiB, beyond the requests"
        f" {(best - best_asked) / MIB:.3f} MiB"
    )
    groups: collections.Counter[tuple[int, int, tuple[str, ...]]] = collections.Counter()
    counts: collections.Counter[tuple[int, int, tuple[str, ...]]] = collections.Counter()
    for handed, size, frames in best_live.values():
        if handed > block(size):
            key = (size, handed - block(size), frames[:4])
            groups[key] += handed - block(size)
            counts[key] += 1
    for (size, over, frames), total in groups.most_common(rows):
        print(
            f"   {size:>11,d} B +{over:>9,d} x{counts[(size, over, frames)]:3d}"
            f" = {total / MIB:7.3f} MiB  {' <- '.join(frames)}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jsonl", nargs="+", required=True)
    ap.add_argument("--worst", type=int, default=0, help="the N most negative errors")
    ap.add_argument("--best", type=int, default=0, help="the N most positive errors")
    ap.add_argument("--pick", nargs="*", default=[], help="FILE:LINE (1-based)")
    ap.add_argument("--rows", type=int, default=30)
    ap.add_argument(
        "--stacks", choices=["python", "all"], default="python", help="all: C++ frames too"
    )
    ap.add_argument(
        "--blocks", action="store_true", help="replay the allocator's blocks at the peak too"
    )
    ap.add_argument("--dump", type=Path, help="write each run's history (gzipped JSON) here")
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
        body = {**d["body"], "stages": [d.get("stage", d["body"]["stages"][0])]}
        print(f"\n=== {where}: stage {body['stages'][0]}, recorded error {err:+.2f} %")
        print(json.dumps(body))
        try:
            dump = None if a.dump is None else a.dump / f"{where.replace(':', '_')}.json.gz"
            one(body, a.rows, a.stacks, a.blocks, dump)
        except Exception as e:  # noqa: BLE001 (one run failing must not end the others)
            print(f"failed: {e!r}"[:400])
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
