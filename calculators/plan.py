"""Which ZeRO configuration to run: every candidate of a search space, memory checked, ranked by
predicted tokens per second.

Memory of each candidate comes from :func:`calculators.memory.estimate` (the engine's own
accounting, activations and peak included), communication from
:func:`calculators.communication.estimate_communication`; :mod:`calculators.speed` turns both
into a step time. Every figure that is assumed rather than derived is a named field of
:class:`Assumptions`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from calculators.architecture import Architecture, block_kinds, block_tensors
from calculators.architecture import tensors as architecture_tensors
from calculators.batch import Batch, Checkpointing
from calculators.communication import (
    CommunicationSetup,
    GradSync,
    Network,
    Phase,
    StageCommunication,
    Topology,
    estimate_communication,
)
from calculators.conventions import Engine, OffloadDevice, Optimizer, Precision, Stage
from calculators.errors import InputError
from calculators.gpus import GIB, Gpu
from calculators.memory import StageEstimate, estimate
from calculators.model_states import Offload, TrainingSetup
from calculators.speed import (
    ATTENTION_BACKWARD_FACTOR,
    CAUSAL_FRACTION,
    DEFAULT_EFFICIENCY,
    DEFAULT_EFFICIENCY_SOURCE,
    PhaseComm,
    achieved_efficiency,
    exposed_seconds,
    optimizer_bytes_per_param,
    peak_flops_for,
    split_phase,
    token_flops,
)

# bench/results/torch_peak.json: nvml_used − reserved = 1.2-1.3 GiB on an H100 with torch 2.11
# (CUDA context, loaded kernels, NCCL buffers): memory the allocator never sees.
CONTEXT_RESERVE = 13 * GIB // 10
# bench/results/torch_peak.json: reserved is 10-25 % above the allocated peak (the caching
# allocator's rounding and freed blocks kept for reuse); the low end is kept free.
ALLOCATOR_MARGIN = 0.10
# DeepSpeed's CPU Adam (csrc/adam/cpu_adam_impl.cpp) streams each state once per step with
# AVX: memory-bound on the host. A two-socket host's ~300 GB/s DDR5 shared by 8 ranks.
HOST_OPTIMIZER_BANDWIDTH = 300 * 10**9 // 8
# Bounded work: the engines walk every parameter tensor once per configuration (about 7 µs a
# tensor on one core), so a search is capped at this many configuration × tensor visits (~2 s).
MAX_TENSOR_VISITS = 250_000


class OffloadChoice(StrEnum):
    """What a candidate moves to host memory (DeepSpeed ZeRO-Offload / ZeRO-Infinity)."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    """Optimizer states (and, from stage 2, the gradient partition) in CPU memory; CPU Adam."""
    OPTIMIZER_AND_PARAMS = "optimizer_and_params"
    """Also the stage-3 parameter partition (ZeRO-Infinity, CPU)."""

    @property
    def offload(self) -> Offload:
        cpu = OffloadDevice.CPU
        if self is OffloadChoice.OPTIMIZER:
            return Offload(optimizer=cpu)
        if self is OffloadChoice.OPTIMIZER_AND_PARAMS:
            return Offload(optimizer=cpu, params=cpu)
        return Offload()

    def allowed(self, engine: Engine, stage: Stage) -> bool:
        if self is OffloadChoice.NONE:
            return True
        if engine is not Engine.DEEPSPEED:
            return False  # the torch engines run without offload here
        if self is OffloadChoice.OPTIMIZER:
            return stage >= Stage.OPTIMIZER
        return stage >= Stage.PARAMETERS


@dataclass(frozen=True)
class Search:
    """What may vary. ``micro_batch_sizes=None``: powers of two dividing the per-rank batch.

    Attributes:
        stages: ZeRO stages to try.
        micro_batch_sizes: sequences per micro-batch to try (None: derived).
        activation_checkpointing: recomputation policies to try.
        offload: offload choices to try (those an engine or stage cannot do are skipped).
        hsdp: also try sharding stage 3 within a node and replicating across nodes (FSDP2
            HYBRID_SHARD; engine torch, as DeepSpeed 0.19.8 removed MiCS); only with more than
            one node.
    """

    stages: tuple[Stage, ...] = tuple(Stage)
    micro_batch_sizes: tuple[int, ...] | None = None
    activation_checkpointing: tuple[Checkpointing, ...] = tuple(Checkpointing)
    offload: tuple[OffloadChoice, ...] = tuple(OffloadChoice)
    hsdp: bool = True


@dataclass(frozen=True)
class Efficiency:
    """The fraction of the GPU's dense peak the matmuls are taken to reach.

    Attributes:
        value: the fraction.
        source: where it comes from, in words.
        calibration_id: the stored calibration that set it, if one did.
    """

    value: float = DEFAULT_EFFICIENCY
    source: str = DEFAULT_EFFICIENCY_SOURCE
    calibration_id: str | None = None


@dataclass(frozen=True)
class PlanSetup:
    """One planning question.

    Attributes:
        architecture: the model (a plan needs one: activations and FLOPs come from it).
        params: its parameter count.
        gpu: the device.
        gpus: devices in all (the data-parallel degree).
        gpus_per_node: devices per host.
        network: link classes (intra-node, inter-node, host).
        global_batch_size: sequences per optimizer step over all devices.
        seq_len: tokens per sequence.
        engine: torch or deepspeed.
        engine_config: engine knobs (a DeepSpeed config body); the searched keys are replaced.
        precision, optimizer: training precision and optimizer.
        search: what may vary.
        efficiency: the compute efficiency to assume.
        context_reserve: device bytes outside the allocator (CUDA context, NCCL).
        allocator_margin: fraction of the device kept free for the allocator's rounding.
        host_optimizer_bandwidth: host bytes/s one rank's CPU optimizer streams.
        grad_sync: when the torch engines reduce gradients under accumulation (a loop without
            ``no_sync`` reduces on every micro-step).
    """

    architecture: Architecture
    params: int
    gpu: Gpu
    gpus: int
    gpus_per_node: int
    network: Network
    global_batch_size: int
    seq_len: int
    engine: Engine = Engine.TORCH
    engine_config: Mapping[str, Any] | None = None
    precision: Precision = Precision.MIXED_BF16
    optimizer: Optimizer = Optimizer.ADAM
    search: Search = field(default_factory=Search)
    efficiency: Efficiency = field(default_factory=Efficiency)
    context_reserve: int = CONTEXT_RESERVE
    allocator_margin: float = ALLOCATOR_MARGIN
    host_optimizer_bandwidth: float = HOST_OPTIMIZER_BANDWIDTH
    grad_sync: GradSync = GradSync.PER_STEP

    def __post_init__(self) -> None:
        if self.engine is Engine.PAPER:
            raise InputError("engine", "a plan runs a real engine's accounting: torch or deepspeed")
        if self.gpus < 1:
            raise InputError("gpus", "must be at least 1")
        if self.gpus_per_node < 1 or self.gpus % self.gpus_per_node:
            raise InputError(
                "gpus_per_node", f"must divide gpus = {self.gpus} (nodes of equal size)"
            )
        if self.global_batch_size % self.gpus:
            raise InputError(
                "global_batch_size",
                f"{self.global_batch_size} sequences do not split evenly over {self.gpus} GPUs",
            )
        if not 0 < self.efficiency.value <= 1:
            raise InputError("efficiency", "must be in (0, 1]: a fraction of the peak")
        if not self.search.stages:
            raise InputError("search.stages", "give at least one stage")

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def per_rank_batch(self) -> int:
        return self.global_batch_size // self.gpus

    @property
    def usable_memory(self) -> int:
        """Device bytes the allocator's peak may reach."""
        return int((self.gpu.memory - self.context_reserve) * (1 - self.allocator_margin))

    @property
    def peak_flops(self) -> float:
        return peak_flops_for(self.precision, self.gpu.peak_flops_16bit, self.gpu.peak_flops_fp32)


