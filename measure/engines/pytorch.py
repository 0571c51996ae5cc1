"""PyTorch's own ZeRO-like engines, as a typical training script sets them up, and one stage
measured on one rank (build, warm up, count collectives, probe memory per phase, time).

- stage 0: ``DistributedDataParallel`` over fp32 parameters with autocast (mixed precision);
- stage 1: the same plus ``ZeroRedundancyOptimizer(optimizer_class=Adam)``;
- stage 2 / 3: FSDP2 ``fully_shard`` on every block, then the root, with
  ``MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32)`` (or the 16-bit dtype where
  the request's ``engine_config`` decides ``reduce_dtype``) and ``reshard_after_forward``
  False / True.

``fp32`` uses no autocast and no policy; pure ``bf16`` casts the parameters to bf16.
Where the request's ``engine_config`` says ``convert_outputs_to_fp32`` (and the precision is
mixed), forward is wrapped before the engine wraps the model, as accelerate's ``prepare_model``
does: it runs under autocast and returns every 16-bit tensor of its output as an fp32 copy.
In a simulated world (the fake process group) DDP gets a communication hook that all-reduces
the bucket in place, because the fake group's work objects carry no result for the Reducer's
built-in hook; it is the same all-reduce, divided by N first as the built-in one divides.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from calculators.conventions import Optimizer, Precision, Stage
from calculators.engines.torch.config import REDUCE_DTYPE, offloads
from calculators.engines.torch.peak import CONVERT_OUTPUTS, TRAINER_LOOP
from calculators.errors import InputError
from calculators.traffic import GradSync
from measure.comms import CommCounter
from measure.host_probe import run_probe
from measure.memory import DeviceMemory, attribution, device_memory
from measure.session import Progress, release, sync
from measure.spec import MeasureSpec
from measure.workloads import Workload

LEARNING_RATE = 1e-4


def half_dtype(precision: Precision) -> torch.dtype | None:
    return {
        Precision.MIXED_BF16: torch.bfloat16,
        Precision.MIXED_FP16: torch.float16,
        Precision.BF16: torch.bfloat16,
    }.get(precision)


def make_optimizer_class(
    optimizer: Optimizer,
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    if optimizer is Optimizer.ADAM:
        return torch.optim.Adam, {"lr": LEARNING_RATE}
    if optimizer is Optimizer.ADAMW:
        return torch.optim.AdamW, {"lr": LEARNING_RATE}
    if optimizer is Optimizer.SGD:
        return torch.optim.SGD, {"lr": LEARNING_RATE}
    if optimizer is Optimizer.SGD_MOMENTUM:
        return torch.optim.SGD, {"lr": LEARNING_RATE, "momentum": 0.9}
    raise InputError("optimizer", "the torch engine runs adam, adamw, sgd and sgd_momentum")


@dataclass
class Engine:
    """A wrapped module, its optimizer, and the autocast context forward runs in."""

    stage: Stage
    name: str
    module: nn.Module
    optimizer: torch.optim.Optimizer
    autocast: Callable[[], contextlib.AbstractContextManager[Any]]


def _sim_allreduce_hook(world: int) -> Callable[[Any, Any], torch.futures.Future[torch.Tensor]]:
    # no annotations: DDP's _check_comm_hook compares them with dist.GradBucket / Future
    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        tensor = bucket.buffer()
        tensor.div_(world)
        fut = dist.all_reduce(tensor, async_op=True).get_future()
        return fut.then(lambda _f: tensor)

    return hook


def root_reshards_after_forward() -> bool:
    """Whether this torch's FSDP2 honours an explicit ``reshard_after_forward=True`` on the root.

    Recent ``_fsdp_state.FSDPState`` records ``_auto_reshard_after_forward`` and keeps the root
    unsharded only when the flag was defaulted; older releases never reshard the root.
    """
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    return hasattr(FSDPState(), "_auto_reshard_after_forward")


def _to_fp32(value: Any) -> Any:
    """accelerate's ``convert_to_fp32``: every fp16/bf16 tensor in a (nested) output as
    ``tensor.float()``; a transformers ``ModelOutput`` (a mapping) rebuilt with them."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if isinstance(value, Mapping):
        return type(value)(**{k: _to_fp32(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return type(value)(_to_fp32(v) for v in value)
    return value


def wrap_forward_as_accelerate(model: nn.Module, device_type: str, half: torch.dtype) -> None:
    """``model.forward`` replaced as accelerate's ``Accelerator.prepare_model`` replaces it
    under mixed precision (``convert_outputs_to_fp32(autocast(forward))``), before any engine
    wraps the model: the engines' hooks run around it."""
    inner = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=half):
            out = inner(*args, **kwargs)
        return _to_fp32(out)

    setattr(model, "forward", forward)  # noqa: B010 (an instance attribute, as accelerate sets)


def build_engine(
    model: nn.Module,
    shard_units: list[nn.Module],
    stage: Stage,
    precision: Precision,
    optimizer: Optimizer,
    device: torch.device,
    simulated: bool,
    reduce_in_half: bool = False,
    offload: bool = False,
    convert_outputs: bool = False,
) -> Engine:
    """The engine of ``stage``; ``reduce_in_half``: FSDP2 reduce-scatters in the 16-bit
    param dtype instead of fp32 (mixed precision only); ``offload``: FSDP2 with
    ``CPUOffloadPolicy`` (the shards, their gradients and the optimizer on the CPU);
    ``convert_outputs``: accelerate's mixed-precision forward
    (:func:`wrap_forward_as_accelerate`, mixed precision only)."""
    world = dist.get_world_size()
    half = half_dtype(precision)
    opt_cls, opt_kwargs = make_optimizer_class(optimizer)
    if precision is Precision.BF16:
        model.to(torch.bfloat16)
    mixed = precision.is_mixed
    if convert_outputs and mixed:
        assert half is not None
        wrap_forward_as_accelerate(model, device.type, half)

    def autocast() -> contextlib.AbstractContextManager[Any]:
        if mixed and stage <= Stage.OPTIMIZER:
            assert half is not None
            return torch.autocast(device.type, dtype=half)
        return contextlib.nullcontext()

    if stage <= Stage.OPTIMIZER:
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
        if simulated:
            ddp.register_comm_hook(None, _sim_allreduce_hook(world))
        if stage is Stage.NONE:
            opt: torch.optim.Optimizer = opt_cls(ddp.parameters(), **opt_kwargs)
            name = "DistributedDataParallel"
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=opt_cls, **opt_kwargs)
            name = "DistributedDataParallel + ZeroRedundancyOptimizer"
        return Engine(stage, name, ddp, opt, autocast)

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": stage is Stage.PARAMETERS}
    if offload:
        # pinned host shards (the default): fully_shard moves each unit to the device, shards it
        # and copies the shards to host memory; the optimizer is then built on them
        kwargs["offload_policy"] = CPUOffloadPolicy()
    if mixed:
        reduce = half if reduce_in_half else torch.float32
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=reduce)
    for unit in shard_units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    opt = opt_cls(model.parameters(), **opt_kwargs)
    flag = "True" if stage is Stage.PARAMETERS else "False"
    policy = ", offload_policy=CPUOffloadPolicy()" if offload else ""
    name = f"FSDP2 fully_shard(reshard_after_forward={flag}{policy})"
    return Engine(stage, name, model, opt, autocast)


