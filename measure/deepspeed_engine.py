"""Real DeepSpeed ZeRO (``engine: "deepspeed"``), run as ``bench/validate_deepspeed.py`` runs it.

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

``resident`` is the allocation after the recorded step over the baseline read before the engine
exists, with the loop still holding ``logits``, ``loss``, ``x`` and ``y``; ``peak`` the highest
allocation in that step over the same baseline. DeepSpeed needs a real process group (it
broadcasts and reduces through it from ``initialize`` on), so it runs distributed or under
torchrun, never in the fake-group simulation.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from calculators.conventions import Optimizer, Precision, Stage
from calculators.engines.deepspeed.config import parse_config
from calculators.errors import InputError
from measure.comms import CommCounter
from measure.engines import make_optimizer_class
from measure.memory import DeviceMemory, device_memory, storage_bytes
from measure.session import StepPlan, release
from measure.session import _sync as sync
from measure.workloads import Workload

# Keys the request's own fields set; an engine_config that sets them too is refused.
OWNED_KEYS = {
    "fp16": "precision",
    "bf16": "precision",
    "optimizer": "optimizer",
    "train_batch_size": "batch",
    "train_micro_batch_size_per_gpu": "batch.micro_batch_size",
    "gradient_accumulation_steps": "batch.grad_accumulation_steps",
}
OWNED_ZERO_KEYS = {"stage": "stages", "offload_optimizer": "offload", "offload_param": "offload"}
SECTIONS = {Precision.MIXED_BF16: "bf16", Precision.MIXED_FP16: "fp16"}

# Set once a stage-3 engine was built in this process: DeepSpeedZeRoOffload replaced
# torch.nn.functional.linear with zero3_linear_wrap for good (partition_parameters.py:412-419),
# so no cuBLASLt workspace appears in later engines of the same process.
_linear_patched = False


def available() -> bool:
    """Whether ``import deepspeed`` can work here (not imported: it is slow and reads the
    accelerator once)."""
    return importlib.util.find_spec("deepspeed") is not None


def linear_patched() -> bool:
    return _linear_patched


def check_precision(precision: Precision) -> None:
    if precision not in SECTIONS:
        raise InputError(
            "precision",
            "the deepspeed engine runs its bf16 or fp16 section: mixed_bf16 or mixed_fp16",
        )


def deepspeed_config(
    stage: Stage,
    precision: Precision,
    micro_batch: int,
    grad_accumulation: int,
    offload: Mapping[str, Any],
    engine_config: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The DeepSpeed config body of one stage: ``engine_config``'s knobs plus the request's
    fields (which ``engine_config`` may not contradict).

    Raises:
        InputError: a key the request's fields own, or a knob the calculator cannot read.
    """
    check_precision(precision)
    body = dict(engine_config or {})
    for key, field in OWNED_KEYS.items():
        if key in body:
            raise InputError(f"engine_config.{key}", f"set by the request's {field}")
    zero_in = body.get("zero_optimization", {})
    zero_in = {} if zero_in is None else zero_in
    if not isinstance(zero_in, Mapping):
        raise InputError("engine_config.zero_optimization", "must be an object")
    for key, field in OWNED_ZERO_KEYS.items():
        if key in zero_in:
            raise InputError(
                f"engine_config.zero_optimization.{key}", f"set by the request's {field}"
            )
    zero: dict[str, Any] = {**zero_in, "stage": int(stage)}
    config: dict[str, Any] = {
        "steps_per_print": 1_000_000,
        **body,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accumulation,
        SECTIONS[precision]: {"enabled": True},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
    }
    optimizer_off = offload.get("optimizer") or "none"
    params_off = offload.get("params") or "none"
    if optimizer_off != "none":
        if stage is Stage.NONE:
            raise InputError("offload.optimizer", "optimizer offload needs ZeRO stage 1 or higher")
        zero["offload_optimizer"] = {"device": optimizer_off}
        config["zero_force_ds_cpu_optimizer"] = False  # keep the client optimizer
    if params_off != "none":
        if stage is not Stage.PARAMETERS:
            raise InputError("offload.params", "parameter offload needs ZeRO stage 3")
        zero["offload_param"] = {"device": params_off}
    parse_config(config)  # the calculator's reading of the same body: bad knobs are 422s
    return config


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
) -> dict[str, Any]:
    """Measure one DeepSpeed stage on this rank; the process group must be initialised."""
    with device_memory(device) as mem:
        result = _measure(workload, stage, optimizer, device, plan, config, seed, mem)
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
) -> dict[str, Any]:
    global _linear_patched
    import deepspeed

    rank = dist.get_rank()
    torch.manual_seed(seed + rank)
    gen = torch.Generator().manual_seed(seed + rank)
    release(device)
    baseline = mem.allocated()
    baseline_requested = mem.requested()

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
        if recorded:
            sync(device)
            mem.reset_peak()
        with counter if recorded else contextlib.nullcontext():
            for micro in range(plan.grad_accumulation_steps):  # DeepSpeed steps at the boundary
                x, y = workload.make_batch(device, gen)
                logits = engine(x)
                loss = workload.loss(logits, y)
                if recorded and micro == 0:
                    sync(device)
                    phases["after_forward"] = mem.allocated() - baseline
                engine.backward(loss)
                if recorded and micro == plan.grad_accumulation_steps - 1:
                    sync(device)
                    phases["after_backward"] = mem.allocated() - baseline
                engine.step()
            sync(device)
    sync(device)
    peak = mem.peak()
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

    t0 = time.perf_counter()
    for _ in range(plan.steps):
        for _micro in range(plan.grad_accumulation_steps):
            x, y = workload.make_batch(device, gen)
            logits = engine(x)
            loss = workload.loss(logits, y)
            engine.backward(loss)
            engine.step()
    sync(device)
    step_time = (time.perf_counter() - t0) / plan.steps if plan.steps else None

    measured: dict[str, Any] = {
        "resident": resident,
        "model_state_resident": resident - held_bytes,
        "model_state_requested": requested - held_bytes,
        "baseline": baseline,
        "peak": None if peak is None else peak - baseline,
        "peak_over_baseline": None if peak is None else peak - baseline,
        **parts,
        **phases,
        "after_step": resident,
        "held_outputs": held_bytes,
        "reserved": reserved,
        "nvml_used": nvml,
        "skipped_steps": skipped,
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
    }