@dataclass(frozen=True)
class Config:
    """One candidate configuration."""

    stage: Stage
    micro_batch_size: int
    grad_accumulation_steps: int
    activation_checkpointing: Checkpointing
    offload: OffloadChoice
    shard_group_size: int | None = None


@dataclass(frozen=True)
class Overlap:
    """Which phases' collectives the engine runs behind compute, and why."""

    forward: bool
    backward: bool
    step: bool
    reason: str


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step on one rank.

    Attributes:
        compute: forward + backward + recomputation matmuls at the stated efficiency.
        recompute: the part of ``compute`` that activation checkpointing repeats.
        optimizer_step: the element-wise optimizer update (device memory or host bound).
        exposed_communication: collective time not hidden behind compute.
        communication: all collective time, hidden or not.
        offload_transfer: device–host copies of offloaded states (not hidden).
    """

    compute: float
    recompute: float
    optimizer_step: float
    exposed_communication: float
    communication: float
    offload_transfer: float

    @property
    def total(self) -> float:
        return (
            self.compute + self.optimizer_step + self.exposed_communication + self.offload_transfer
        )


@dataclass(frozen=True)
class Candidate:
    """A configuration that fits, with its memory and speed."""

    config: Config
    memory: StageEstimate
    step: StepTime
    overlap: Overlap
    tokens_per_second: float
    headroom: int
    sent_bytes_per_rank: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rejected:
    """A configuration that does not fit (or cannot run), and by how much."""

    config: Config
    reason: str
    peak: int | None = None
    over_by: int | None = None


@dataclass(frozen=True)
class Assumptions:
    """Every figure the plan assumes rather than derives."""

    efficiency: float
    efficiency_source: str
    peak_flops: float
    peak_flops_source: str
    causal_attention_fraction: float
    attention_backward_factor: float
    context_reserve: int
    allocator_margin: float
    usable_memory: int
    host_optimizer_bandwidth: float
    offload_transfer_overlapped: bool
    compute_slowdown_from_overlap: float
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """Candidates ranked fastest first, the rejected ones, and the assumptions."""

    setup: PlanSetup
    candidates: tuple[Candidate, ...]
    rejected: tuple[Rejected, ...]
    assumptions: Assumptions
    evaluated: int
    communication_evaluations: int


ASSUMPTION_NOTES = (
    "compute counts matmul FLOPs only (linears, attention QKᵀ/AV, output head); norms, "
    "softmax, element-wise work and kernel launch gaps are inside the efficiency",
    "the efficiency does not depend on the micro-batch: small GEMMs that reach less of the "
    "peak are not modelled (a calibration at the planned micro-batch absorbs it)",
    "communication runs at the links' peak rates (α–β model): nccl-tests bus bandwidth is "
    "lower, so hidden/exposed splits are optimistic for bandwidth-bound steps",
    "overlapped collectives cost one call's time that cannot hide (the first all-gather, the "
    "last gradient bucket) plus whatever exceeds the compute of their phase",
    "offload transfers are not hidden behind compute; the CPU optimizer runs after backward",
)


# --- the engines' overlap -------------------------------------------------------------------


def _overlap_comm(config: Mapping[str, Any] | None) -> bool | None:
    zero = (config or {}).get("zero_optimization")
    value = zero.get("overlap_comm") if isinstance(zero, Mapping) else None
    return value if isinstance(value, bool) else None


def overlap(engine: Engine, stage: Stage, config: Mapping[str, Any] | None) -> Overlap:
    """Which collectives each engine issues on a side stream while it computes.

    - torch: DDP launches each bucket's all-reduce from its autograd hook (reducer.cpp
      ``mark_variable_ready``); FSDP2 all-gathers on its all-gather stream ahead of the module
      that needs it (implicit forward prefetch, one-module backward prefetch) and
      reduce-scatters on its own stream (``_fsdp_param_group.py``). ZeroRedundancyOptimizer
      broadcasts after ``step()``: exposed.
    - deepspeed: stage 0 all-reduces after backward (engine.py ``allreduce_gradients`` at the
      boundary): exposed; stages 1/2 reduce from the hooks on a side stream only with
      ``overlap_comm`` (default off); stage 3 prefetches parameters
      (partitioned_param_coordinator.py) and reduce-scatters on a side stream when
      ``overlap_comm`` (default on for stage 3). The post-step all-gather is exposed.
    """
    if engine is Engine.TORCH:
        return Overlap(
            forward=True,
            backward=True,
            step=False,
            reason="DDP all-reduces buckets from autograd hooks; FSDP2 prefetches all-gathers "
            "and reduce-scatters on side streams; ZeroRedundancyOptimizer's broadcast after "
            "step() is exposed",
        )
    flag = _overlap_comm(config)
    if stage is Stage.NONE:
        return Overlap(
            False,
            False,
            False,
            "DeepSpeed stage 0 all-reduces gradients after backward (engine.allreduce_gradients)",
        )
    if stage < Stage.PARAMETERS:
        on = bool(flag)
        return Overlap(
            False,
            on,
            False,
            f"DeepSpeed stage {int(stage)}: overlap_comm is {'on' if on else 'off (default)'}; "
            + (
                "bucket reductions run on a side stream during backward"
                if on
                else "bucket reductions run on the compute stream inside backward"
            )
            + "; the post-step all-gather of updated partitions is exposed",
        )
    on = True if flag is None else flag
    return Overlap(
        True,
        on,
        False,
        "DeepSpeed stage 3 prefetches parameter all-gathers (stage3_prefetch_bucket_size); "
        f"overlap_comm is {'on' if on else 'off'} for gradient reduce-scatters; the post-step "
        "all-gather of persistent parameters is exposed",
    )


# --- one candidate --------------------------------------------------------------------------

_SEARCHED_ZERO_KEYS = ("stage", "offload_optimizer", "offload_param")
_SEARCHED_TOP_KEYS = (
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
)


def engine_config_for(config: Mapping[str, Any] | None, engine: Engine) -> dict[str, Any] | None:
    """The request's engine config without the keys the search sets per candidate."""
    if config is None:
        return None
    if engine is not Engine.DEEPSPEED:
        return dict(config)
    out = {k: v for k, v in config.items() if k not in _SEARCHED_TOP_KEYS}
    zero = config.get("zero_optimization")
    if isinstance(zero, Mapping):
        out["zero_optimization"] = {k: v for k, v in zero.items() if k not in _SEARCHED_ZERO_KEYS}
    return out


