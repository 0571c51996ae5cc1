"""DeepSpeed 0.19.8 ZeRO, modelled from its source: what rank 0 really allocates.

Paths are relative to ``deepspeed/runtime/`` of the 0.19.8 sdist; docs/engines/deepspeed.md walks
through them. The training loop modelled is the plain one a DeepSpeed user writes, with a client
``torch.optim.Adam`` (foreach) and the fp16 or bf16 section enabled::

    logits = engine(x)
    loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
    engine.backward(loss); engine.step()

Which wrapper runs (engine.py ``_configure_optimizer``): stage 0 ``FP16_UnfusedOptimizer``
(fp16/unfused_optimizer.py, for fp16 and bf16 alike with a torch optimizer), stages 1/2
``DeepSpeedZeroOptimizer`` (zero/stage_1_and_2.py), stage 3 ``DeepSpeedZeroOptimizer_Stage3``
(zero/stage3.py) with the parameter coordinator (zero/partitioned_param_coordinator.py).

``resident`` is ``torch.cuda.memory_allocated`` between steps (after ``engine.step()``, which
ends with ``zero_grad``); ``peak`` the highest allocation within a step. Both include what the
loop still references between steps (``logits``, ``loss``, the batch; ``holds_outputs``) and the
cuBLAS workspaces the caching allocator holds after the first step (see
``calculators.engines.torch.peak``). Every tensor is rounded up to the caching allocator's
512-byte blocks (c10/cuda/CUDACachingAllocator.cpp ``round_size``, ``kMinBlockSize = 512``).
The peak is the largest of a few moments of the step, each a sum of tensors alive together.

``device`` places the model states: ``parameters`` the 16-bit copy (flat group, partition, plus
persistent gathered ones), ``optimizer_states`` the fp32 master and the optimizer's states,
``gradients`` the gradient copy the optimizer reads, alive from backward to the step and
resident only in stage 3 (its partition buffer). ``components`` names every resident part and,
prefixed ``peak.``, what the peak moment adds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from calculators.batch import Checkpointing
from calculators.caching_allocator import ACTIVATION_BLOCKS_NOTE
from calculators.conventions import OffloadDevice, Optimizer, Precision, Stage
from calculators.engines.deepspeed.config import (
    Knobs,
    knobs_with,
    model_steps,
    param_list,
    parse_config,
    with_offload,
)
from calculators.engines.deepspeed.layouts import (
    Moment,
    ParamFacts,
    Stage3,
    Stage12,
    StepShape,
    cublaslt_workspace_bytes,
    param_facts,
    stage0,
    step_shape,
)
from calculators.engines.deepspeed.stage3 import leaf_layers
from calculators.engines.torch.memory import STATE_TENSORS  # the client torch.optim optimizer
from calculators.engines.torch.peak import cublas_workspace_bytes
from calculators.errors import InputError
from calculators.estimates import StageEstimate, stage_estimate
from calculators.model_states import NOWHERE, Offload, TrainingSetup, check_offload
from calculators.parameters import ParamTensor, implied_note

CONVENTION = (
    "deepspeed: what DeepSpeed 0.19.8 allocates on rank 0 (stage 0 FP16_UnfusedOptimizer, "
    "stages 1/2 DeepSpeedZeroOptimizer, stage 3 DeepSpeedZeroOptimizer_Stage3) with a client "
    "torch.optim.Adam, fp16/bf16 parameters, fp32 master; resident = allocated between steps "
    "(cuBLAS workspaces and the loop's logits included), peak = highest allocation in a step"
)


def _check(setup: TrainingSetup, stage: Stage, knobs: Knobs) -> int:
    if setup.k is not None:
        raise InputError("k", "the deepspeed engine derives optimizer states from the optimizer")
    if setup.optimizer not in STATE_TENSORS:
        known = ", ".join(o.value for o in STATE_TENSORS)
        raise InputError("optimizer", f"the deepspeed engine models the torch optimizers {known}")
    if setup.precision not in (Precision.MIXED_FP16, Precision.MIXED_BF16):
        raise InputError(
            "precision",
            "the deepspeed engine models its fp16 and bf16 sections "
            "(mixed_fp16, mixed_bf16: 16-bit parameters with an fp32 master)",
        )
    want_fp16 = setup.precision is Precision.MIXED_FP16
    if (knobs.fp16 is True and not want_fp16) or (knobs.bf16 is True and want_fp16):
        raise InputError(
            "engine_config", f"its fp16/bf16 section contradicts precision {setup.precision.value}"
        )
    if setup.tp * setup.pp != 1:
        raise InputError("tp", "the deepspeed engine profile models plain data parallelism")
    if setup.batch is not None and setup.batch.checkpoint_every_n_layers > 1:
        raise InputError(
            "batch.checkpoint_every_n_layers",
            "above 1 is modelled for the torch engine (DDP, ZeroRedundancyOptimizer, FSDP2); "
            "the deepspeed engine's walks checkpoint every decoder layer",
        )
    # knobs carry the config's offload devices, or the request's (with_offload)
    optimizer_off = knobs.offload_optimizer or OffloadDevice.NONE
    param_off = knobs.offload_param or OffloadDevice.NONE
    if OffloadDevice.NVME in (optimizer_off, param_off):
        raise InputError("offload", "NVMe offload is not modelled by the deepspeed profile")
    check_offload(Offload(optimizer=optimizer_off, params=param_off), stage)
    if (
        knobs.grad_accumulation is not None
        and setup.batch is not None
        and knobs.grad_accumulation != setup.batch.grad_accumulation_steps
    ):
        raise InputError(
            "engine_config.gradient_accumulation_steps",
            "differs from batch.grad_accumulation_steps",
        )
    if (
        setup.batch is not None
        and knobs.micro_batch is not None
        and knobs.micro_batch != setup.batch.micro_batch_size
    ):
        raise InputError(
            "engine_config.train_micro_batch_size_per_gpu", "differs from batch.micro_batch_size"
        )
    return STATE_TENSORS[setup.optimizer]


class Shared:
    """What every stage of one setup reads (the config's knobs, the parameter list and its
    sizes, the step's workload terms), each worked out on first use and once for all the stages
    asked. None of it depends on Nd: one serves every Nd of a sweep (the same setup otherwise),
    which also reuses stage 0's whole estimate (DeepSpeed's stage 0 partitions nothing)."""

    def __init__(self, setup: TrainingSetup) -> None:
        self.setup = setup
        self.stage0: StageEstimate | None = None
        self.plans: dict[Stage, Stage12 | Stage3] = {}
        # per stage: what its estimate adds to every layout's, whatever the Nd (the cuBLAS
        # workspaces and held outputs, their components, the notes after the layout's)
        self.fixed: dict[Stage, _Fixed] = {}

    @cached_property
    def knobs(self) -> Knobs:
        knobs = with_offload(self.setup, parse_config(self.setup.engine_config))
        arch = self.setup.architecture
        batch = self.setup.batch
        return knobs_with(
            knobs,
            leaves=leaf_layers(arch, knobs),
            steps=model_steps(arch),
            recompute=batch is not None and batch.activation_checkpointing is Checkpointing.FULL,
        )

    @cached_property
    def params(self) -> tuple[Sequence[ParamTensor], bool]:
        return param_list(self.setup)

    @cached_property
    def facts(self) -> ParamFacts:
        return param_facts(self.params[0])

    @cached_property
    def shape(self) -> StepShape:
        return step_shape(self.setup, self.knobs)


def estimate(setup: TrainingSetup, stage: Stage, shared: Shared | None = None) -> StageEstimate:
    """What rank 0 allocates under ``stage`` (module docstring); ``shared`` carries what an
    earlier stage of the same setup, or the same setup under another Nd, already worked out."""
    if shared is None:
        shared = Shared(setup)
    if stage is Stage.NONE and shared.stage0 is not None:
        return shared.stage0
    knobs = shared.knobs
    shape = shared.shape
    plan = shared.plans.get(stage)
    if plan is None or stage is Stage.NONE:
        n_states = _check(setup, stage, knobs)
        adam = setup.optimizer in (Optimizer.ADAM, Optimizer.ADAMW)
        params, exact = shared.params
        accumulation = knobs.grad_accumulation or (
            setup.batch.grad_accumulation_steps if setup.batch is not None else 1
        )
        if stage is Stage.NONE:
            layout = stage0(params, n_states, shape, adam, accumulation, shared.facts)
        elif stage is Stage.PARAMETERS:
            # gradients accumulate in place in the persistent partition buffer (partition_grads)
            plan = Stage3(shared.facts, knobs, n_states, shape, adam, exact)
        else:
            plan = Stage12(shared.facts, stage, knobs, n_states, shape, adam, accumulation)
        shared.fixed[stage] = _fixed(setup, stage, knobs, shape.held)
        if plan is not None:
            shared.plans[stage] = plan
    if plan is not None:
        layout = plan.layout(setup.dp)
    fixed = shared.fixed[stage]
    parts = layout.resident_parts
    components = {**parts, **fixed.components}
    resident = sum(parts.values()) + fixed.resident
    peak = activations_at_peak = buffers_at_peak = None
    if shape.known:
        name, moment = _peak(layout.moments)
        peak = resident - shape.held + moment.total
        activations_at_peak = moment.activations
        # every buffer but the loop's held outputs (counted in resident)
        buffers_at_peak = moment.total - moment.activations - moment.buffers.get("held_outputs", 0)
        for k, v in moment.buffers.items():
            components[f"peak.{k}"] = v
        components["peak.activations"] = moment.activations
        notes = (*layout.notes, *fixed.notes, f"peak moment: {name}", ACTIVATION_BLOCKS_NOTE)
    else:
        notes = (*layout.notes, *fixed.notes, "peak needs model.architecture and batch")
    result = stage_estimate(
        stage=stage,
        device=layout.device,
        cpu=layout.cpu,
        nvme=NOWHERE,
        resident=resident,
        activations=activations_at_peak,
        peak=peak,
        notes=notes,
        theory=None,
        temporary_buffers=buffers_at_peak,
        components=components,
        cpu_buffers=layout.cpu_buffers,
        cpu_activations=shape.acts.offloaded if shape.acts is not None else 0,
    )
    if stage is Stage.NONE:
        shared.stage0 = result
    return result


@dataclass(frozen=True)
class _Fixed:
    """What a stage's estimate adds to its layout under any Nd."""

    resident: int  # the cuBLAS workspaces and the loop's held outputs
    components: dict[str, int]  # theirs, named after the layout's resident parts
    notes: tuple[str, ...]  # after the layout's


