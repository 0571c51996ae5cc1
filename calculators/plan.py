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

from calculators.activations import Regime, offloaded_inputs
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
from calculators.engines.torch.config import through_accelerate
from calculators.engines.torch.peak import CONVERT_OUTPUTS, converts_outputs, holds_outputs
from calculators.errors import InputError
from calculators.gpus import GIB, Gpu
from calculators.memory import StageEstimate, estimate
from calculators.model_states import Offload, TrainingSetup
from calculators.speed import (
    ATTENTION_BACKWARD_FACTOR,
    CAUSAL_FRACTION,
    DEFAULT_EFFICIENCY,
    DEFAULT_EFFICIENCY_SOURCE,
    DEFAULT_HOST_SECONDS_PER_KERNEL,
    DEFAULT_HOST_SOURCE,
    EngineKernels,
    GpuFigures,
    HostFigures,
    MicroStep,
    PhaseComm,
    engine_kernels,
    exposed_seconds,
    micro_step,
    optimizer_bytes_per_param,
    peak_flops_for,
    split_phase,
)

# Device memory the caching allocator never sees (the CUDA context, loaded kernels, NCCL's
# buffers): rank 0's nvml_used − reserved read together after a step (python3
# bench/context_reserve.py). On H200 with torch 2.11, NCCL 2.28 and DeepSpeed 0.19.8
# (bench/results/context/, bench/gpu/context_round.sh; the real-model runs at Nd 2 and 4 in
# bench/results/real_models): torch 1.89 GiB alone, 2.15-2.18 GiB in an NCCL world of 2 or 4;
# DeepSpeed 2.28 and 2.65-2.66 GiB; on H100 at Nd 2, 2.05 and 2.53 GiB. Kept rounded up to
# 0.1 GiB. Across nodes NCCL's network buffers come on top (not measured).
CONTEXT_RESERVE: dict[tuple[Engine, bool], int] = {
    (Engine.TORCH, False): 19 * GIB // 10,
    (Engine.TORCH, True): 22 * GIB // 10,
    (Engine.DEEPSPEED, False): 23 * GIB // 10,
    (Engine.DEEPSPEED, True): 27 * GIB // 10,
}


def context_reserve(engine: Engine, gpus: int) -> tuple[int, str]:
    """Device bytes outside the allocator for ``engine`` over ``gpus`` ranks, and where the
    figure comes from (``CONTEXT_RESERVE``)."""
    world = gpus > 1
    reserve = CONTEXT_RESERVE[engine, world]
    source = (
        f"nvml_used − memory_reserved of rank 0 after a step, {engine.value} "
        + (
            f"with {gpus} ranks, as measured in NCCL worlds of 2 and 4 on one node"
            if world
            else "on one GPU"
        )
        + ", H100/H200 (torch 2.11, NCCL 2.28, DeepSpeed 0.19.8), rounded up to 0.1 GiB"
        + ("; across nodes NCCL's network buffers come on top (not measured)" if world else "")
    )
    return reserve, source


# bench/results/torch_peak.json: reserved is 10-25 % above the allocated peak (the caching
# allocator's rounding and freed blocks kept for reuse); the low end is kept free.
ALLOCATOR_MARGIN = 0.10
# DeepSpeed's offloaded boundary step (ZeRO-Offload: stage_1_and_2.py step with cpu_offload) runs
# CPU Adam over the host partition (csrc/adam, OpenMP) and torch's own ops around it on the
# host, which follow torch's intra-op threads. measure times it; with the parameters' predicted
# copy back and all-gather taken off, at the 30 B per parameter the planner streams
# (bench/offload_calibration.py on the 1B GPT's runs):
# - one thread per rank (OMP_NUM_THREADS=1, as torchrun and accelerate launch set it), two ranks
#   of a 32-core H200 host: 3.24 GB/s
#   (bench/results/plan_validation/ds_offload_h200x2_gpt_nd2.json);
#   CPU Adam alone steps at 21-24 GB/s there on one thread (bench/host_adam.py --optimizer
#   deepspeed), so the torch ops around it take most of the step.
# - every core, a node's only rank on a 16-core H200 host: 19.0-22.0 GB/s in three runs, the
#   lowest kept (ds_offload_timed_h200x1_gpt_nd1.json); two ranks of 16 threads each on the
#   32-core host: 15.4 GB/s (ds_offload_sixteen_threads_h200x2_gpt_nd2.json).
DEEPSPEED_HOST_OPTIMIZER_BANDWIDTH = 3.24e9
DEEPSPEED_HOST_OPTIMIZER_SOURCE = (
    "DeepSpeed's offloaded step (CPU Adam and torch's host ops around it) on one thread per "
    "rank (OMP_NUM_THREADS=1, as torchrun and accelerate launch set it): 3.24 GB/s per rank "
    "with 2 ranks on a 32-core H200 host (bench/results/plan_validation), stated"
)
DEEPSPEED_HOST_OPTIMIZER_BANDWIDTH_ALL_CORES = 19.0e9
DEEPSPEED_HOST_OPTIMIZER_ALL_CORES_SOURCE = (
    "DeepSpeed's offloaded step (CPU Adam and torch's host ops around it) on every core of the "
    "host: 19.0 GB/s for a node's only rank on a 16-core H200 host, the lowest of three runs "
    "(bench/results/plan_validation), stated; several ranks sharing the cores step slower "
    "(15.4 GB/s each for two ranks of 16 threads on 32 cores): give host_optimizer_bandwidth "
    "or calibrate on a run launched the same way"
)
# FSDP2's CPUOffloadPolicy steps torch's own optimizer on the host: on the CPU it takes the
# single-tensor loop (the foreach kernels serve CUDA-like devices only), on one thread per rank
# (torchrun and accelerate launch set OMP_NUM_THREADS=1). bench/host_adam.py, a 1.5B Llama's
# shards at world 4 on a 64-core H200 host, 4 ranks stepping at once: 7.85 ns per parameter
# = 10.2 GB/s at AdamW's 80 B (bench/results/host_adam/h200x4.json).
TORCH_HOST_OPTIMIZER_BANDWIDTH = 10.2e9
TORCH_HOST_OPTIMIZER_SOURCE = (
    "torch's single-tensor AdamW on one host thread per rank (OMP_NUM_THREADS=1, as torchrun "
    "and accelerate launch set it): 10.2 GB/s per rank with 4 ranks stepping at once on an "
    "H200 host (bench/results/host_adam), stated"
)
# A node's only rank, started by python or torchrun (which sets OMP_NUM_THREADS=1 only when a
# node runs several ranks), keeps torch's default intra-op threads: every core. bench/host_adam.py
# --threads 0, the same 1.5B Llama's parameters unsharded on a 16-core H200 host: 1.30 ns per
# parameter = 61.5 GB/s at AdamW's 80 B, 5.6 × its one-thread figure there (10.9 GB/s;
# bench/results/host_adam/h200x1_*.json). It scales with the host's cores and memory bandwidth.
TORCH_HOST_OPTIMIZER_BANDWIDTH_ALL_CORES = 61.5e9
TORCH_HOST_OPTIMIZER_ALL_CORES_SOURCE = (
    "torch's single-tensor AdamW on every core of the host (torch's default thread count, one "
    "rank per node): 61.5 GB/s on a 16-core H200 host (bench/results/host_adam), stated; a host "
    "with more or fewer cores steps faster or slower: give host_optimizer_bandwidth or calibrate "
    "on a run launched the same way"
)
# FSDP2 accumulates an offloaded gradient on the host (_fsdp_collectives.py foreach_reduce:
# sharded_param.grad._local_tensor += the copied shard): fp32 read 4 + read 4 + write 4.
HOST_ACCUMULATE_BYTES = 12
# Bounded work: the engines walk every parameter tensor once per configuration (about 7 µs a
# tensor on one core), so a search is capped at this many configuration × tensor visits (~2 s).
MAX_TENSOR_VISITS = 250_000


