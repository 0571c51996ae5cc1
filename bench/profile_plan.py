"""Where a training step's time goes, for the configurations ``/v1/plan`` ranks.

For each candidate (stage, micro-batch × accumulation, activation checkpointing) this builds the
torch engine exactly as ``POST /v1/measure`` does (``measure.engines.pytorch.build_engine``: DDP,
DDP + ZeroRedundancyOptimizer, FSDP2 without / with reshard after forward), runs a few steps and
records, on rank 0:

- the step time of ``--steps`` unprofiled steps (the loop of ``measure``) and, per step, the
  forward, backward and optimizer time on the CPU and on the GPU (CUDA events on the compute
  stream);
- from ``torch.profiler`` over ``--profile-steps`` more steps (aggregated in-process, no trace
  file): device time per kernel category (GEMM, attention, element-wise / reduction, copies /
  casts / fills, NCCL, optimizer), per phase; the GPU's busy and idle time within the step; the
  NCCL time not hidden behind other kernels; kernel launches per micro-step; the CPU time of the
  engines' own annotated regions (``FSDP::…``, ``DistributedDataParallel.forward``, …) and the
  kernel time they launch; the costliest kernels;
- the collectives of one step and their bytes (``measure.comms.CommCounter``);
- the planner's prediction for the same configuration and the GEMM rate the model's matmul
  FLOPs imply over the measured GEMM kernel time.

One process per GPU under torchrun; Nd = the world size. On a GPU host::

    NCCL_NVLS_ENABLE=0 PYTHONPATH=$PWD torchrun --nproc-per-node 1 bench/profile_plan.py \\
        --out bench/results/plan_profile

Written by rank 0: ``plan_profile_nd<N>.json`` and ``.md`` in ``--out``. ``--budget-s`` bounds the
run: no candidate starts after that many seconds.

Quick check on a CPU (gloo, tiny model; the figures mean nothing, the pipeline runs)::

    PYTHONPATH=$PWD torchrun --nproc-per-node 2 bench/profile_plan.py --device cpu --tiny \\
        --gpu l4 --candidates 3:2x2 --out /tmp/plan_profile
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import os
import re
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import validate_plan  # noqa: E402

from calculators.batch import Checkpointing  # noqa: E402
from calculators.conventions import Precision, Stage  # noqa: E402
from calculators.plan import Config, OffloadChoice, predict  # noqa: E402
from calculators.speed import ATTENTION_BACKWARD_FACTOR, token_flops  # noqa: E402

# Most telling first, so that a tight --budget-s drops the least telling: FSDP2 with reshard
# and DDP across accumulation (the per-micro-step cost), then micro-batch 1, ZeRO-1,
# FSDP2 without reshard, full checkpointing.
DEFAULT_CANDIDATES = (
    "3:8x1,3:2x4,0:8x1,0:2x4,3:1x8,0:1x8,3:4x2,2:2x4,1:2x4,3:8x1:full,0:8x1:full,2:8x1"
)
PHASES = ("forward", "backward", "optimizer")
CATEGORIES = ("gemm", "attention", "elementwise_reduction", "copy_cast", "nccl", "optimizer")
MARK = "zc."  # this script's own annotations

GEMM_MARKS = ("gemm", "nvjet", "cutlass", "xmma", "wgmma", "matmul", "cublas", "s16816", "s1688")
ATTENTION_MARKS = ("flash", "fmha", "attention", "sdpa", "attn")
COPY_MARKS = ("copy", "memcpy", "memset", "cast", "chunk_cat", "catarray", "foreach", "fill")
COPY_OPS = frozenset(
    {
        "aten::copy_",
        "aten::_to_copy",
        "aten::to",
        "aten::_foreach_copy_",
        "aten::cat",
        "aten::_chunk_cat",
        "aten::split_with_sizes_copy",
        "aten::fill_",
        "aten::zero_",
        "aten::clone",
        "aten::contiguous",
        "fsdp::all_gather_copy_in",
        "fsdp::split_with_sizes_copy",
    }
)
DEVICE_ACTIVITIES = ("kernel", "gpu_memcpy", "gpu_memset")
# a rank that fails leaves the others in a collective: they give up after this, not after 10 min
COLLECTIVE_TIMEOUT = timedelta(minutes=3)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--gpu", default=None, help="GPU preset (default: from the device name)")
    model = ap.add_mutually_exclusive_group()
    model.add_argument("--hf-config", default=None, help="a config.json instead of the 1B GPT")
    model.add_argument("--tiny", action="store_true", help="a 2-layer GPT (CPU checks)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument(
        "--candidates",
        default=DEFAULT_CANDIDATES,
        help="comma list of STAGE:MICROxACCUM[:CHECKPOINTING], run in this order",
    )
    ap.add_argument("--warmup", type=int, default=2, help="warm-up steps (the last is counted)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps without the profiler")
    ap.add_argument("--profile-steps", type=int, default=2, help="steps under torch.profiler")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=60.0,
        help="start no candidate after this many seconds since the script started",
    )
    ap.add_argument("--top", type=int, default=15, help="costliest kernels kept per candidate")
    ap.add_argument("--out", default="bench/results/plan_profile")
    args = ap.parse_args(argv)
    args.engine = "torch"  # what validate_plan.spec_for reads
    args.preset = None
    args.candidates = parse_candidates(args.candidates)
    # the planner's search fields (validate_plan.plan_setup reads them)
    args.stages = tuple(sorted({int(c.stage) for c in args.candidates}))
    args.micro = tuple(sorted({c.micro_batch_size for c in args.candidates}))
    args.checkpointing = ",".join(
        sorted({c.activation_checkpointing.value for c in args.candidates})
    )
    if args.warmup < 1 or args.steps < 1 or args.profile_steps < 1:
        ap.error("--warmup, --steps and --profile-steps must be at least 1")
    return args


def parse_candidates(text: str) -> list[Config]:
    """``3:2x4,0:8x1:full`` → configurations (no offload)."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        try:
            micro, accum = (int(v) for v in parts[1].lower().split("x"))
            ckpt = Checkpointing(parts[2]) if len(parts) > 2 else Checkpointing.NONE
            out.append(Config(Stage(int(parts[0])), micro, accum, ckpt, OffloadChoice.NONE))
        except (ValueError, IndexError) as exc:
            msg = f"--candidates: {item!r} is not STAGE:MICROxACCUM[:CKPT] ({exc})"
            raise SystemExit(msg) from None
    return out


