"""One stage measured on one rank: build, warm up, count collectives, probe memory, time."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from calculators.conventions import Optimizer, Precision, Stage
from measure.comms import CommCounter
from measure.engines import build_engine
from measure.memory import DeviceMemory, attribution, device_memory
from measure.workloads import Workload

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class StepPlan:
    """How many steps of each kind one stage runs.

    Attributes:
        warmup_steps: steps before anything is recorded (Adam states and DDP's rebuilt buckets
            appear here).
        steps: timed steps after the recorded ones.
        grad_accumulation_steps: micro-batches per optimizer step.
        hold_outputs: keep the last logits and loss referenced between steps, as a loop that
            rebinds them on the next iteration does; by default they are deleted.
    """

    warmup_steps: int = 2
    steps: int = 2
    grad_accumulation_steps: int = 1
    hold_outputs: bool = True


def runtime_warmup(device: torch.device, dtype: torch.dtype | None) -> None:
    """Run a tiny forward/backward so that per-thread runtime workspaces (cuBLAS handles on the
    main and the autograd thread) exist before the baseline is read."""
    if device.type != "cuda":
        return
    lin = torch.nn.Linear(64, 64, device=device)
    x = torch.randn(8, 64, device=device, requires_grad=True)
    for dt in {dtype, None}:
        ctx = torch.autocast("cuda", dtype=dt) if dt is not None else contextlib.nullcontext()
        with ctx:
            y = lin(x) @ lin.weight
        y.float().sum().backward()
    del lin, x, y
    torch.cuda.synchronize(device)


def release(device: torch.device, settle_s: float = 5.0) -> None:
    """Free what the last stage left and wait until the allocator stops shrinking.

    ProcessGroupNCCL keeps each asynchronous collective's tensors (DDP's buckets among them)
    until its watchdog thread sees the work complete, so they die a little after the engine
    that owned them; reading the next stage's baseline before that would charge it to them.
    """
    gc.collect()
    if device.type != "cuda":
        return
    torch.cuda.synchronize(device)
    last, stable, deadline = -1, 0, time.perf_counter() + settle_s
    while stable < 10 and time.perf_counter() < deadline:  # 1 s without change
        gc.collect()
        now = torch.cuda.memory_allocated(device)
        stable = stable + 1 if now == last else 0
        last = now
        time.sleep(0.1)
    torch.cuda.empty_cache()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_stage(
    workload: Workload,
    stage: Stage,
    precision: Precision,
    optimizer: Optimizer,
    device: torch.device,
    simulated: bool,
    plan: StepPlan,
    seed: int = 0,
) -> dict[str, Any]:
    """Measure one stage on this rank; the process group must already be initialised."""
    with device_memory(device) as mem:
        result = _measure(workload, stage, precision, optimizer, device, simulated, plan, seed, mem)
    release(device)  # the engine, model and batches died with _measure's frame
    return result


def _measure(
    workload: Workload,
    stage: Stage,
    precision: Precision,
    optimizer: Optimizer,
    device: torch.device,
    simulated: bool,
    plan: StepPlan,
    seed: int,
    mem: DeviceMemory,
) -> dict[str, Any]:
    torch.manual_seed(seed + dist.get_rank())
    gen = torch.Generator().manual_seed(seed + dist.get_rank())
    batches = [workload.make_batch(device, gen) for _ in range(plan.grad_accumulation_steps)]
    release(device)
    baseline = mem.allocated()
    baseline_requested = mem.requested()

    model = workload.build(device)
    units = model.shard_units()  # type: ignore[operator]
    engine = build_engine(model, units, stage, precision, optimizer, device, simulated)
    _sync(device)
    phases: dict[str, int] = {"after_init": mem.allocated()}

    held: list[torch.Tensor] = []

    def step(probe: Callable[[str], None] | None = None) -> None:
        for i, (x, y) in enumerate(batches):
            with engine.autocast():
                out = engine.module(x)
                loss = workload.loss(out, y)
            held.clear()  # a loop rebinding ``out``/``loss`` frees the previous ones now
            if probe is not None and i == 0:
                probe("after_forward")
            loss.backward()
            if plan.hold_outputs:
                held.extend((out, loss))
            del out, loss
        if probe is not None:
            probe("after_backward")
        engine.optimizer.step()
        if probe is not None:
            probe("after_step")
        engine.optimizer.zero_grad(set_to_none=True)
        if probe is not None:
            probe("after_zero_grad")

    for _ in range(plan.warmup_steps):
        step()
    _sync(device)

    counter = CommCounter(dist.get_world_size())
    with counter:
        step()
    _sync(device)

    parts: dict[str, int] = {}

    def probe(phase: str) -> None:
        _sync(device)
        phases[phase] = mem.allocated()
        if phase == "after_zero_grad":
            parts["requested"] = mem.requested()
            parts["held_outputs"] = sum(t.untyped_storage().nbytes() for t in held)
        if phase == "after_backward":
            parts["gradients"] = attribution(engine.module, engine.optimizer, device)["gradients"]
        elif phase == "after_step":
            found = attribution(engine.module, engine.optimizer, device)
            parts["parameters"] = found["parameters"]
            parts["optimizer_states"] = found["optimizer_states"]

    mem.reset_peak()
    step(probe)
    _sync(device)
    peak = mem.peak()
    reserved = mem.reserved()
    nvml = mem.nvml_used()

    t0 = time.perf_counter()
    for _ in range(plan.steps):
        step()
    _sync(device)
    step_time = (time.perf_counter() - t0) / plan.steps if plan.steps else None

    resident = phases["after_zero_grad"]
    held_bytes = parts["held_outputs"]  # the loop's last logits and loss, not the engine's
    kept = resident - baseline - held_bytes
    measured: dict[str, Any] = {
        "resident": resident,
        "model_state_resident": kept,
        "model_state_requested": parts.pop("requested") - baseline_requested - held_bytes,
        "baseline": baseline,
        "peak": peak,
        "peak_over_baseline": None if peak is None else peak - baseline,
        **parts,
        **{k: v for k, v in phases.items() if k != "after_zero_grad"},
        "reserved": reserved,
        "nvml_used": nvml,
        "components": {
            "engine_buffers_and_other": kept - parts["parameters"] - parts["optimizer_states"],
        },
    }
    result = {
        "engine_name": engine.name,
        "measured": measured,
        "collectives": counter.collectives(),
        "measured_sent_bytes_per_rank": counter.sent_bytes_per_rank,
        "step_time_s": step_time,
    }
    return result