def micro_batch_sizes(setup: PlanSetup) -> tuple[int, ...]:
    """The search's micro-batches, or the powers of two dividing the per-rank batch."""
    per_rank = setup.per_rank_batch
    if setup.search.micro_batch_sizes is not None:
        for m in setup.search.micro_batch_sizes:
            if m < 1 or per_rank % m:
                raise InputError(
                    "search.micro_batch_size",
                    f"{m} does not divide the per-GPU batch {per_rank} "
                    f"(global_batch_size {setup.global_batch_size} / {setup.gpus} GPUs)",
                )
        return tuple(sorted(set(setup.search.micro_batch_sizes)))
    out, m = [], 1
    while m <= per_rank:
        if per_rank % m == 0:
            out.append(m)
        m *= 2
    return tuple(out)


def configs(setup: PlanSetup) -> list[Config]:
    """Every configuration of the search space the engine can run."""
    shard_groups: list[int | None] = [None]
    # FSDP2 HYBRID_SHARD; DeepSpeed 0.19.8 removed MiCS (runtime/config.py), its shard groups
    if setup.search.hsdp and setup.nodes > 1 and setup.engine is Engine.TORCH:
        shard_groups.append(setup.gpus_per_node)
    out = []
    for stage in sorted(set(setup.search.stages)):
        for offload in setup.search.offload:
            if not offload.allowed(setup.engine, stage):
                continue
            for shard in shard_groups:
                if shard is not None and stage is not Stage.PARAMETERS:
                    continue
                for ckpt in setup.search.activation_checkpointing:
                    for m in micro_batch_sizes(setup):
                        ga = setup.per_rank_batch // m
                        out.append(Config(stage, m, ga, ckpt, offload, shard))
    tensors = tensor_count(setup.architecture)
    if len(out) * tensors > MAX_TENSOR_VISITS:
        raise InputError(
            "search",
            f"{len(out)} configurations × {tensors:,} parameter tensors = "
            f"{len(out) * tensors:,} tensor evaluations, over {MAX_TENSOR_VISITS:,}: narrow "
            "stages, micro_batch_size, activation_checkpointing or offload",
        )
    return out