# --- the device timeline, reduced -------------------------------------------------------------


@dataclass(frozen=True)
class Activity:
    """One device activity (kernel, memcpy, memset) and where its launch came from."""

    name: str
    start_ns: int
    end_ns: int
    stream: int
    launched_ns: int  # the CPU moment of the runtime call that launched it
    thread: int  # the launching thread
    op: str  # the innermost framework op around the launch ("" where none)


@dataclass(frozen=True)
class Region:
    """A CPU-side annotated region (``record_function``)."""

    name: str
    start_ns: int
    end_ns: int
    thread: int


@dataclass
class Timeline:
    """What the profiler saw; ``sources`` counts how each activity's launch was found (the
    runtime call that launched it, else the op around it, else its own start on the device)."""

    activities: list[Activity] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    sources: dict[str, int] = field(default_factory=dict)


def timeline_from_kineto(events: Iterable[Any]) -> Timeline:
    """Device activities with their launch moment and op, and the annotated CPU regions."""
    ops: dict[int, tuple[str, int, int]] = {}  # op id -> (name, start ns, thread)
    launches: dict[int, tuple[int, int, int]] = {}  # correlation id -> (ns, thread, op id)
    device: list[Any] = []
    tl = Timeline()
    kinds: dict[str, int] = defaultdict(int)
    sources: dict[str, int] = defaultdict(int)
    for e in events:
        kind = _kind(e)
        kinds[kind] += 1
        if str(e.device_type()).endswith("CPU"):
            if kind == "user_annotation" or (kind == "cpu_op" and e.is_user_annotation()):
                tl.regions.append(Region(e.name(), e.start_ns(), e.end_ns(), e.start_thread_id()))
            elif kind == "cpu_op":
                ops[e.correlation_id()] = (e.name(), e.start_ns(), e.start_thread_id())
            elif kind in ("cuda_runtime", "cuda_driver"):
                launches[e.correlation_id()] = (
                    e.start_ns(),
                    e.start_thread_id(),
                    e.linked_correlation_id(),
                )
        elif kind in DEVICE_ACTIVITIES:
            device.append(e)
    for e in device:
        launch = launches.get(e.correlation_id())
        op = ops.get(e.linked_correlation_id() or (launch[2] if launch else 0))
        if launch is not None:
            ns, thread, source = launch[0], launch[1], "runtime"
        elif op is not None:
            ns, thread, source = op[1], op[2], "op"
        else:
            ns, thread, source = e.start_ns(), -1, "device"
        sources[source] += 1
        tl.activities.append(
            Activity(
                e.name(),
                e.start_ns(),
                e.end_ns(),
                e.device_resource_id(),
                ns,
                thread,
                op[0] if op else "",
            )
        )
    tl.kinds, tl.sources = dict(kinds), dict(sources)
    return tl