# --- one stage on one rank ---------------------------------------------------------------------

# The CPU has no allocator counter: LiveStorages sums the storages that ops create while it
# watches. That holds for what stays alive between steps (resident, parameters, gradients,
# optimizer states), but inside a step it can read less than is alive (FSDP2's after_backward
# read below resident), so phase figures are reported on CUDA only.
CPU_PHASES_NOTE = (
    "CPU mode checks what the engine keeps between steps (resident, parameters, gradients, "
    "optimizer states) and the collectives' bytes; it does not measure peak or the phase "
    "figures (after_forward, after_backward, after_step), CUDA workspaces, the caching "
    "allocator's rounding or step times of a GPU"
)


def measure_stage(
    workload: Workload,
    stage: Stage,
    spec: MeasureSpec,
    device: torch.device,
    simulated: bool,
    progress: Progress,
    probe_host: bool = False,
    probe_seq_len: int | None = None,
) -> dict[str, Any]:
    """Measure one stage on this rank; the process group must already be initialised.
    ``probe_host``: also time the micro-step at a tiny batch (:mod:`measure.host_probe`) of at
    most ``probe_seq_len`` tokens."""
    with device_memory(device) as mem:
        result = _measure(
            workload, stage, spec, device, simulated, mem, progress, probe_host, probe_seq_len
        )
    release(device)  # the engine, model and batches died with _measure's frame
    return result


