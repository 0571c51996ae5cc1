"""Real DeepSpeed ZeRO (``engine: "deepspeed"``): what ``/v1/measure`` and
``bench/validate_deepspeed.py`` both run.

The workload's module is built in fp32 on the CPU and handed to ``deepspeed.initialize`` with a
client torch optimizer (``zero_allow_untested_optimizer``), the fp16 or bf16 section the
precision names, ``zero_optimization.stage`` and the request's offload
(``zero_force_ds_cpu_optimizer: false``, so the client optimizer is kept; engine.py:2341). Knobs
come from the request's ``engine_config``, a DeepSpeed config body. The loop is the plain one a
DeepSpeed user writes and that ``calculators.engines.deepspeed`` models::

    x, y = batch()
    logits = engine(x)
    loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
    engine.backward(loss); engine.step()

(a Hugging Face model: ``loss = engine(input_ids=x, labels=x).loss``). Collectives are counted
per phase of the loop (forward, backward, step).

``resident`` is the allocation after the recorded step over the baseline read before the engine
exists, with the loop still holding ``logits``, ``loss``, ``x`` and ``y``; ``peak`` the highest
allocation in that step over the same baseline. DeepSpeed needs a real process group (it
broadcasts and reduces through it from ``initialize`` on), so it runs distributed or under
torchrun, never in the fake-group simulation.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from calculators.conventions import Optimizer, Stage
from calculators.engines.deepspeed.config import parse_config
from calculators.engines.torch.peak import TRAINER_LOOP
from measure.comms import CommCounter
from measure.engines.pytorch import make_optimizer_class
from measure.host_probe import run_probe
from measure.memory import DeviceMemory, device_memory, storage_bytes
from measure.session import Progress, drop_cublas_workspaces, release, sync
from measure.spec import StepPlan
from measure.workloads import Workload

# Set once a stage-3 engine was built in this process: DeepSpeedZeRoOffload replaced
# torch.nn.functional.linear with zero3_linear_wrap for good (partition_parameters.py:412-419),
# so no cuBLASLt workspace appears in later engines of the same process.
_linear_patched = False


def linear_patched() -> bool:
    return _linear_patched


def _quiet(_fraction: float, _message: str) -> None:
    return None


def _attribution(engine: Any, device: torch.device) -> dict[str, int]:
    """16-bit parameters (the module's, with stage 3's partitions) and the fp32 master plus the
    client optimizer's states, each storage once."""
    module: nn.Module = engine.module
    params: list[torch.Tensor] = []
    for p in module.parameters():
        params.append(p.detach())
        partition = getattr(p, "ds_tensor", None)
        if isinstance(partition, torch.Tensor):
            params.append(partition)
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    states: list[torch.Tensor] = []
    for group in getattr(inner, "param_groups", []):
        states += [p.detach() for p in group["params"]]
    # the fp32 master: stage 3 swaps its partitions into the torch optimizer only for the step
    # (zero/stage3.py fp32_partitioned_groups_flat); stages 1/2 keep them in param_groups
    for name in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups"):
        states += [t for t in getattr(engine.optimizer, name, []) if isinstance(t, torch.Tensor)]
    for state in getattr(inner, "state", {}).values():
        states += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters": storage_bytes(params, device),
        "optimizer_states": storage_bytes(states, device),
    }


def measure_stage(
    workload: Workload,
    stage: Stage,
    optimizer: Optimizer,
    device: torch.device,
    plan: StepPlan,
    config: dict[str, Any],
    seed: int = 0,
    progress: Progress | None = None,
    probe_host: bool = False,
    probe_seq_len: int | None = None,
) -> dict[str, Any]:
    """Measure one DeepSpeed stage on this rank; the process group must be initialised.
    ``probe_host``: also time ``engine(x)`` + ``engine.backward(loss)`` at a tiny batch
    (:mod:`measure.host_probe`), ``engine.step()`` untimed between repetitions (it steps the
    optimizer at the accumulation boundary, as in the timed loop)."""
    with device_memory(device) as mem:
        result = _measure(
            workload,
            stage,
            optimizer,
            device,
            plan,
            config,
            seed,
            mem,
            progress or _quiet,
            probe_host,
            probe_seq_len,
        )
    release(device)
    return result