def _kind(e: Any) -> str:
    """Kineto's activity type (``kernel``, ``cpu_op``, ``cuda_runtime``, …); from the device
    and the name where this torch's events do not say."""
    if hasattr(e, "activity_type"):
        return str(e.activity_type())
    if not str(e.device_type()).endswith("CPU"):
        low = e.name().lower()
        return "gpu_memcpy" if "memcpy" in low else "gpu_memset" if "memset" in low else "kernel"
    if e.is_user_annotation():
        return "user_annotation"
    return "cuda_runtime" if e.name().startswith(("cuda", "cu")) else "cpu_op"


def category(name: str, op: str, phase: str) -> str:
    low = name.lower()
    if "nccl" in low:
        return "nccl"
    if phase == "optimizer":
        return "optimizer"
    if any(m in low for m in ATTENTION_MARKS):
        return "attention"
    if any(m in low for m in GEMM_MARKS):
        return "gemm"
    if op in COPY_OPS or any(m in low for m in COPY_MARKS):
        return "copy_cast"
    return "elementwise_reduction"


def union_ns(intervals: Iterable[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of ``intervals`` clipped to [lo, hi)."""
    total, end = 0, lo
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if e <= s or e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _region_name(name: str) -> str:
    """One name per kind of region: ``FSDP::pre_forward (blocks.3)`` and
    ``FSDP::backward_prefetch for blocks.0`` lose the module."""
    return re.sub(r"(\s*\(.*\)| for \S+)$", "", name)


class _Enclosing:
    """The innermost annotated region of a thread around a moment."""

    def __init__(self, regions: list[Region]) -> None:
        self.by_thread: dict[int, list[Region]] = defaultdict(list)
        for r in sorted(regions, key=lambda r: r.start_ns):
            self.by_thread[r.thread].append(r)
        self.starts = {t: [r.start_ns for r in rs] for t, rs in self.by_thread.items()}

    def at(self, thread: int, ns: int) -> Region | None:
        rs = self.by_thread.get(thread)
        if not rs:
            return None
        i = bisect.bisect_right(self.starts[thread], ns) - 1
        for j in range(i, max(i - 64, -1), -1):  # nesting is shallow: the nearest that holds it
            if rs[j].end_ns >= ns:
                return rs[j]
        return None


def summarize(tl: Timeline, steps: int, micro_steps: int, top: int) -> dict[str, Any]:
    """Per-step averages of the profiled steps (rank 0's timeline)."""
    marks = [r for r in tl.regions if r.name.startswith(MARK)]
    step_windows = sorted((r.start_ns, r.end_ns) for r in marks if r.name == MARK + "step")
    phase_windows = sorted(
        (r.start_ns, r.end_ns, r.name.removeprefix(MARK)) for r in marks if r.name != MARK + "step"
    )
    phase_starts = [w[0] for w in phase_windows]
    step_starts = [w[0] for w in step_windows]
    engine_regions = [r for r in tl.regions if not r.name.startswith(MARK)]
    enclosing = _Enclosing(engine_regions)

    def locate(ns: int) -> tuple[int, str]:
        i = bisect.bisect_right(step_starts, ns) - 1
        step = i if i >= 0 and ns <= step_windows[i][1] else -1
        j = bisect.bisect_right(phase_starts, ns) - 1
        phase = phase_windows[j][2] if j >= 0 and ns <= phase_windows[j][1] else "outside"
        return step, phase

    by_cat: dict[str, int] = defaultdict(int)
    by_phase_cat: dict[str, dict[str, int]] = {p: defaultdict(int) for p in (*PHASES, "outside")}
    launches: dict[str, int] = defaultdict(int)
    kernels: dict[str, list[Any]] = {}
    regions_kernel: dict[str, int] = defaultdict(int)
    regions_count: dict[str, int] = defaultdict(int)
    per_step: dict[int, list[Activity]] = defaultdict(list)
    for a in tl.activities:
        step, phase = locate(a.launched_ns)
        if step < 0:
            continue
        per_step[step].append(a)
        cat = category(a.name, a.op, phase)
        dur = a.end_ns - a.start_ns
        by_cat[cat] += dur
        by_phase_cat[phase][cat] += dur
        launches[phase] += 1
        k = kernels.setdefault(a.name, [0, 0, cat])
        k[0] += dur
        k[1] += 1
        region = enclosing.at(a.thread, a.launched_ns)
        if region is not None:
            regions_kernel[_region_name(region.name)] += dur
            regions_count[_region_name(region.name)] += 1

    busy = busy_compute = window = 0
    for i in sorted(per_step):
        acts = per_step[i]
        lo = min(a.start_ns for a in acts)
        nxt = per_step.get(i + 1)
        hi = min(a.start_ns for a in nxt) if nxt else max(a.end_ns for a in acts)
        window += hi - lo
        busy += union_ns(((a.start_ns, a.end_ns) for a in acts), lo, hi)
        busy_compute += union_ns(
            ((a.start_ns, a.end_ns) for a in acts if "nccl" not in a.name.lower()), lo, hi
        )

    # CPU time of the engines' annotated regions (outermost occurrence of each name per thread)
    region_cpu: dict[str, int] = defaultdict(int)
    region_calls: dict[str, int] = defaultdict(int)
    open_until: dict[tuple[int, str], int] = {}
    in_steps = [r for r in engine_regions if any(s <= r.start_ns <= e for s, e in step_windows)]
    for r in sorted(in_steps, key=lambda r: r.start_ns):
        key = (r.thread, _region_name(r.name))
        region_calls[key[1]] += 1
        if r.start_ns < open_until.get(key, -1):
            continue  # nested in one of the same name
        open_until[key] = r.end_ns
        region_cpu[key[1]] += r.end_ns - r.start_ns

    n = max(steps, 1)
    ms = 1e-6 / n
    micro = max(micro_steps, 1)
    regions = sorted(set(region_cpu) | set(regions_kernel), key=lambda k: -region_cpu.get(k, 0))
    return {
        "profiled_steps": steps,
        "event_kinds": tl.kinds,
        "launch_found_by": tl.sources,
        "kernel_ms": {c: by_cat.get(c, 0) * ms for c in CATEGORIES},
        "kernel_ms_by_phase": {
            p: {c: v * ms for c, v in cats.items()} for p, cats in by_phase_cat.items() if cats
        },
        "gpu_window_ms": window * ms,
        "gpu_busy_ms": busy * ms,
        "gpu_idle_ms": (window - busy) * ms,
        "nccl_exposed_ms": (busy - busy_compute) * ms,
        "launches_per_step": {p: v / n for p, v in launches.items()},
        "launches_per_micro_step": (launches["forward"] + launches["backward"]) / n / micro,
        "regions": {
            k: {
                "cpu_ms": region_cpu.get(k, 0) * ms,
                "calls": region_calls.get(k, 0) / n,
                "kernel_ms": regions_kernel.get(k, 0) * ms,
                "kernels": regions_count.get(k, 0) / n,
            }
            for k in regions
        },
        "top_kernels": [
            {"name": _short(name), "category": k[2], "ms": k[0] * ms, "calls": k[1] / n}
            for name, k in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
        ],
    }


# --- one candidate -----------------------------------------------------------------------------


class Marks:
    """CPU and GPU (CUDA event) moments of the loop; a segment is named by its closing mark."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.points: list[tuple[str, float, Any]] = []

    def mark(self, name: str) -> None:
        event = None
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self.points.append((name, time.perf_counter(), event))

    def steps(self) -> list[dict[str, Any]]:
        """Per step: wall and per-phase seconds, CPU and GPU (call after a device sync)."""
        out: list[dict[str, Any]] = []
        prev: tuple[str, float, Any] | None = None
        for point in self.points:
            name, t, ev = point
            if name == "start":
                out.append({"cpu": defaultdict(float), "gpu": defaultdict(float), "_start": point})
            elif prev is not None:
                out[-1]["cpu"][name] += t - prev[1]
                if ev is not None:
                    out[-1]["gpu"][name] += prev[2].elapsed_time(ev) / 1e3
            prev = point
        for i, s in enumerate(out):
            end = out[i + 1]["_start"] if i + 1 < len(out) else self.points[-1]
            start = s.pop("_start")
            s["cpu"]["wall"] = end[1] - start[1]
            if start[2] is not None:
                s["gpu"]["wall"] = start[2].elapsed_time(end[2]) / 1e3
            s["cpu"], s["gpu"] = dict(s["cpu"]), dict(s["gpu"])
        return out


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for r in rows for k in r}
    return {k: sum(r.get(k, 0.0) for r in rows) / len(rows) for k in sorted(keys)} if rows else {}


def gemm_flops_per_token(arch: Any, seq_len: int, ckpt: Checkpointing) -> tuple[float, float]:
    """(linear-layer, attention-score) matmul FLOPs per token of one training micro-step."""
    f = token_flops(arch, seq_len, ckpt)
    attn = f.attention_forward * (1 + ATTENTION_BACKWARD_FACTOR)
    if ckpt is not Checkpointing.NONE:
        attn += f.attention_forward  # full and selective both recompute the attention core
    return f.total - attn, attn


def profile_candidate(
    args: argparse.Namespace,
    model_body: dict[str, Any],
    arch: Any,
    nd: int,
    c: Config,
    device: Any,
) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    from measure.comms import CommCounter
    from measure.engines.pytorch import build_engine
    from measure.spec import parse_spec
    from measure.workloads import build_workload

    ms = parse_spec(validate_plan.spec_for(args, model_body, nd, c))
    workload = build_workload(ms)
    rank = dist.get_rank()
    torch.manual_seed(ms.seed + rank)
    gen = torch.Generator().manual_seed(ms.seed + rank)
    batches = [workload.make_batch(device, gen) for _ in range(c.grad_accumulation_steps)]
    t_build = time.perf_counter()
    model = workload.build(device)
    engine = build_engine(
        model,
        workload.shard_units(model),
        c.stage,
        ms.precision,
        ms.optimizer,
        device,
        simulated=False,
    )
    cuda = device.type == "cuda"
    build_s = time.perf_counter() - t_build
    held: list[Any] = []
    counter: CommCounter | None = None

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def phase(name: str) -> None:
        if counter is not None:
            counter.phase = name

    def step(marks: Marks | None) -> None:
        def mark(name: str) -> None:
            if marks is not None:
                marks.mark(name)

        mark("start")
        with record_function(MARK + "step"):
            for x, y in batches:
                phase("forward")
                with record_function(MARK + "forward"), engine.autocast():
                    out, loss = workload.forward(engine.module, x, y)
                held.clear()
                mark("forward")
                phase("backward")
                with record_function(MARK + "backward"):
                    loss.backward()
                mark("backward")
                held.extend((out, loss))
                del out, loss
            phase("step")
            with record_function(MARK + "optimizer"):
                engine.optimizer.step()
                engine.optimizer.zero_grad(set_to_none=True)
            mark("optimizer")

    for _ in range(args.warmup - 1):
        step(None)
    counter = CommCounter(dist.get_world_size())
    with counter:
        step(None)
    collectives = counter.collectives()
    counter_bytes = counter.sent_bytes_per_rank
    counter = None
    sync()

    timed = Marks(cuda)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(timed)
    sync()
    step_s = (time.perf_counter() - t0) / args.steps

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    profiled = Marks(cuda)
    with profile(activities=activities) as prof:
        for _ in range(args.profile_steps):
            step(profiled)
        sync()
        t_exit = time.perf_counter()
    t_reduce = time.perf_counter()
    kineto = prof.profiler.kineto_results
    tl = timeline_from_kineto(kineto.events() if kineto is not None else [])
    summary = summarize(tl, args.profile_steps, c.grad_accumulation_steps, args.top)
    reduce_s = time.perf_counter() - t_reduce
    peak = torch.cuda.max_memory_allocated(device) if cuda else None

    timed_steps, profiled_steps = timed.steps(), profiled.steps()
    tokens = c.micro_batch_size * c.grad_accumulation_steps * ms.seq_len
    result: dict[str, Any] = {
        "engine_name": engine.name,
        "tokens_per_step": tokens,
        "build_s": build_s,
        "step_s": step_s,
        "timed": {"cpu": _mean([s["cpu"] for s in timed_steps])}
        | ({"gpu": _mean([s["gpu"] for s in timed_steps])} if cuda else {}),
        "profiled": {"cpu": _mean([s["cpu"] for s in profiled_steps])}
        | ({"gpu": _mean([s["gpu"] for s in profiled_steps])} if cuda else {}),
        "collectives": collectives,
        "sent_bytes_per_rank": counter_bytes,
        "profile": summary,
        "profiler_exit_s": t_reduce - t_exit,
        "profile_reduce_s": reduce_s,
        "peak_allocated": peak,
    }
    arch = workload.architecture or arch
    if arch is not None:
        linear, attention = gemm_flops_per_token(arch, ms.seq_len, c.activation_checkpointing)
        result["matmul_flops_per_step"] = {
            "linear": linear * tokens,
            "attention": attention * tokens,
        }
    return result  # the engine, model and batches die with this frame; main frees them


def rates(run: dict[str, Any], peak_flops: float | None) -> None:
    """GEMM and attention rates: the model's matmul FLOPs over the measured kernel time."""
    flops = run.get("matmul_flops_per_step")
    kernel = run["profile"]["kernel_ms"]
    if not flops:
        return
    for key, cat in (("linear", "gemm"), ("attention", "attention")):
        seconds = kernel.get(cat, 0.0) / 1e3
        if seconds > 0:
            rate = flops[key] / seconds
            run[f"{cat}_tflops"] = rate / 1e12
            if peak_flops:
                run[f"{cat}_fraction_of_peak"] = rate / peak_flops


# --- driver ------------------------------------------------------------------------------------


def init_distributed(device_kind: str) -> Any:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device is visible: give --device cpu for a CPU check")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device, timeout=COLLECTIVE_TIMEOUT)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
    return device


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse(argv)
    import torch
    import torch.distributed as dist

    from calculators.architecture import count_params
    from calculators.gpus import get_gpu, gpu_for_device_name
    from measure.engines.pytorch import half_dtype
    from measure.runner import environment
    from measure.session import runtime_warmup

    device = init_distributed(args.device)
    nd, rank = dist.get_world_size(), dist.get_rank()
    env = environment(device)
    gpu = get_gpu(args.gpu) if args.gpu else gpu_for_device_name(env["device_name"])
    arch, model_body = validate_plan.architecture(args)
    runtime_warmup(device, half_dtype(Precision.MIXED_BF16))
    report: dict[str, Any] = {
        "model": count_params(arch),
        "model_body": {"hf_config": args.hf_config} if args.hf_config else model_body,
        "nd": nd,
        "gpu": None if gpu is None else gpu.name,
        "peak_flops_16bit": None if gpu is None else gpu.peak_flops_16bit,
        "environment": env,
        "seq_len": args.seq_len,
        "warmup": args.warmup,
        "steps": args.steps,
        "profile_steps": args.profile_steps,
        "budget_s": args.budget_s,
        "skipped_for_budget": [],
        "wall_s": 0.0,
        "runs": [],
    }
    suffix = "_tiny" if args.tiny else f"_{Path(args.hf_config).stem}" if args.hf_config else ""
    stem = Path(args.out) / f"plan_profile_nd{nd}{suffix}"
    if rank == 0:
        stem.parent.mkdir(parents=True, exist_ok=True)
        print(f"{report['model']:,} params, Nd = {nd} x {env['device_name']}", flush=True)
    try:
        for c in args.candidates:
            label = validate_plan.config_label(c)
            go = [time.perf_counter() - start < args.budget_s]
            dist.broadcast_object_list(go, src=0)  # every rank takes rank 0's decision
            if not go[0]:
                report["skipped_for_budget"].append(label)
                continue
            t0 = time.perf_counter()
            row: dict[str, Any] = {"config": label, "config_fields": _fields(c)}
            if gpu is not None:
                args.per_gpu_batch = c.micro_batch_size * c.grad_accumulation_steps
                _, st, _ = predict(validate_plan.plan_setup(args, arch, gpu, nd), c)
                row["predicted"] = {**asdict(st), "total": st.total}
            try:
                row.update(profile_candidate(args, model_body, arch, nd, c, device))
            except torch.OutOfMemoryError as exc:  # the same on every rank: none waits
                row["error"] = f"out of memory: {str(exc).splitlines()[0]}"
            gc.collect()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            if "profile" in row:
                rates(row, gpu.peak_flops_16bit if gpu is not None else None)
            row["wall_s"] = time.perf_counter() - t0
            report["runs"].append(row)
            report["wall_s"] = time.perf_counter() - start
            if rank == 0:
                print(_progress(row, report["wall_s"]), flush=True)
                write(stem, report)  # after each candidate: a later crash keeps these
    except BaseException:
        # no barrier: the other ranks wait in a collective this rank left; torchrun ends them
        if rank == 0:
            write(stem, report)
        raise
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        report["wall_s"] = time.perf_counter() - start
        write(stem, report)
        print(markdown(report))
    return 0


def write(stem: Path, report: dict[str, Any]) -> None:
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(report))


def _fields(c: Config) -> dict[str, Any]:
    return {
        "stage": int(c.stage),
        "micro_batch_size": c.micro_batch_size,
        "grad_accumulation_steps": c.grad_accumulation_steps,
        "activation_checkpointing": c.activation_checkpointing.value,
    }


def _progress(row: dict[str, Any], so_far: float) -> str:
    if "error" in row:
        return f"  {row['config']:36s} {row['error']}"
    pred = row.get("predicted", {}).get("total")
    p = f"predicted {pred:.4f} s  " if pred is not None else ""
    return (
        f"  {row['config']:36s} {p}measured {row['step_s']:.4f} s/step  "
        f"({row['wall_s']:.1f} s wall, {so_far:.0f} s so far)"
    )


def _f(v: Any, spec: str = ".1f") -> str:
    return "—" if v is None else format(v, spec)


def _rows(report: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return (r for r in report["runs"] if "profile" in r)


def markdown(r: dict[str, Any]) -> str:
    peak = r["peak_flops_16bit"]
    lines = [
        f"### Where the step goes: {r['model']:,} parameters, Nd = {r['nd']} × "
        f"{r['environment']['device_name']} (torch {r['environment']['torch']}, "
        f"seq {r['seq_len']})",
        "",
        f"Measured: step time over {r['steps']} unprofiled steps after {r['warmup']} warm-ups "
        "(phase times from the same steps); profiled: the mean step under torch.profiler, over "
        f"{r['profile_steps']} steps whose kernels give the rest (rank 0), per optimizer step "
        "in ms. "
        "GPU phase times are CUDA events on the compute stream; idle = the step's GPU window "
        "minus the union of all kernels; NCCL exposed = kernel union minus the union without "
        "NCCL. GEMM rate = the model's linear-layer FLOPs / GEMM kernel time"
        + (f" (fraction of the {peak / 1e12:.0f} TFLOP/s dense peak)." if peak else "."),
        "",
        "| configuration | predicted s | measured s | profiled s | fwd GPU/CPU | bwd GPU/CPU "
        "| opt GPU/CPU "
        "| GEMM (TFLOP/s, peak) | attention | elementwise | copy/cast | NCCL (exposed) "
        "| optimizer | GPU idle | launches / micro | sent MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in r["runs"]:
        if "profile" not in run:
            lines.append(f"| {run['config']} | {run.get('error', '')} |" + " |" * 14)
            continue
        p, k = run["profile"], run["profile"]["kernel_ms"]
        gpu = run["timed"].get("gpu", {})
        cpu = run["timed"]["cpu"]

        def ph(name: str, gpu: dict[str, float] = gpu, cpu: dict[str, float] = cpu) -> str:
            g = gpu.get(name)
            return f"{_f(None if g is None else g * 1e3)} / {cpu.get(name, 0) * 1e3:.1f}"

        prof_s = run["profiled"].get("gpu", run["profiled"]["cpu"])["wall"]
        frac = run.get("gemm_fraction_of_peak")
        gemm = f"{k['gemm']:.1f} ({_f(run.get('gemm_tflops'), '.0f')}" + (
            f", {frac:.0%})" if frac is not None else ")"
        )
        lines.append(
            f"| {run['config']} | {_f(run.get('predicted', {}).get('total'), '.4f')} "
            f"| {run['step_s']:.4f} | {prof_s:.4f} "
            f"| {ph('forward')} | {ph('backward')} | {ph('optimizer')} "
            f"| {gemm} | {k['attention']:.1f} | {k['elementwise_reduction']:.1f} "
            f"| {k['copy_cast']:.1f} | {k['nccl']:.1f} ({p['nccl_exposed_ms']:.1f}) "
            f"| {k['optimizer']:.1f} | {p['gpu_idle_ms']:.1f} of {p['gpu_window_ms']:.1f} "
            f"| {p['launches_per_micro_step']:.0f} | {run['sent_bytes_per_rank'] / 1e6:.0f} |"
        )
    lines += [
        "",
        "Per micro-step (forward + backward, ms): kernel time by category, the engine's "
        "annotated regions (CPU ms / kernel ms launched inside), and GPU idle of the whole step "
        "divided by the micro-steps.",
        "",
        "| configuration | fwd+bwd GPU | GEMM | attention | elementwise | copy/cast | NCCL "
        "| idle / micro | costliest engine regions (CPU / kernel ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in _rows(r):
        p = run["profile"]
        m = run["config_fields"]["grad_accumulation_steps"]
        cats: dict[str, float] = defaultdict(float)
        for phase in ("forward", "backward"):
            for cat, v in p["kernel_ms_by_phase"].get(phase, {}).items():
                cats[cat] += v / m
        gpu = run["timed"].get("gpu", {})
        fb = (gpu.get("forward", 0) + gpu.get("backward", 0)) * 1e3 / m if gpu else None
        regions = sorted(p["regions"].items(), key=lambda kv: -kv[1]["cpu_ms"])[:3]
        reg = "; ".join(
            f"{name} {v['cpu_ms'] / m:.1f}/{v['kernel_ms'] / m:.1f}" for name, v in regions
        )
        lines.append(
            f"| {run['config']} | {_f(fb)} | {cats['gemm']:.1f} | {cats['attention']:.1f} "
            f"| {cats['elementwise_reduction']:.1f} | {cats['copy_cast']:.1f} "
            f"| {cats['nccl']:.1f} | {p['gpu_idle_ms'] / m:.1f} | {reg} |"
        )
    if r["skipped_for_budget"]:
        lines += ["", "Not run (budget): " + "; ".join(r["skipped_for_budget"]) + "."]
    lines += ["", f"Wall time: {r['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