def tensor_count(arch: Architecture) -> int:
    """Parameter tensors of the model (embeddings, every block, head): what each engine walks."""
    in_blocks = sum(n * len(block_tensors(arch, first)) for first, n in block_kinds(arch))
    return in_blocks + len(tensors_outside_blocks(arch))


def tensors_outside_blocks(arch: Architecture) -> list[str]:
    one_layer = replace(arch, layers=1)
    return [t.name for t in architecture_tensors(one_layer) if t.layer is None]


@dataclass(frozen=True)
class _CommProfile:
    """One stage's communication as a function of the micro-step count."""

    phases: dict[Phase, PhaseComm]
    transfer: tuple[float, float]  # seconds: (per micro-step, once per step)
    sent: tuple[float, float]  # bytes per rank: (per micro-step, once per step)


def _linear(at_one: float, at_two: float) -> tuple[float, float]:
    """(repeated, once) of a figure that is ``repeated · micro_steps + once``."""
    repeated = max(0.0, at_two - at_one)
    return repeated, max(0.0, at_one - repeated)


class _Evaluator:
    """Evaluates configurations of one setup, computing what candidates share once."""

    def __init__(self, setup: PlanSetup) -> None:
        self.setup = setup
        self.config = engine_config_for(setup.engine_config, setup.engine)
        self.topology = Topology(
            nodes=setup.nodes, gpus_per_node=setup.gpus_per_node, dp=setup.gpus
        )
        self._comm: dict[tuple[Stage, OffloadChoice, int | None], _CommProfile] = {}
        self.communication_evaluations = 0
        # K: optimizer-state bytes per parameter (fp32 master included), as the memory model has it
        self.k = float(
            TrainingSetup(
                params=1, dp=1, precision=setup.precision, optimizer=setup.optimizer
            ).k_value
        )

    def training(self, c: Config, with_batch: bool) -> TrainingSetup:
        s = self.setup
        batch = None
        if with_batch:
            batch = Batch(c.micro_batch_size, s.seq_len, c.activation_checkpointing)
            batch = replace(batch, grad_accumulation_steps=c.grad_accumulation_steps)
        return TrainingSetup(
            params=s.params,
            # HSDP / MiCS: model states are sharded over the shard group, not all of dp
            dp=c.shard_group_size or s.gpus,
            precision=s.precision,
            optimizer=s.optimizer,
            offload=c.offload.offload,
            engine=s.engine,
            architecture=s.architecture,
            batch=batch,
            engine_config=self.config,
        )

    def memory(self, c: Config) -> StageEstimate:
        return estimate(self.training(c, with_batch=True), [c.stage]).stages[0]

    def stage_communication(self, c: Config, micro_steps: int) -> StageCommunication:
        """The communication model's answer for ``c``'s stage at ``micro_steps``."""
        training = replace(self.training(c, with_batch=False), dp=self.setup.gpus)
        comm_setup = CommunicationSetup(
            training=training,
            topology=self.topology,
            network=self.setup.network,
            grad_accumulation_steps=micro_steps,
            grad_sync=self.setup.grad_sync,
            shard_group_size=c.shard_group_size,
        )
        self.communication_evaluations += 1
        return estimate_communication(comm_setup, [c.stage]).stages[0]

    def communication(self, c: Config) -> _CommProfile:
        """Per-micro-step and per-step parts of ``c``'s communication, from the model's answers
        at one and two micro-steps (every call costs the same at any count, so each figure is
        ``repeated · micro_steps + once``); shared by every micro-batch and checkpointing."""
        key = (c.stage, c.offload, c.shard_group_size)
        found = self._comm.get(key)
        if found is None:
            one, two = self.stage_communication(c, 1), self.stage_communication(c, 2)
            phases = {}
            for phase in Phase:
                (s1, n1), (s2, n2) = _phase_totals(one, phase), _phase_totals(two, phase)
                phases[phase] = split_phase(s2, n2, s1, n1, 2)
            found = _CommProfile(
                phases=phases,
                transfer=_linear(one.transfer_time_seconds, two.transfer_time_seconds),
                sent=_linear(one.sent_bytes_per_rank, two.sent_bytes_per_rank),
            )
            self._comm[key] = found
        return found

    def step_time(self, c: Config) -> tuple[StepTime, Overlap, int]:
        s = self.setup
        flops = token_flops(s.architecture, s.seq_len, c.activation_checkpointing)
        micro_tokens = c.micro_batch_size * s.seq_len
        rate = s.peak_flops * s.efficiency.value
        fwd = flops.forward * micro_tokens / rate  # one micro-step
        bwd = (flops.backward + flops.recompute) * micro_tokens / rate
        ga = c.grad_accumulation_steps

        comm = self.communication(c)
        ov = overlap(s.engine, c.stage, self.config)
        windows = {Phase.FORWARD: fwd, Phase.BACKWARD: bwd, Phase.STEP: 0.0}
        flags = {Phase.FORWARD: ov.forward, Phase.BACKWARD: ov.backward, Phase.STEP: ov.step}
        exposed = sum(exposed_seconds(comm.phases[p], ga, windows[p], flags[p]) for p in Phase)
        collective = sum(comm.phases[p].total(ga) for p in Phase)

        # the optimizer updates the whole model at stage 0, its partition from stage 1 on
        dp = 1 if c.stage is Stage.NONE else c.shard_group_size or s.gpus
        per_param = optimizer_bytes_per_param(s.precision, self.k)
        shard = -(-s.params // dp)
        if c.offload is OffloadChoice.NONE:
            bandwidth = float(s.gpu.memory_bandwidth) or float("inf")
        else:
            bandwidth = s.host_optimizer_bandwidth
        optimizer = shard * per_param / bandwidth
        step = StepTime(
            compute=(fwd + bwd) * ga,
            recompute=flops.recompute * micro_tokens / rate * ga,
            optimizer_step=optimizer,
            exposed_communication=exposed,
            communication=collective,
            offload_transfer=comm.transfer[0] * ga + comm.transfer[1],
        )
        return step, ov, round(comm.sent[0] * ga + comm.sent[1])


def _phase_totals(comm: StageCommunication, phase: Phase) -> tuple[float, int]:
    secs, calls = 0.0, 0
    for c in comm.collectives:
        if c.collective.phase is phase:
            secs += c.time_seconds
            calls += c.collective.calls
    return secs, calls


def plan(setup: PlanSetup) -> Plan:
    """Evaluate every configuration of ``setup.search``; fastest first."""
    ev = _Evaluator(setup)
    usable = setup.usable_memory
    tokens_per_step = setup.global_batch_size * setup.seq_len
    candidates: list[Candidate] = []
    rejected: list[Rejected] = []
    todo = configs(setup)
    for c in todo:
        try:
            mem = ev.memory(c)
        except InputError as err:
            rejected.append(Rejected(c, f"cannot be estimated: {err.field}: {err.message}"))
            continue
        needed = mem.peak if mem.peak is not None else mem.resident
        if needed > usable:
            over = needed - usable
            rejected.append(
                Rejected(
                    c,
                    f"does not fit: peak {needed / GIB:.2f} GiB exceeds the usable "
                    f"{usable / GIB:.2f} GiB by {over / GIB:.2f} GiB",
                    needed,
                    over,
                )
            )
            continue
        try:
            step, ov, sent = ev.step_time(c)
        except InputError as err:
            rejected.append(Rejected(c, f"cannot be timed: {err.field}: {err.message}", needed))
            continue
        candidates.append(
            Candidate(
                config=c,
                memory=mem,
                step=step,
                overlap=ov,
                tokens_per_second=tokens_per_step / step.total,
                headroom=usable - needed,
                sent_bytes_per_rank=sent,
            )
        )
    candidates.sort(key=lambda x: (-x.tokens_per_second, x.memory.peak or x.memory.resident))
    return Plan(
        setup=setup,
        candidates=tuple(candidates),
        rejected=tuple(rejected),
        assumptions=assumptions(setup),
        evaluated=len(todo),
        communication_evaluations=ev.communication_evaluations,
    )


def predict(setup: PlanSetup, config: Config) -> tuple[StageEstimate, StepTime, Overlap]:
    """Memory and step time of one configuration, fitting or not."""
    ev = _Evaluator(setup)
    step, ov, _ = ev.step_time(config)
    return ev.memory(config), step, ov


@dataclass(frozen=True)
class Calibration:
    """The efficiency a measured step implies.

    Attributes:
        efficiency: fraction of the dense peak the matmuls reached.
        other_seconds: predicted non-compute time taken off the measured step.
        predicted_step_seconds: the step the stated default efficiency predicts.
    """

    efficiency: float
    other_seconds: float
    predicted_step_seconds: float


def calibrate(
    setup: PlanSetup, config: Config, measured_seconds: float, *, communicated: bool = True
) -> Calibration:
    """Solve the step-time model for the efficiency of one measured configuration.

    ``communicated=False`` for a simulated world (collectives complete without moving data):
    only the optimizer step is taken off the measured time.
    """
    _, step, _ = predict(setup, config)
    other = step.optimizer_step
    if communicated:
        other += step.exposed_communication + step.offload_transfer
    flops = step.compute * setup.peak_flops * setup.efficiency.value
    eff = achieved_efficiency(flops, setup.peak_flops, measured_seconds, other)
    return Calibration(efficiency=eff, other_seconds=other, predicted_step_seconds=step.total)


def assumptions(setup: PlanSetup) -> Assumptions:
    g = setup.gpu
    return Assumptions(
        efficiency=setup.efficiency.value,
        efficiency_source=setup.efficiency.source,
        peak_flops=setup.peak_flops,
        peak_flops_source=(
            f"{g.label}: "
            + ("FP32 without tensor cores" if setup.precision is Precision.FP32 else "dense BF16")
            + f" ({g.source})"
        ),
        causal_attention_fraction=CAUSAL_FRACTION,
        attention_backward_factor=ATTENTION_BACKWARD_FACTOR,
        context_reserve=setup.context_reserve,
        allocator_margin=setup.allocator_margin,
        usable_memory=setup.usable_memory,
        host_optimizer_bandwidth=setup.host_optimizer_bandwidth,
        offload_transfer_overlapped=False,
        compute_slowdown_from_overlap=0.0,
        notes=ASSUMPTION_NOTES
        + (
            ()
            if g.memory_bandwidth
            else ("no memory bandwidth given: the on-device optimizer step is counted as 0 s",)
        ),
    )