def _fixed(setup: TrainingSetup, stage: Stage, knobs: Knobs, held: int) -> _Fixed:
    cublaslt = cublaslt_workspace_bytes(setup, stage, knobs)
    workspaces = cublas_workspace_bytes(knobs.extra) + cublaslt
    notes = []
    implied = implied_note(setup.params) if setup.architecture is None else None
    if implied is not None:
        notes.append(implied)
    # with an optimizer section DeepSpeed builds its own CPU Adam: no client optimizer to refuse
    if (
        knobs.offload_optimizer is not None
        and knobs.force_ds_cpu_optimizer
        and knobs.extra.get("optimizer") is None
    ):
        notes.append(
            "DeepSpeed refuses a client torch optimizer with optimizer offload "
            "unless zero_force_ds_cpu_optimizer is false (engine.py:2341-2346)"
        )
    return _Fixed(
        resident=workspaces + held,
        components={
            "cublas_workspaces": workspaces - cublaslt,
            "cublaslt_workspace": cublaslt,
            "held_outputs": held,
        },
        notes=tuple(notes),
    )


def _peak(moments: dict[str, Moment]) -> tuple[str, Moment]:
    """The first of the moments with the largest total (``max`` by total, without a key call
    per moment: a sweep searches 39 layouts)."""
    items = iter(moments.items())
    name, peak = next(items)
    most = peak.total
    for other, moment in items:
        if moment.total > most:
            name, peak, most = other, moment, moment.total
    return name, peak