def _measure(
    workload: Workload,
    stage: Stage,
    optimizer: Optimizer,
    device: torch.device,
    plan: StepPlan,
    config: dict[str, Any],
    seed: int,
    mem: DeviceMemory,
    progress: Progress,
    probe_host: bool = False,
    probe_seq_len: int | None = None,
) -> dict[str, Any]:
    global _linear_patched
    import deepspeed

    rank = dist.get_rank()
    torch.manual_seed(seed + rank)
    gen = torch.Generator().manual_seed(seed + rank)
    # the convention counts the workspaces the first step makes: an earlier run of this process
    # (every case of measure.validate_hf shares one) must not leave them in the baseline
    drop_cublas_workspaces(device)
    release(device)
    baseline = mem.allocated()
    baseline_requested = mem.requested()

    # transformers' Trainer keeps the loss alone (compute_loss): a calculators knob, not
    # DeepSpeed's
    config = dict(config)
    trainer = config.pop(TRAINER_LOOP, False) is True

    def forward(ds: Any, x: Any, y: Any) -> tuple[Any, Any]:
        if trainer:  # the outputs die as compute_loss returns
            return None, workload.forward(ds, x, y)[1]
        return workload.forward(ds, x, y)

    progress(0.0, "building the model")
    model = workload.build(torch.device("cpu"))  # fp32 on the CPU; DeepSpeed moves and casts it
    opt_cls, opt_kwargs = make_optimizer_class(optimizer)
    client = opt_cls(model.parameters(), **opt_kwargs)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=client, config=config)
    if stage is Stage.PARAMETERS:
        _linear_patched = True
    sync(device)
    phases: dict[str, int] = {"after_init": mem.allocated() - baseline}
    parts: dict[str, int] = {}
    x = y = logits = loss = None
    counter = CommCounter(dist.get_world_size())
    for i in range(plan.warmup_steps + 1):
        recorded = i == plan.warmup_steps
        progress(
            i / plan.total_steps, "counting collectives" if recorded else f"warm-up step {i + 1}"
        )
        if recorded:
            sync(device)
            mem.reset_peak()
        with counter if recorded else contextlib.nullcontext():
            for micro in range(plan.grad_accumulation_steps):  # DeepSpeed steps at the boundary
                x, y = workload.make_batch(device, gen)
                counter.phase = "forward"
                logits, loss = forward(engine, x, y)
                if recorded and micro == 0:
                    sync(device)
                    phases["after_forward"] = mem.allocated() - baseline
                counter.phase = "backward"
                engine.backward(loss)
                if recorded and micro == plan.grad_accumulation_steps - 1:
                    sync(device)
                    phases["after_backward"] = mem.allocated() - baseline
                counter.phase = "step"
                engine.step()
            sync(device)
    sync(device)
    peak = mem.peak()
    peak_requested = mem.peak_requested()
    resident = mem.allocated() - baseline
    requested = mem.requested() - baseline_requested
    reserved = mem.reserved()
    nvml = mem.nvml_used()
    parts.update(_attribution(engine, device))
    held = [t for t in (x, y, logits, loss) if isinstance(t, torch.Tensor)]
    held_bytes = storage_bytes(held, device) if plan.hold_outputs else 0
    if not plan.hold_outputs:
        resident -= storage_bytes(held, device)
        requested -= storage_bytes(held, device)
    skipped = int(getattr(engine, "skipped_steps", 0))
    wrapper = type(engine.optimizer).__name__

    offloaded = parse_config(config).offload_optimizer is not None  # DeepSpeed's CPU Adam
    optimizer_seconds: list[float] = []  # the timed steps' boundary steps (optimizer offload)
    t0 = time.perf_counter()
    for i in range(plan.steps):
        progress((plan.warmup_steps + 1 + i) / plan.total_steps, f"timed step {i + 1}")
        for micro in range(plan.grad_accumulation_steps):
            x, y = workload.make_batch(device, gen)
            logits, loss = forward(engine, x, y)
            engine.backward(loss)
            if offloaded and micro == plan.grad_accumulation_steps - 1:
                # the boundary: CPU Adam over the host partition, then the updated parameters'
                # copy back (and stages 1-2's all-gather), synchronised at both ends
                sync(device)
                t_step = time.perf_counter()
                engine.step()
                sync(device)
                optimizer_seconds.append(time.perf_counter() - t_step)
            else:
                engine.step()
    sync(device)
    step_time = (time.perf_counter() - t0) / plan.steps if plan.steps else None

    host_probe = None
    if probe_host:
        progress(1.0, "host probe: one short sequence per micro-step")
        training_batch = workload.make_batch(device, gen)

        def micro_step_at(batch: tuple[torch.Tensor, ...], ds: Any = engine) -> None:
            bx, by = batch
            _, probe_loss = workload.forward(ds, bx, by)
            ds.backward(probe_loss)

        host_probe = run_probe(micro_step_at, engine.step, training_batch, probe_seq_len, device)
        del training_batch, micro_step_at

    measured: dict[str, Any] = {
        "resident": resident,
        "model_state_resident": resident - held_bytes,
        "model_state_requested": requested - held_bytes,
        "baseline": baseline,
        "peak": None if peak is None else peak - baseline,
        "peak_requested": None if peak_requested is None else peak_requested - baseline_requested,
        "peak_over_baseline": None if peak is None else peak - baseline,
        **parts,
        **phases,
        "after_step": resident,
        "held_outputs": held_bytes,
        "reserved": reserved,
        "nvml_used": nvml,
        "skipped_steps": skipped,
        "loss": float(loss.item()) if isinstance(loss, torch.Tensor) else None,
        "components": {
            "engine_buffers_and_other": resident
            - held_bytes
            - parts["parameters"]
            - parts["optimizer_states"],
        },
    }
    del x, y, logits, loss, held
    if hasattr(engine, "destroy"):
        engine.destroy()
    del engine, client, model
    return {
        "engine_name": f"DeepSpeed {deepspeed.__version__} {wrapper}",
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
    }