def _measure(
    workload: Workload,
    stage: Stage,
    spec: MeasureSpec,
    device: torch.device,
    simulated: bool,
    mem: DeviceMemory,
    progress: Progress,
    probe_host: bool = False,
    probe_seq_len: int | None = None,
) -> dict[str, Any]:
    plan = spec.plan
    torch.manual_seed(spec.seed + dist.get_rank())
    gen = torch.Generator().manual_seed(spec.seed + dist.get_rank())
    batches = [workload.make_batch(device, gen) for _ in range(plan.grad_accumulation_steps)]
    release(device)
    baseline = mem.allocated()
    baseline_requested = mem.requested()

    progress(0.0, "building the model")
    model = workload.build(device)
    offloaded = offloads(spec.offload)
    engine = build_engine(
        model,
        workload.shard_units(model),
        stage,
        spec.precision,
        spec.optimizer,
        device,
        simulated,
        reduce_in_half=spec.engine_config.get(REDUCE_DTYPE) is not None,
        offload=offloaded,
        convert_outputs=spec.engine_config.get(CONVERT_OUTPUTS) is True,
    )
    sync(device)
    phases: dict[str, int] = {"after_init": mem.allocated()}

    held: list[torch.Tensor] = []
    trainer = spec.engine_config.get(TRAINER_LOOP) is True  # transformers' Trainer

    def reduces(i: int) -> contextlib.AbstractContextManager[Any]:
        """grad_sync per_step: DDP's no_sync on all but the last micro-step."""
        ddp = engine.module
        deferred = spec.grad_sync is GradSync.PER_STEP and i < len(batches) - 1
        if deferred and isinstance(ddp, nn.parallel.DistributedDataParallel):
            return ddp.no_sync()
        return contextlib.nullcontext()

    optimizer_seconds: list[float] = []  # the timed steps' host optimizer steps (offload)

    def step(probe: Callable[[str], None] | None = None, timed: bool = False) -> None:
        for i, (x, y) in enumerate(batches):
            with reduces(i):  # forward and backward: DDP reads the flag in both
                with engine.autocast():
                    if trainer:  # compute_loss returns the loss alone: the outputs die here
                        out, loss = None, workload.forward(engine.module, x, y)[1]
                    else:
                        out, loss = workload.forward(engine.module, x, y)
                held.clear()  # a loop rebinding ``out``/``loss`` frees the previous ones now
                if probe is not None and i == 0:
                    probe("after_forward")
                loss.backward()
            if plan.hold_outputs and out is not None:
                held.extend((out, loss))
            del out, loss
        if probe is not None:
            probe("after_backward")
        if timed and offloaded:
            # CPUOffloadPolicy: the step runs on the host shards, on this thread, once FSDP2's
            # final callback has waited for the gradients' copies to the host (nothing to sync)
            t_step = time.perf_counter()
            engine.optimizer.step()
            optimizer_seconds.append(time.perf_counter() - t_step)
        else:
            engine.optimizer.step()
        if probe is not None:
            probe("after_step")
        engine.optimizer.zero_grad(set_to_none=True)
        if probe is not None:
            probe("after_zero_grad")

    total = plan.total_steps
    for i in range(plan.warmup_steps):
        progress(i / total, f"warm-up step {i + 1} of {plan.warmup_steps}")
        step()
    sync(device)

    progress(plan.warmup_steps / total, "counting collectives")
    counter = CommCounter(dist.get_world_size())
    with counter:
        step()
    sync(device)

    parts: dict[str, int] = {}

    phase_peaks: dict[str, int] = {}
    requested_peaks: list[int] = []  # the same for the bytes the tensors asked for
    peak_names = {"after_forward": "forward", "after_backward": "backward", "after_step": "step"}

    def probe(phase: str) -> None:
        sync(device)
        phases[phase] = mem.allocated()
        if phase in peak_names and cuda:
            # the highest allocation since the previous probe: which moment holds the peak
            phase_peaks[peak_names[phase]] = max(mem.peak() or 0, phases[phase])
            requested_peaks.append(max(mem.peak_requested() or 0, mem.requested()))
            mem.reset_peak()
        if phase == "after_zero_grad":
            parts["requested"] = mem.requested()
            parts["held_outputs"] = sum(t.untyped_storage().nbytes() for t in held)
        if phase == "after_backward":
            parts["gradients"] = attribution(engine.module, engine.optimizer, device)["gradients"]
        elif phase == "after_step":
            found = attribution(engine.module, engine.optimizer, device)
            parts["parameters"] = found["parameters"]
            parts["optimizer_states"] = found["optimizer_states"]

    cuda = device.type == "cuda"
    mem.reset_peak()
    step(probe)
    sync(device)
    peak = max([mem.peak() or 0, *phase_peaks.values()]) if cuda else None
    peak_requested = max([mem.peak_requested() or 0, *requested_peaks]) if cuda else None
    reserved = mem.reserved()
    nvml = mem.nvml_used()

    t0 = time.perf_counter()
    for i in range(plan.steps):
        progress((plan.warmup_steps + 1 + i) / total, f"timed step {i + 1} of {plan.steps}")
        step(timed=True)
    sync(device)
    step_time = (time.perf_counter() - t0) / plan.steps if plan.steps else None

    host_probe = None
    if probe_host:
        progress(1.0, "host probe: one short sequence per micro-step")

        def micro_step_at(batch: tuple[torch.Tensor, ...]) -> None:
            x, y = batch
            with engine.autocast():
                _, loss = workload.forward(engine.module, x, y)
            loss.backward()

        def after() -> None:
            engine.optimizer.zero_grad(set_to_none=True)

        host_probe = run_probe(micro_step_at, after, batches[0], probe_seq_len, device)

    resident = phases["after_zero_grad"]
    held_bytes = parts["held_outputs"]  # the loop's last logits and loss, not the engine's
    kept = resident - baseline - held_bytes
    measured: dict[str, Any] = {
        "resident": resident,
        "model_state_resident": kept,
        "model_state_requested": parts.pop("requested") - baseline_requested - held_bytes,
        "baseline": baseline,
        "peak": peak,
        "peak_requested": peak_requested,
        "peak_over_baseline": None if peak is None else peak - baseline,
        **parts,
        **{
            k: v
            for k, v in phases.items()
            if k != "after_zero_grad" and (cuda or k == "after_init")
        },
        "reserved": reserved,
        "nvml_used": nvml,
        "components": {
            "engine_buffers_and_other": kept - parts["parameters"] - parts["optimizer_states"],
        },
    }
    if cuda:  # forward: to the first micro-batch's loss; backward: to the last backward's end
        measured["phase_peaks"] = phase_peaks
    return {
        "engine_name": engine.name,
        "measured": measured,
        "collectives": counter.collectives(),
        "measured_sent_bytes_per_rank": counter.sent_bytes_per_rank,
        "step_time_s": step_time,
        "host_probe": host_probe,
        **(
            {"host_optimizer_step_s": statistics.median(optimizer_seconds)}
            if optimizer_seconds
            else {}
        ),
        "notes": [] if cuda else [CPU_PHASES_NOTE],
    }