class HostThreads(StrEnum):
    """The intra-op threads each rank's host optimizer steps on (FSDP2's CPU offload)."""

    ONE = "one"
    """``OMP_NUM_THREADS=1``: torchrun with several ranks per node, and accelerate launch."""
    ALL = "all"
    """torch's default, every core: a node's only rank started by python or torchrun."""


class OffloadChoice(StrEnum):
    """What a candidate moves to host memory (DeepSpeed ZeRO-Offload / ZeRO-Infinity)."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    """Optimizer states (and, from stage 2, the gradient partition) in CPU memory; CPU Adam
    (DeepSpeed ZeRO-Offload)."""
    OPTIMIZER_AND_PARAMS = "optimizer_and_params"
    """Also the parameter partition: DeepSpeed's stage-3 ZeRO-Infinity (CPU), or FSDP2's
    ``CPUOffloadPolicy`` at stages 2 and 3 (shards, gradients and torch's optimizer on the
    host)."""

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
            # FSDP2's CPUOffloadPolicy moves the parameters with their optimizer, stages 2-3
            return self is OffloadChoice.OPTIMIZER_AND_PARAMS and stage >= Stage.GRADIENTS
        if self is OffloadChoice.OPTIMIZER:
            return stage >= Stage.OPTIMIZER
        return stage >= Stage.PARAMETERS


@dataclass(frozen=True)
class Search:
    """What may vary. ``micro_batch_sizes=None``: powers of two dividing the per-rank batch.

    Attributes:
        stages: ZeRO stages to try.
        micro_batch_sizes: sequences per micro-batch to try (None: derived).
        activation_checkpointing: recomputation policies to try (a transformers model skips
            selective: transformers checkpoints whole decoder layers).
        offload: offload choices to try (those an engine or stage cannot do are skipped).
        hsdp: also try sharding stage 3 within a node and replicating across nodes (FSDP2
            HYBRID_SHARD; engine torch, as DeepSpeed 0.19.8 removed MiCS); only with more than
            one node.
        checkpoint_offload: where full checkpointing keeps the layers' inputs: on the device
            (False) or in pinned host memory (True: transformers' ``offload=True``); tried for
            full checkpointing of a transformers model only.
        checkpoint_every_n_layers: which decoder layers full checkpointing checkpoints: 1 every
            layer, n layers 0, n, 2n, ... (transformers' ``every_n_layers``); above 1 tried for
            a transformers model under the torch engine only.
    """

    stages: tuple[Stage, ...] = tuple(Stage)
    micro_batch_sizes: tuple[int, ...] | None = None
    activation_checkpointing: tuple[Checkpointing, ...] = tuple(Checkpointing)
    offload: tuple[OffloadChoice, ...] = tuple(OffloadChoice)
    hsdp: bool = True
    checkpoint_offload: tuple[bool, ...] = (False, True)
    checkpoint_every_n_layers: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class Efficiency:
    """The two figures a calibration sets: the fraction of the GPU's dense peak the GEMMs reach,
    and the host's cost per dispatched kernel.

    Attributes:
        value: the GEMM efficiency.
        source: where it comes from, in words.
        calibration_id: the stored calibration that set it, if one did.
        host_seconds_per_kernel: host dispatch time per kernel.
        host_source: where that comes from, in words.
        host_calibration_id: the stored calibration that set it, if one did.
    """

    value: float = DEFAULT_EFFICIENCY
    source: str = DEFAULT_EFFICIENCY_SOURCE
    calibration_id: str | None = None
    host_seconds_per_kernel: float = DEFAULT_HOST_SECONDS_PER_KERNEL
    host_source: str = DEFAULT_HOST_SOURCE
    host_calibration_id: str | None = None


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
        padded: the batches come with a padding ``attention_mask`` (``Batch.padded``).
        engine: torch or deepspeed.
        engine_config: engine knobs (a DeepSpeed config body); the searched keys are replaced.
        precision, optimizer: training precision and optimizer.
        search: what may vary.
        efficiency: the GEMM efficiency and host cost per kernel to assume.
        gpu_figures: the other GPU-side figures (attention and memory efficiency, passes).
        context_reserve: device bytes outside the allocator (CUDA context, NCCL); None: the
            measured figure for the engine and the number of ranks (``context_reserve``).
        allocator_margin: fraction of the device kept free for the allocator's rounding.
        host_optimizer_bandwidth: host bytes/s one rank's CPU optimizer streams (None: the
            engine's stated figure, ``host_optimizer``).
        host_optimizer_given_source: where a given ``host_optimizer_bandwidth`` comes from.
        host_threads: the threads each rank's offloaded optimizer step runs on (None: as the
            launchers set them, ``host_optimizer_threads``).
        host_threads_source: why ``host_threads``, where given.
        grad_sync: when DDP (torch stages 0-1) reduces gradients under accumulation (a loop
            without ``no_sync`` reduces on every micro-step); FSDP2 (stages 2-3) is planned
            reducing on every micro-step, the accounting its memory figures follow.
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
    padded: bool = False
    precision: Precision = Precision.MIXED_BF16
    optimizer: Optimizer = Optimizer.ADAM
    search: Search = field(default_factory=Search)
    efficiency: Efficiency = field(default_factory=Efficiency)
    gpu_figures: GpuFigures = field(default_factory=GpuFigures)
    context_reserve: int | None = None
    allocator_margin: float = ALLOCATOR_MARGIN
    host_optimizer_bandwidth: float | None = None
    host_optimizer_given_source: str = "given"
    host_threads: HostThreads | None = None
    host_threads_source: str = "given"
    grad_sync: GradSync = GradSync.PER_STEP

    def __post_init__(self) -> None:
        if self.engine is Engine.PAPER:
            raise InputError("engine", "a plan runs a real engine's accounting: torch or deepspeed")
        if self.padded and self.architecture.modelling is None:
            raise InputError(
                "padded",
                "a padded attention_mask is modelled for transformers' modelling code (a model "
                "given by hf_config or a preset of a transformers family)",
            )
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
        if not self.efficiency.host_seconds_per_kernel > 0:
            raise InputError("host_seconds_per_kernel", "must be above 0 seconds")
        if not self.search.stages:
            raise InputError("search.stages", "give at least one stage")

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def per_rank_batch(self) -> int:
        return self.global_batch_size // self.gpus

    @property
    def reserve(self) -> tuple[int, str]:
        """The device bytes outside the allocator, and where the figure comes from."""
        if self.context_reserve is not None:
            return self.context_reserve, "given"
        return context_reserve(self.engine, self.gpus)

    @property
    def usable_memory(self) -> int:
        """Device bytes the allocator's peak may reach."""
        return int((self.gpu.memory - self.reserve[0]) * (1 - self.allocator_margin))

    @property
    def peak_flops(self) -> float:
        return peak_flops_for(self.precision, self.gpu.peak_flops_16bit, self.gpu.peak_flops_fp32)

    @property
    def gpu_side(self) -> GpuFigures:
        """The GPU-side figures with the efficiency's GEMM efficiency."""
        return replace(self.gpu_figures, gemm_efficiency=self.efficiency.value)

    @property
    def host_optimizer_threads(self) -> tuple[HostThreads, str]:
        """The threads each rank's offloaded optimizer step runs on (torch's optimizer under
        FSDP2's CPU offload, DeepSpeed's CPU Adam and the torch ops around it), and why."""
        if self.host_threads is not None:
            return self.host_threads, self.host_threads_source
        if self.gpus_per_node > 1:
            why = "several ranks per node: torchrun and accelerate launch set OMP_NUM_THREADS=1"
            if self.engine is Engine.DEEPSPEED:
                why += (
                    " (the deepspeed launcher leaves each rank every core: give "
                    "host_optimizer_threads all)"
                )
            return HostThreads.ONE, why
        return HostThreads.ALL, (
            "one rank per node: started by python or torchrun it keeps torch's default thread "
            "count, every core (accelerate launch sets OMP_NUM_THREADS=1: give "
            "host_optimizer_threads one)"
        )

    @property
    def host_optimizer(self) -> tuple[float, str]:
        """Host bytes/s of one rank's offloaded optimizer step, and where the figure comes from:
        DeepSpeed's offloaded step, or torch's own optimizer under FSDP2's CPU offload, on one
        thread or on every core."""
        if self.host_optimizer_bandwidth is not None:
            return self.host_optimizer_bandwidth, self.host_optimizer_given_source
        every_core = self.host_optimizer_threads[0] is HostThreads.ALL
        if self.engine is Engine.DEEPSPEED:
            if every_core:
                return (
                    DEEPSPEED_HOST_OPTIMIZER_BANDWIDTH_ALL_CORES,
                    DEEPSPEED_HOST_OPTIMIZER_ALL_CORES_SOURCE,
                )
            return DEEPSPEED_HOST_OPTIMIZER_BANDWIDTH, DEEPSPEED_HOST_OPTIMIZER_SOURCE
        if every_core:
            return TORCH_HOST_OPTIMIZER_BANDWIDTH_ALL_CORES, TORCH_HOST_OPTIMIZER_ALL_CORES_SOURCE
        return TORCH_HOST_OPTIMIZER_BANDWIDTH, TORCH_HOST_OPTIMIZER_SOURCE

    @property
    def host_side(self) -> HostFigures:
        e = self.efficiency
        return HostFigures(e.host_seconds_per_kernel, e.host_source)


@dataclass(frozen=True)
class Config:
    """One candidate configuration; ``checkpoint_offload``: full checkpointing keeps the
    layers' inputs in pinned host memory (transformers' ``offload=True``);
    ``checkpoint_every_n_layers``: it checkpoints layers 0, n, 2n, ... only."""

    stage: Stage
    micro_batch_size: int
    grad_accumulation_steps: int
    activation_checkpointing: Checkpointing
    offload: OffloadChoice
    shard_group_size: int | None = None
    checkpoint_offload: bool = False
    checkpoint_every_n_layers: int = 1


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
        compute: the micro-steps (forward + backward + recomputation), each as long as the
            slower of its GPU work and its host dispatch.
        recompute: the GEMM and attention time activation checkpointing repeats.
        optimizer_step: the element-wise optimizer update (device memory or host bound).
        exposed_communication: collective time not hidden behind compute.
        communication: all collective time, hidden or not.
        offload_transfer: device–host copies of offloaded states and of checkpoint offload's
            layer inputs (not hidden).
        checkpoint_transfer: the part of ``offload_transfer`` that checkpoint offload copies.
        matmul: GEMM and attention kernel time of the micro-steps.
        memory_bound: memory-bound kernel time of the micro-steps.
        gpu_busy: the micro-steps' GPU work (matmul + memory_bound).
        host_dispatch: the micro-steps' host dispatch time.
        micro: one micro-step on each queue.
    """

    compute: float
    recompute: float
    optimizer_step: float
    exposed_communication: float
    communication: float
    offload_transfer: float
    checkpoint_transfer: float = 0.0
    matmul: float = 0.0
    memory_bound: float = 0.0
    gpu_busy: float = 0.0
    host_dispatch: float = 0.0
    micro: MicroStep | None = None

    @property
    def host_bound(self) -> bool:
        return self.host_dispatch > self.gpu_busy

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
    attention_efficiency: float
    memory_efficiency: float
    activation_passes_forward: float
    activation_passes_backward: float
    parameter_bytes_forward: float
    parameter_bytes_backward: float
    host_seconds_per_kernel: float
    host_seconds_per_kernel_source: str
    parameter_tensors: int
    kernels: tuple[tuple[Stage, EngineKernels], ...]
    peak_flops: float
    peak_flops_source: str
    causal_attention_fraction: float
    attention_backward_factor: float
    context_reserve: int
    context_reserve_source: str
    allocator_margin: float
    usable_memory: int
    host_optimizer_bandwidth: float
    host_optimizer_source: str
    host_optimizer_threads: HostThreads
    host_optimizer_threads_source: str
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
    "a micro-step lasts max(GPU work, host dispatch): GEMMs at the GEMM efficiency, attention "
    "at the attention efficiency, memory-bound kernels as passes over the saved activation "
    "bytes plus bytes per parameter at the memory efficiency; host dispatch as kernels and "
    "engine-hook steps per parameter tensor times the host cost per kernel",
    "the GEMM efficiency does not depend on the micro-batch (72-80 % of the peak from 1 to 8 "
    "sequences of 1024 tokens on an H200); the optimizer step's host dispatch is not counted "
    "(multi-tensor kernels keep it GPU-bound)",
    "ranks whose hosts dispatch at different speeds wait for each other at every collective: "
    "not modelled (host-bound DDP steps ran 3-40 % slower at Nd 2-4 than at Nd 1)",
    "communication runs at the links' peak rates (α–β model): nccl-tests bus bandwidth is "
    "lower, so hidden/exposed splits are optimistic for bandwidth-bound steps",
    "overlapped collectives cost one call's time that cannot hide (the first all-gather, the "
    "last gradient bucket) plus whatever exceeds the compute of their phase",
    "offload transfers are not hidden behind compute; the CPU optimizer runs after backward",
    "checkpoint offload (transformers' offload=True): each checkpointed layer's input goes to "
    "pinned host memory in forward and comes back for its recomputation in backward, each copy "
    "on the compute stream at the host link's rate (one per layer each way): it holds up the "
    "kernels behind it and is counted whole in offload_transfer (checkpoint_transfer)",
    "transformers' every_n_layers (checkpoint_every_n_layers above 1): only layers 0, n, 2n, "
    "... run their forward again in backward, so the recomputed GEMMs, attention, memory "
    "passes and kernels are that share of full checkpointing's",
    "FSDP2's CPU offload (engine torch): torch's optimizer steps the host shards at the host "
    "optimizer bandwidth (80 B per parameter for AdamW, 72 for Adam); under gradient "
    "accumulation each later micro-step adds its copied gradient on the host (12 B per "
    "parameter) and waits for its reduce-scatters, which are then not hidden; it steps on one "
    "thread per rank where a node runs several ranks (torchrun and accelerate launch set "
    "OMP_NUM_THREADS=1) and on every core where a node runs one (host_optimizer_threads); "
    "several ranks launched with torch's default thread count oversubscribe the host's cores "
    "in that step (measured 10 × slower on 4 ranks of a 64-CPU host): set OMP_NUM_THREADS as "
    "torchrun does",
    "DeepSpeed's CPU offload: the boundary step runs CPU Adam and torch's host ops around it "
    "(30 B per parameter at the host optimizer bandwidth), on one thread per rank or every "
    "core as host_optimizer_threads says; the deepspeed launcher leaves each rank every core "
    "where torchrun and accelerate launch set one thread",
    "under gradient accumulation DDP candidates reduce as grad_sync says (per_step: no_sync on "
    "all but the last micro-step); FSDP2 candidates reduce-scatter on every micro-step, as "
    "their memory is counted: set_requires_gradient_sync(False) would keep every parameter's "
    "unsharded gradient in fp32 (4 bytes per parameter, unsharded) between micro-steps",
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
        out = dict(config)
        # the loop's knobs are the request's, not a candidate's: a bad one is refused here
        converts_outputs(out)
        holds_outputs(out)
        if CONVERT_OUTPUTS not in out and through_accelerate(config):
            out[CONVERT_OUTPUTS] = True  # accelerate's forward wrapper, as /v1/memory reads it
        return out
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


def checkpoint_offloads(setup: PlanSetup) -> tuple[bool, ...]:
    """Where full checkpointing may keep the layers' inputs: the search's choices for a
    transformers model (``offload=True`` is its gradient checkpointing's option), the device
    alone for the canonical decoder."""
    chosen = tuple(sorted(set(setup.search.checkpoint_offload)))
    if not chosen:
        raise InputError("search.checkpoint_offload", "give false, true or both")
    if setup.architecture.modelling is not None:
        return chosen
    if False not in chosen:
        raise InputError(
            "search.checkpoint_offload",
            "offload is transformers' gradient checkpointing option (a model given by hf_config "
            "or a preset of a transformers family); the canonical decoder's checkpoints keep "
            "their inputs on the device: include false",
        )
    return (False,)


def checkpoint_intervals(setup: PlanSetup) -> tuple[int, ...]:
    """Which ``every_n_layers`` full checkpointing may use: the search's choices for a
    transformers model under the torch engine (the memory model of the deepspeed engine
    checkpoints every layer), 1 alone otherwise."""
    name = "search.checkpoint_every_n_layers"
    chosen = tuple(sorted(set(setup.search.checkpoint_every_n_layers)))
    if not chosen or chosen[0] < 1:
        raise InputError(name, "give one or more layer intervals, each at least 1")
    if setup.architecture.modelling is not None and setup.engine is Engine.TORCH:
        return chosen
    if chosen[0] != 1:
        raise InputError(
            name,
            "above 1 is transformers' every_n_layers, planned for a transformers model (hf_config "
            "or a preset of a transformers family) under the torch engine: include 1",
        )
    return (1,)


def checkpointings(setup: PlanSetup) -> tuple[Checkpointing, ...]:
    """The search's recomputation policies the model's training code offers: transformers
    checkpoints whole decoder layers (``gradient_checkpointing_enable``), so a transformers model
    tries none and full, never the attention core alone."""
    chosen = setup.search.activation_checkpointing
    if setup.architecture.modelling is None:
        return chosen
    offered = tuple(c for c in chosen if c is not Checkpointing.SELECTIVE)
    if not offered:
        raise InputError(
            "search.activation_checkpointing",
            "transformers checkpoints whole decoder layers (gradient_checkpointing_enable): a "
            "transformers model (hf_config or a preset of a transformers family) tries none or "
            "full; selective recomputation of the attention core is not among them",
        )
    return offered


def configs(setup: PlanSetup) -> list[Config]:
    """Every configuration of the search space the engine can run."""
    shard_groups: list[int | None] = [None]
    # FSDP2 HYBRID_SHARD; DeepSpeed 0.19.8 removed MiCS (runtime/config.py), its shard groups
    if setup.search.hsdp and setup.nodes > 1 and setup.engine is Engine.TORCH:
        shard_groups.append(setup.gpus_per_node)
    moved = checkpoint_offloads(setup)
    intervals = checkpoint_intervals(setup)
    policies = checkpointings(setup)
    out = []
    for stage in sorted(set(setup.search.stages)):
        for offload in setup.search.offload:
            if not offload.allowed(setup.engine, stage):
                continue
            for shard in shard_groups:
                if shard is not None and stage is not Stage.PARAMETERS:
                    continue
                for ckpt in policies:
                    full = ckpt is Checkpointing.FULL
                    kept = moved if full else (False,)
                    every = intervals if full else (1,)
                    for m in micro_batch_sizes(setup):
                        ga = setup.per_rank_batch // m
                        for to_host in kept:
                            for n in every:
                                out.append(Config(stage, m, ga, ckpt, offload, shard, to_host, n))
    tensors = tensor_count(setup.architecture)
    if len(out) * tensors > MAX_TENSOR_VISITS:
        raise InputError(
            "search",
            f"{len(out)} configurations × {tensors:,} parameter tensors = "
            f"{len(out) * tensors:,} tensor evaluations, over {MAX_TENSOR_VISITS:,}: narrow "
            "stages, micro_batch_size, activation_checkpointing, offload, checkpoint_offload or "
            "checkpoint_every_n_layers",
        )
    return out


def _blocking_backward(phase: PhaseComm, micro_steps: int, window: float) -> float:
    """Exposed backward communication of FSDP2 with CPU offload over ``micro_steps``
    accumulating micro-steps: the first hides its reduce-scatters as without offload, each
    later one waits for them (``_fsdp_collectives.py`` ``foreach_reduce``: the copy to the
    host is ``non_blocking`` only when the parameter holds no gradient yet)."""
    first = exposed_seconds(
        PhaseComm(phase.repeated_seconds, phase.repeated_calls), 1, window, overlapped=True
    )
    return first + (micro_steps - 1) * phase.repeated_seconds + phase.once_seconds


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
        self._comm: dict[tuple[Stage, OffloadChoice, int | None, bool], _CommProfile] = {}
        self.communication_evaluations = 0
        self.tensors = tensor_count(setup.architecture)
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
            batch = replace(self.batch(c), grad_accumulation_steps=c.grad_accumulation_steps)
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

    def shard(self, c: Config) -> int:
        """Parameters one rank's optimizer updates: the whole model at stage 0, its partition
        from stage 1 on."""
        dp = 1 if c.stage is Stage.NONE else c.shard_group_size or self.setup.gpus
        return -(-self.setup.params // dp)

    def host_step_bytes(self, c: Config) -> float:
        """Bytes one rank's offloaded optimizer step streams on the host: DeepSpeed's CPU Adam,
        or torch's own optimizer over FSDP2's host shards."""
        s = self.setup
        if s.engine is Engine.TORCH:
            per_param = optimizer_bytes_per_param(s.precision, self.k, s.engine, s.optimizer)
        else:
            per_param = optimizer_bytes_per_param(s.precision, self.k)
        return float(self.shard(c) * per_param)

    def memory(self, c: Config) -> StageEstimate:
        return estimate(self.training(c, with_batch=True), [c.stage]).stages[0]

    def stage_communication(self, c: Config, micro_steps: int) -> StageCommunication:
        """The communication model's answer for ``c``'s stage at ``micro_steps``."""
        training = replace(self.training(c, with_batch=False), dp=self.setup.gpus)
        # FSDP2 reduce-scatters on every micro-step, as the memory figures count it: with
        # set_requires_gradient_sync(False) it would keep each parameter's unsharded gradient
        # in fp32 between micro-steps (_fsdp_param.py unsharded_accumulated_grad)
        fsdp2 = self.setup.engine is Engine.TORCH and c.stage >= Stage.GRADIENTS
        comm_setup = CommunicationSetup(
            training=training,
            topology=self.topology,
            network=self.setup.network,
            grad_accumulation_steps=micro_steps,
            grad_sync=GradSync.PER_MICRO_STEP if fsdp2 else self.setup.grad_sync,
            shard_group_size=c.shard_group_size,
            activation_checkpointing=c.activation_checkpointing,
        )
        self.communication_evaluations += 1
        return estimate_communication(comm_setup, [c.stage]).stages[0]

    def communication(self, c: Config) -> _CommProfile:
        """Per-micro-step and per-step parts of ``c``'s communication, from the model's answers
        at one and two micro-steps (every call costs the same at any count, so each figure is
        ``repeated · micro_steps + once``); shared by every micro-batch, and by every
        checkpointing policy but DeepSpeed's full recomputation (stage 3 fetches each layer
        again for it)."""
        recompute = (
            self.setup.engine is Engine.DEEPSPEED
            and c.stage is Stage.PARAMETERS
            and c.activation_checkpointing is Checkpointing.FULL
        )
        key = (c.stage, c.offload, c.shard_group_size, recompute)
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

    def regime(self, c: Config) -> Regime:
        """Activation dtypes: as calculators.engines.torch.memory and DeepSpeed's bf16 engine."""
        s = self.setup
        if s.precision is Precision.FP32:
            return Regime.FP32
        if s.engine is Engine.TORCH and s.precision.is_mixed and c.stage < Stage.GRADIENTS:
            return Regime.AUTOCAST  # DDP: fp32 parameters under torch.autocast
        return Regime.HALF

    def batch(self, c: Config) -> Batch:
        """One micro-batch of ``c``."""
        s = self.setup
        return Batch(
            c.micro_batch_size,
            s.seq_len,
            c.activation_checkpointing,
            padded=s.padded,
            checkpoint_offload=c.checkpoint_offload,
            checkpoint_every_n_layers=c.checkpoint_every_n_layers,
        )

    def checkpoint_copies(self, c: Config) -> float:
        """Seconds one micro-step spends copying the checkpointed layers' inputs to pinned host
        memory in forward and back in backward (``checkpoint_offload``): torch's
        ``save_on_cpu`` issues each copy on the compute stream (``non_blocking``), so the
        stream's next kernels wait for it; one copy per layer each way over the host link."""
        if not c.checkpoint_offload:
            return 0.0
        s = self.setup
        batch = self.batch(c)
        moved = offloaded_inputs(s.architecture, batch, self.regime(c))
        link = s.network.host
        copies = batch.checkpointed_layers(s.architecture.layers)
        return 2 * (moved / link.bandwidth + copies * float(link.latency))

    def micro_step(self, c: Config, host: HostFigures | None = None) -> MicroStep:
        s = self.setup
        batch = self.batch(c)
        return micro_step(
            s.architecture,
            s.params,
            self.tensors,
            batch,
            self.regime(c),
            s.peak_flops,
            float(s.gpu.memory_bandwidth),
            engine_kernels(s.engine, c.stage),
            c.shard_group_size or s.gpus,
            s.gpu_side,
            host or s.host_side,
        )

    def step_time(self, c: Config) -> tuple[StepTime, Overlap, int]:
        s = self.setup
        micro = self.micro_step(c)
        # collectives hide behind each phase's duration, whichever queue sets it; checkpoint
        # offload's copies hold the compute stream, half of them in each phase
        copies = self.checkpoint_copies(c)
        fwd = max(micro.gpu_forward, micro.host_forward) + copies / 2
        bwd = max(micro.gpu_backward, micro.host_backward) + copies / 2
        ga = c.grad_accumulation_steps

        comm = self.communication(c)
        ov = overlap(s.engine, c.stage, self.config)
        windows = {Phase.FORWARD: fwd, Phase.BACKWARD: bwd, Phase.STEP: 0.0}
        flags = {Phase.FORWARD: ov.forward, Phase.BACKWARD: ov.backward, Phase.STEP: ov.step}
        exposed = sum(exposed_seconds(comm.phases[p], ga, windows[p], flags[p]) for p in Phase)
        torch_offload = s.engine is Engine.TORCH and c.offload is not OffloadChoice.NONE
        if torch_offload and ga > 1:
            # foreach_reduce copies a gradient to the host without blocking only while the
            # parameter holds none: from the second micro-step on the copy blocks the host
            # until its reduce-scatter is done, so those reduce-scatters are not hidden
            b = comm.phases[Phase.BACKWARD]
            exposed += _blocking_backward(b, ga, bwd) - exposed_seconds(b, ga, bwd, ov.backward)
        collective = sum(comm.phases[p].total(ga) for p in Phase)

        if c.offload is OffloadChoice.NONE:
            per_param = optimizer_bytes_per_param(s.precision, self.k, s.engine, s.optimizer)
            bandwidth = float(s.gpu.memory_bandwidth) * s.gpu_figures.memory_efficiency
            optimizer = self.shard(c) * per_param / bandwidth if bandwidth > 0 else 0.0
        else:
            host = self.host_step_bytes(c)
            if s.engine is Engine.TORCH:
                # and (accumulating) each later micro-step's host add of the copied gradient
                host += self.shard(c) * (ga - 1) * HOST_ACCUMULATE_BYTES
            optimizer = host / s.host_optimizer[0]
        step = StepTime(
            compute=micro.seconds * ga,
            recompute=self.recompute_seconds(c, micro) * ga,
            optimizer_step=optimizer,
            exposed_communication=exposed,
            communication=collective,
            offload_transfer=comm.transfer[0] * ga + comm.transfer[1] + copies * ga,
            checkpoint_transfer=copies * ga,
            matmul=micro.matmul * ga,
            memory_bound=micro.memory_bound * ga,
            gpu_busy=micro.gpu * ga,
            host_dispatch=micro.host * ga,
            micro=micro,
        )
        return step, ov, round(comm.sent[0] * ga + comm.sent[1])

    def recompute_seconds(self, c: Config, micro: MicroStep) -> float:
        """GEMM and attention time checkpointing adds to one micro-step."""
        if c.activation_checkpointing is Checkpointing.NONE:
            return 0.0
        plain = self.micro_step(
            replace(
                c,
                activation_checkpointing=Checkpointing.NONE,
                checkpoint_offload=False,
                checkpoint_every_n_layers=1,
            )
        )
        return max(0.0, micro.matmul - plain.matmul)


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


class Learned(StrEnum):
    """Which figure a measured step sets."""

    GPU = "gpu"
    """The step was GPU-bound: it sets the GEMM efficiency."""
    HOST = "host"
    """The step was host-bound: it sets the host cost per kernel."""
    BOTH = "both"
    """A host probe set the host cost per kernel and the GPU-bound step the GEMM efficiency."""
    HOST_OPTIMIZER = "host_optimizer"
    """An offloaded run's timed optimizer step set the host optimizer bandwidth, and nothing
    else."""


@dataclass(frozen=True)
class HostProbe:
    """The training micro-step (forward + backward, no optimizer step) timed at a tiny batch,
    as ``measure.host_probe`` times it.

    Attributes:
        seconds: median time of one such micro-step, synchronised at both ends.
        micro_batch_size: its sequences.
        seq_len: its tokens per sequence.
    """

    seconds: float
    micro_batch_size: int
    seq_len: int


@dataclass(frozen=True)
class Calibration:
    """The figures a measured step implies.

    Attributes:
        efficiency: fraction of the dense peak the GEMMs reached (the setup's when the step was
            host-bound and the GPU side is not what it measures).
        host_seconds_per_kernel: host dispatch per kernel (the setup's when GPU-bound and no
            probe set it).
        learned: which of the two the measurement set.
        other_seconds: predicted time outside the micro-steps taken off the measured step
            (optimizer step, exposed communication, offload transfer).
        predicted_step_seconds: the step the setup's figures predict.
        probe_dispatches: kernels and engine-hook steps the model counts in the probe's
            micro-step (None without a probe).
        probe_gpu_seconds: the probe's predicted GPU work at the calibrated efficiency.
        probe_other_seconds: the probe's predicted exposed communication and offload transfer
            taken off its time.
        host_optimizer_bandwidth: host bytes/s of one rank's offloaded optimizer step, from the
            run's own timed step (None: the run did not offload, or did not time it).
        host_optimizer_threads: the threads each of the run's ranks stepped on, which a plan
            reuses ``host_optimizer_bandwidth`` for (None with it, or for DeepSpeed).
        notes: what the calibration could not set, and why.
    """

    efficiency: float
    host_seconds_per_kernel: float
    learned: Learned
    other_seconds: float
    predicted_step_seconds: float
    probe_dispatches: float | None = None
    probe_gpu_seconds: float | None = None
    probe_other_seconds: float | None = None
    host_optimizer_bandwidth: float | None = None
    host_optimizer_threads: HostThreads | None = None
    notes: tuple[str, ...] = ()


def _with_figures(setup: PlanSetup, efficiency: float, host: float) -> PlanSetup:
    e = replace(setup.efficiency, value=efficiency, host_seconds_per_kernel=host)
    return replace(setup, efficiency=e)


def _micro_seconds(
    setup: PlanSetup, config: Config, measured_seconds: float, communicated: bool
) -> tuple[float, float, StepTime]:
    """(measured seconds per micro-step, predicted time outside the micro-steps, prediction)."""
    if measured_seconds <= 0:
        raise InputError("step_time_s", "a measured step time must be above 0 seconds")
    _, step, _ = predict(setup, config)
    other = step.optimizer_step
    if communicated:
        other += step.exposed_communication + step.offload_transfer
    per_micro = (measured_seconds - other) / config.grad_accumulation_steps
    if per_micro <= 0:
        raise InputError(
            "step_time_s",
            f"the measured step ({measured_seconds:.4g} s) is not longer than the predicted "
            f"optimizer step, communication and offload ({other:.4g} s): nothing left for the "
            "micro-steps",
        )
    return per_micro, other, step


def _gemm_efficiency(setup: PlanSetup, micro: MicroStep, per_micro: float) -> float:
    """The GEMM efficiency at which the micro-step's GPU work lasts ``per_micro`` seconds."""
    gemm = micro.gemm_forward + micro.gemm_backward
    rest = micro.gpu - gemm
    if per_micro <= rest:
        raise InputError(
            "step_time_s",
            f"the measured micro-step ({per_micro:.4g} s) is not longer than its predicted "
            f"attention and memory-bound kernels ({rest:.4g} s): nothing left for GEMMs",
        )
    eff = setup.efficiency.value * gemm / (per_micro - rest)
    if eff > 1:
        raise InputError(
            "step_time_s",
            f"the measured step implies GEMMs at {eff:.0%} of the peak: above 100 %, "
            "so the GPU's peak or the model given does not match the run",
        )
    return eff


# A step whose host dispatch is above this share of its measured micro-step is close to balanced:
# the max(GPU, host) model assumes the queues overlap fully, which they do less near balance.
BALANCED = 0.8
# Bisection steps for the probe's host cost: the bracket shrinks 2^-60, far below any timing's
# resolution.
_PROBE_BISECTIONS = 60


@dataclass(frozen=True)
class _ProbeFit:
    host: float | None  # None: the probe's predicted GPU work and communication fill its time
    dispatches: float
    gpu_seconds: float
    other_seconds: float


def _probe_host(
    setup: PlanSetup, config: Config, probe: HostProbe, communicated: bool
) -> _ProbeFit:
    """The host cost per kernel at which the model predicts the probe's measured time.

    The probe is ``config``'s micro-step at the probe's batch, one micro-step, forward and
    backward only: predicted as max(GPU work, dispatches × host cost) plus the forward and
    backward collectives left exposed (their windows are the phases' durations, so they shrink
    as the host cost grows) and the per-micro-step offload transfer. That prediction never
    falls as the host cost grows, so bisection finds the smallest host cost that reaches the
    measured time.
    """
    if probe.seconds <= 0:
        raise InputError("host_probe", "the probe's time must be above 0 seconds")
    gpus = setup.gpus
    probe_setup = replace(
        setup, seq_len=probe.seq_len, global_batch_size=probe.micro_batch_size * gpus
    )
    probe_config = replace(
        config, micro_batch_size=probe.micro_batch_size, grad_accumulation_steps=1
    )
    ev = _Evaluator(probe_setup)
    comm = ev.communication(probe_config) if communicated else None
    ov = overlap(setup.engine, config.stage, ev.config)
    flags = {Phase.FORWARD: ov.forward, Phase.BACKWARD: ov.backward}

    def parts(host: float) -> tuple[MicroStep, float]:
        micro = ev.micro_step(probe_config, HostFigures(host, "probe"))
        if comm is None:
            return micro, 0.0
        windows = {
            Phase.FORWARD: max(micro.gpu_forward, micro.host_forward),
            Phase.BACKWARD: max(micro.gpu_backward, micro.host_backward),
        }
        exposed = sum(exposed_seconds(comm.phases[p], 1, windows[p], flags[p]) for p in flags)
        return micro, exposed + comm.transfer[0]

    def predicted(host: float) -> float:
        micro, other = parts(host)
        return micro.seconds + other

    micro0, other0 = parts(0.0)
    dispatches = micro0.kernels + micro0.hook_steps
    if predicted(0.0) >= probe.seconds or dispatches <= 0:
        return _ProbeFit(None, dispatches, micro0.gpu, other0)
    low, high = 0.0, probe.seconds / dispatches  # predicted(high) ≥ dispatches × high
    for _ in range(_PROBE_BISECTIONS):
        mid = (low + high) / 2
        if predicted(mid) < probe.seconds:
            low = mid
        else:
            high = mid
    micro, other = parts(high)
    return _ProbeFit(high, dispatches, micro.gpu, other)


def _offload_note(
    setup: PlanSetup, config: Config, step: StepTime, measured: float, timed: bool = False
) -> tuple[str, ...]:
    """What calibrating on an offloaded run takes as given (``timed``: the host optimizer's
    bandwidth comes from the run's own timed step)."""
    if config.offload is OffloadChoice.NONE:
        return ()
    bandwidth, source = setup.host_optimizer
    if timed:
        return (
            f"the run offloads: its host optimizer step, timed at {step.optimizer_step:.3g} s "
            f"of the measured {measured:.3g} s, sets the host optimizer bandwidth "
            f"({bandwidth / 1e9:.3g} GB/s per rank); the offload transfers are taken as "
            "predicted",
        )
    return (
        f"the run offloads: its host optimizer step ({step.optimizer_step:.3g} s of the measured "
        f"{measured:.3g} s) and offload transfers are taken as predicted "
        f"({bandwidth / 1e9:.3g} GB/s: {source}), so their error goes into the calibrated "
        "figures; a run that times its host optimizer step (measure does under FSDP2's CPU "
        "offload) or a run without offload calibrates them cleanly",
    )


def _offloaded_step_note(figures: str) -> str:
    """The note of an offloaded run whose step does not set ``figures`` ("the GEMM efficiency
    is", "neither figure is")."""
    return (
        f"an offloaded run: {figures} not taken from its step, whose remainder also holds FSDP2's "
        "copies to and from the host, which the model under-predicts on some hosts (0.2-0.7 s "
        "a step on 1-1.5B models at Nd 2 on a 32-core host, measured: docs/VALIDATION.md); "
        "calibrate on a run without offload, or ask figure gpu for this one"
    )


def _host_optimizer_only(setup: PlanSetup, config: Config, measured: float) -> Calibration:
    """An offloaded run's calibration that sets the host optimizer bandwidth (``setup`` holds
    the timed figure) and keeps the other figures as they are."""
    _, step, _ = predict(setup, config)
    e = setup.efficiency
    return Calibration(
        efficiency=e.value,
        host_seconds_per_kernel=e.host_seconds_per_kernel,
        learned=Learned.HOST_OPTIMIZER,
        other_seconds=step.optimizer_step,
        predicted_step_seconds=step.total,
        host_optimizer_bandwidth=setup.host_optimizer_bandwidth,
        host_optimizer_threads=setup.host_optimizer_threads[0],
        notes=(
            *_offload_note(setup, config, step, measured, True),
            _offloaded_step_note("neither figure is"),
        ),
    )


def recorded_threads(count: int) -> tuple[HostThreads, str]:
    """The host threads of a measured run whose ranks ran on ``count`` torch threads, and the
    source that says so."""
    threads = HostThreads.ONE if count == 1 else HostThreads.ALL
    return threads, f"the measured run's ranks stepped on {count} thread(s)"


def _timed_host_optimizer(
    setup: PlanSetup, config: Config, seconds: float | None
) -> tuple[PlanSetup, bool]:
    """``setup`` with the host optimizer bandwidth the run's timed optimizer step implies,
    where the run offloads and timed it (and whether it did)."""
    if seconds is None or config.offload is OffloadChoice.NONE:
        return setup, False
    if not seconds > 0:
        raise InputError("host_optimizer_step_s", "a timed host optimizer step must be above 0 s")
    ev = _Evaluator(setup)
    host = seconds
    source = f"measured: the calibrating run's host optimizer step, {seconds:.4g} s"
    if setup.engine is Engine.DEEPSPEED:
        # DeepSpeed's engine.step() at the boundary also copies the updated parameters back and
        # (stages 1-2) all-gathers them: taken off as predicted, CPU Adam is the rest
        comm = ev.communication(config)
        around = comm.transfer[1] + comm.phases[Phase.STEP].total(config.grad_accumulation_steps)
        host = seconds - around
        if not host > 0:
            raise InputError(
                "host_optimizer_step_s",
                f"the timed step ({seconds:.4g} s) is no longer than the parameters' predicted "
                f"copy back and all-gather ({around:.4g} s): it cannot time CPU Adam",
            )
        source += f", less {around:.3g} s of predicted copy back and all-gather"
    bandwidth = ev.host_step_bytes(config) / host
    return replace(
        setup, host_optimizer_bandwidth=bandwidth, host_optimizer_given_source=source
    ), True


def calibrate(
    setup: PlanSetup,
    config: Config,
    measured_seconds: float,
    *,
    communicated: bool = True,
    learn: Learned | None = None,
    probe: HostProbe | None = None,
    host_optimizer_seconds: float | None = None,
) -> Calibration:
    """Solve the step-time model for the figures one measured configuration sets.

    The measured step minus the predicted optimizer step, exposed communication and offload,
    over the micro-steps, is one micro-step's time. Without a probe: where the setup's figures
    predict the GPU to be the slower queue, that time sets the GEMM efficiency (attention and
    memory-bound kernels kept at their stated figures); where they predict the host, it sets
    the host cost per kernel. ``learn`` names the figure instead (the run is then taken to be
    bound by that queue).

    With a host probe (the same micro-step at a tiny batch, :class:`HostProbe`): the probe sets
    the host cost per kernel (its time over the kernels and hook steps the model counts, less
    its exposed communication), then the measured step, with that host cost, sets the GEMM
    efficiency where the model finds it GPU-bound; where the probe's host cost makes the step
    host-bound, the efficiency keeps the setup's figure and a note says why. Each figure is
    solved with the other's latest value, twice. ``learn=HOST`` takes the probe alone,
    ``learn=GPU`` the step alone. ``communicated=False`` for a simulated world (collectives
    complete without moving data): only the optimizer step is taken off.

    ``host_optimizer_seconds``: an offloaded run's own timed optimizer step, which sets the host
    optimizer bandwidth (:attr:`Calibration.host_optimizer_bandwidth`) before the other figures
    are solved; without it the stated bandwidth is taken as given. An offloaded run's step
    also holds FSDP2's copies to and from the host, which the model under-predicts
    (``bench/offload_calibration.py``), so without ``learn`` it does not set the GEMM
    efficiency: its probe sets the host cost per kernel, else (timed) it sets the host optimizer
    bandwidth alone (``Learned.HOST_OPTIMIZER``). One with neither (recorded before ``measure``
    timed the step) is solved from the whole step, its notes saying where the error goes.
    """
    if learn is Learned.BOTH and probe is None:
        raise InputError("figure", "both figures from one run need the run's host probe")
    setup, timed = _timed_host_optimizer(setup, config, host_optimizer_seconds)
    host_bandwidth = setup.host_optimizer_bandwidth if timed else None
    host_threads = setup.host_optimizer_threads[0] if timed else None
    if learn is Learned.HOST_OPTIMIZER and not timed:
        raise InputError(
            "figure",
            "host_optimizer needs a run that offloads its optimizer to the CPU and timed its "
            "step there (measure times it under FSDP2's CPU offload)",
        )
    # an offloaded step: its remainder is no clean measure of the GPU (see the docstring)
    guarded = learn is None and config.offload is not OffloadChoice.NONE
    guarded = guarded and (timed or probe is not None)
    if guarded:
        learn = Learned.HOST if probe is not None else Learned.HOST_OPTIMIZER
    if learn is Learned.HOST_OPTIMIZER:
        return _host_optimizer_only(setup, config, measured_seconds)
    use_probe = probe is not None and learn is not Learned.GPU
    if not use_probe:
        per_micro, other, step = _micro_seconds(setup, config, measured_seconds, communicated)
        micro = step.micro
        assert micro is not None  # predict always times the micro-step
        eff = setup.efficiency.value
        host = setup.efficiency.host_seconds_per_kernel
        learned = learn or (Learned.HOST if micro.host_bound else Learned.GPU)
        if learned is Learned.HOST:
            host *= per_micro / micro.host
        else:
            eff = _gemm_efficiency(setup, micro, per_micro)
        skipped: tuple[str, ...] = _offload_note(setup, config, step, measured_seconds, timed)
        if probe is not None:
            skipped += ("figure gpu: the host probe was not used",)
        return Calibration(
            efficiency=eff,
            host_seconds_per_kernel=host,
            learned=learned,
            other_seconds=other,
            predicted_step_seconds=step.total,
            host_optimizer_bandwidth=host_bandwidth,
            host_optimizer_threads=host_threads,
            notes=skipped,
        )
    assert probe is not None
    prior = setup.efficiency
    eff, host = prior.value, prior.host_seconds_per_kernel
    fit = _probe_host(setup, config, probe, communicated)
    set_gpu = False
    per_micro, other, step = _micro_seconds(setup, config, measured_seconds, communicated)
    notes = list(_offload_note(setup, config, step, measured_seconds, timed))
    for _ in range(2):  # each figure solved with the other's latest value
        host = prior.host_seconds_per_kernel if fit.host is None else fit.host
        if learn is Learned.HOST:
            break
        current = _with_figures(setup, eff, host)
        per_micro, other, step = _micro_seconds(current, config, measured_seconds, communicated)
        micro = step.micro
        assert micro is not None
        set_gpu = micro.host < per_micro
        eff = _gemm_efficiency(current, micro, per_micro) if set_gpu else prior.value
        fit = _probe_host(_with_figures(setup, eff, host), config, probe, communicated)
    set_host = fit.host is not None
    host = prior.host_seconds_per_kernel if fit.host is None else fit.host
    if not set_host:
        notes.append(
            f"the host probe ({probe.seconds:.4g} s) is not longer than its predicted GPU work "
            f"and communication ({fit.gpu_seconds + fit.other_seconds:.4g} s): it does not "
            "show the host, so the host cost keeps its figure "
            f"({prior.host_seconds_per_kernel * 1e6:.3g} µs per kernel: {prior.host_source})"
        )
    elif fit.gpu_seconds > 0.5 * probe.seconds:
        notes.append(
            f"the probe's predicted GPU work ({fit.gpu_seconds:.4g} s) is over half its time "
            f"({probe.seconds:.4g} s): the host cost assumes the two queues overlap fully"
        )
    if guarded:
        notes.append(_offloaded_step_note("the GEMM efficiency is"))
    elif learn is Learned.HOST:
        notes.append("figure host: the GEMM efficiency was not calibrated")
    elif set_gpu and step.micro is not None and step.micro.host > BALANCED * per_micro:
        notes.append(
            f"the measured micro-step ({per_micro:.4g} s) is close to balanced (host dispatch "
            f"{step.micro.host:.4g} s): where the queues do not overlap fully, the GEMM "
            "efficiency absorbs the difference"
        )
    elif not set_gpu:
        assert step.micro is not None
        notes.append(
            f"the measured micro-step ({per_micro:.4g} s) is host-bound at the probe's host "
            f"cost (predicted host dispatch {step.micro.host:.4g} s ≥ the measured time): it "
            "does not show the GPU's speed, so the GEMM efficiency keeps its figure "
            f"({prior.value:.3g}: {prior.source})"
        )
    if set_host and set_gpu:
        learned = Learned.BOTH
    elif set_host:
        learned = Learned.HOST
    elif set_gpu:
        learned = Learned.GPU
    elif guarded and timed:  # the probe does not show the host: the timed step alone
        return _host_optimizer_only(setup, config, measured_seconds)
    else:
        raise InputError(
            "host_probe",
            "neither figure can be calibrated: " + "; ".join(notes),
        )
    return Calibration(
        efficiency=eff,
        host_seconds_per_kernel=host,
        learned=learned,
        other_seconds=other,
        predicted_step_seconds=predict(setup, config)[1].total,
        probe_dispatches=fit.dispatches,
        probe_gpu_seconds=fit.gpu_seconds,
        probe_other_seconds=fit.other_seconds,
        host_optimizer_bandwidth=host_bandwidth,
        host_optimizer_threads=host_threads,
        notes=tuple(notes),
    )


def assumptions(setup: PlanSetup) -> Assumptions:
    g = setup.gpu
    gf = setup.gpu_figures
    modelling = setup.architecture.modelling
    eager = modelling is not None and modelling.eager_attention
    threads = setup.host_optimizer_threads
    return Assumptions(
        efficiency=setup.efficiency.value,
        efficiency_source=setup.efficiency.source,
        attention_efficiency=gf.attention_efficiency,
        memory_efficiency=gf.memory_efficiency,
        activation_passes_forward=gf.activation_passes_forward,
        activation_passes_backward=gf.activation_passes_backward,
        parameter_bytes_forward=gf.parameter_bytes_forward,
        parameter_bytes_backward=gf.parameter_bytes_backward,
        host_seconds_per_kernel=setup.efficiency.host_seconds_per_kernel,
        host_seconds_per_kernel_source=setup.efficiency.host_source,
        parameter_tensors=tensor_count(setup.architecture),
        kernels=tuple(
            (stage, engine_kernels(setup.engine, stage))
            for stage in sorted(set(setup.search.stages))
        ),
        peak_flops=setup.peak_flops,
        peak_flops_source=(
            f"{g.label}: "
            + ("FP32 without tensor cores" if setup.precision is Precision.FP32 else "dense BF16")
            + f" ({g.source})"
        ),
        causal_attention_fraction=1.0 if setup.padded or eager else CAUSAL_FRACTION,
        attention_backward_factor=ATTENTION_BACKWARD_FACTOR,
        context_reserve=setup.reserve[0],
        context_reserve_source=setup.reserve[1],
        allocator_margin=setup.allocator_margin,
        usable_memory=setup.usable_memory,
        host_optimizer_bandwidth=setup.host_optimizer[0],
        host_optimizer_source=setup.host_optimizer[1],
        host_optimizer_threads=threads[0],
        host_optimizer_threads_source=threads[1],
        offload_transfer_overlapped=False,
        compute_slowdown_from_overlap=0.0,
        notes=ASSUMPTION_NOTES
        + (
            ()
            if g.memory_bandwidth
            else ("no memory bandwidth given: the on-device optimizer step is counted as 0 s",)
        )
        + (
            (
                "eager attention (hf_config attn_implementation): its step time computes every "
                "score (no causal half) at the attention efficiency stated for fused kernels "
                "and counts its saved probabilities in the memory-bound passes; measured on one "
                "1.5B model (H200, Nd 1 and 2), calibration with the host probe put the GEMM "
                "efficiency at 0.35-0.37 (0.48-0.54 with SDPA) and left a median error of "
                "8-20 %: calibrate on this model and GPU",
            )
            if eager
            else ()
        ),
    )
