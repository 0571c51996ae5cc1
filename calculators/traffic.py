"""What an engine's step sends: collectives, offload transfers, and their per-stage totals.

Result and setup types only; each engine's traffic lives beside its memory model
(``calculators/engines/``), the time model in ``calculators.cost``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from calculators.batch import Checkpointing
from calculators.conventions import FP32_BYTES, HALF_BYTES, Precision, Stage
from calculators.errors import InputError
from calculators.model_states import TrainingSetup, ceil_div
from calculators.parameters import ParamTensor, architecture_params, implied_params, param_numels
from calculators.topology import Group, Network, Op, Topology, sent_factor


class Phase(StrEnum):
    """When in a training step a collective runs."""

    FORWARD = "forward"
    BACKWARD = "backward"
    STEP = "step"


class GradSync(StrEnum):
    """When gradients are reduced under gradient accumulation (where the engine lets you choose)."""

    PER_STEP = "per_step"
    """Accumulate locally and reduce once per optimizer step (DDP ``no_sync``, FSDP2
    ``set_requires_gradient_sync(False)`` on all but the last micro-step)."""
    PER_MICRO_STEP = "per_micro_step"
    """Reduce after every micro-batch's backward."""


@dataclass(frozen=True)
class Collective:
    """Calls of one collective in one phase of one optimizer step.

    Attributes:
        op: the operation.
        phase: forward, backward or step.
        calls: how many times it is called per optimizer step.
        payload_bytes: sum over the calls of each call's full (unsharded) tensor size.
        dtype: element type on the wire.
        group: the process group it runs in.
        what: what it moves, in a few words.
    """

    op: Op
    phase: Phase
    calls: int
    payload_bytes: int
    dtype: str
    group: Group
    what: str

    @property
    def exact_sent(self) -> Fraction:
        """Bytes sent per rank before rounding up to whole bytes."""
        return self.payload_bytes * sent_factor(self.op, self.group.size)

    @property
    def sent_bytes_per_rank(self) -> int:
        # ⌈payload · a/b⌉ = ⌈payload·a / b⌉ in integers: ``exact_sent`` without its Fraction
        factor = sent_factor(self.op, self.group.size)
        return ceil_div(self.payload_bytes * factor.numerator, factor.denominator)


@dataclass(frozen=True)
class Transfer:
    """Offload traffic between device and host (or NVMe) per optimizer step.

    Attributes:
        direction: ``d2h`` or ``h2d`` (device to host, host to device).
        phase: when it happens.
        bytes: bytes per rank per optimizer step.
        what: what moves.
    """

    direction: str
    phase: Phase
    bytes: int
    what: str


@dataclass(frozen=True)
class CollectiveCost:
    """A collective with its link split and time."""

    collective: Collective
    intra_node_bytes_per_rank: int
    inter_node_bytes_per_rank: int
    time_seconds: float


@dataclass(frozen=True)
class StageCommunication:
    """One stage's traffic per optimizer step, per rank."""

    stage: Stage
    collectives: tuple[CollectiveCost, ...]
    transfers: tuple[Transfer, ...]
    sent_bytes_per_rank: int
    ratio_to_ddp: Fraction | None
    collective_time_seconds: float
    transfer_seconds: tuple[float, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def transfer_time_seconds(self) -> float:
        return sum(self.transfer_seconds)

    @property
    def time_seconds(self) -> float:
        return self.collective_time_seconds + self.transfer_time_seconds


@dataclass(frozen=True)
class ZeroPlusPlus:
    """ZeRO++ (arXiv 2306.10209) options.

    Attributes:
        qwz: quantized weights: parameter all-gathers in int8 with per-block scales.
        hpz: secondary partition size: backward all-gathers inside groups of this many ranks.
        qgz: quantized gradients: int4 hierarchical all-to-all instead of reduce-scatter.
    """

    qwz: bool = False
    hpz: int = 1
    qgz: bool = False

    @property
    def any(self) -> bool:
        return self.qwz or self.hpz > 1 or self.qgz


@dataclass(frozen=True)
class CommunicationSetup:
    """Everything the communication model needs.

    Attributes:
        training: model, dp/tp/pp, precision, engine, offload, engine_config.
        topology: where the ranks sit.
        network: link classes and algorithm.
        grad_accumulation_steps: micro-batches per optimizer step.
        grad_sync: when gradients are reduced where the engine leaves it to the user.
        shard_group_size: HSDP / MiCS shard group (None: shard over all of dp).
        zeropp: ZeRO++ options.
        reshard_after_forward: FSDP2 stage-3 setting (torch); applied to every FSDP group.
        activation_checkpointing: recomputation policy; under ``full`` (here or in
            ``training.batch``) DeepSpeed stage 3 fetches every layer's parameters again for
            its recomputation.
    """

    training: TrainingSetup
    topology: Topology
    network: Network = field(default_factory=Network)
    grad_accumulation_steps: int = 1
    grad_sync: GradSync = GradSync.PER_STEP
    shard_group_size: int | None = None
    zeropp: ZeroPlusPlus = field(default_factory=ZeroPlusPlus)
    activation_checkpointing: Checkpointing = Checkpointing.NONE

    def __post_init__(self) -> None:
        if self.grad_accumulation_steps < 1:
            raise InputError("grad_accumulation_steps", "must be at least 1")
        s = self.shard_group_size
        if s is not None and (s < 1 or self.training.dp % s):
            raise InputError("shard_group_size", f"must divide dp = {self.training.dp}")
        if self.zeropp.hpz < 1 or self.training.dp % self.zeropp.hpz:
            raise InputError("zeropp.hpz", f"must divide dp = {self.training.dp}")

    @property
    def recomputes_layers(self) -> bool:
        """Every layer's forward runs again in backward (full activation checkpointing)."""
        batch = self.training.batch
        full = Checkpointing.FULL
        return self.activation_checkpointing is full or (
            batch is not None and batch.activation_checkpointing is full
        )


@dataclass(frozen=True)
class EngineTraffic:
    collectives: tuple[Collective, ...]
    transfers: tuple[Transfer, ...] = ()
    notes: tuple[str, ...] = ()


IGNORED = (
    "The time ignores overlap of communication with compute (engines overlap most of it), "
    "congestion from other jobs or parallel dimensions, kernel/protocol efficiency below the "
    "links' peak rates, NVLS/SHARP in-network reduction, and scalar all-reduces (overflow flag, "
    "gradient norm)."
)


def micro_steps(setup: CommunicationSetup) -> int:
    return setup.grad_accumulation_steps


def reductions(setup: CommunicationSetup) -> int:
    """Gradient reductions per step where the user picks (DDP no_sync and the like)."""
    return micro_steps(setup) if setup.grad_sync is GradSync.PER_MICRO_STEP else 1


def process_groups(setup: CommunicationSetup) -> tuple[Group, Group, Group]:
    """(whole DP group, shard group, replica group) under ``shard_group_size``."""
    topo = setup.topology
    dp_group = topo.dp_group()
    s = setup.shard_group_size
    if s is None or s == setup.training.dp:
        return dp_group, dp_group, topo.dp_group(1)
    return dp_group, topo.dp_group(s), topo.dp_group(setup.training.dp // s, s)


@dataclass(frozen=True)
class CommunicationEstimate:
    setup: CommunicationSetup
    stages: tuple[StageCommunication, ...]
    convention: str
    ignores: str = IGNORED


def params_of(setup: TrainingSetup) -> Sequence[ParamTensor] | None:
    """The device's parameter tensors in ``named_parameters`` order.

    ``engine_config["tensors"]`` where the caller knows the built module's own list (the
    measure runner for a Hugging Face model), else an architecture's, or for a bare count those
    of the dense decoder Ψ implies (``calculators.parameters.implied_decoder``); ``None`` with
    tensor or pipeline parallelism (or Ψ below the smallest implied shape), where engines take
    Ψ as one run of elements.

    Raises:
        InputError: ``engine_config.tensors`` is not a list of [name, shape, group] triples.
    """
    given = (setup.engine_config or {}).get("tensors")
    if given is not None:
        try:
            return tuple(ParamTensor(str(n), tuple(int(d) for d in s), str(g)) for n, s, g in given)
        except (TypeError, ValueError):
            raise InputError(
                "engine_config.tensors", "must be a list of [name, shape, group] triples"
            ) from None
    if setup.tp * setup.pp != 1:
        return None
    if setup.architecture is None:
        return implied_params(setup.params)
    return architecture_params(setup.architecture)


def elements(params: Sequence[ParamTensor] | None, psi: int) -> list[int]:
    """Element counts in registration order; Ψ as one run when the tensors are unknown."""
    return list(param_numels(params)) if params is not None else [psi]


def padded(numel: int, n: int) -> int:
    """numel rounded up to a multiple of n (DeepSpeed stage 3 ``_aligned_size``)."""
    return ceil_div(numel, n) * n


def dtype_name(nbytes: int, precision: Precision) -> str:
    if nbytes == FP32_BYTES:
        return "fp32"
    if nbytes == HALF_BYTES:
        return "fp16" if precision is Precision.MIXED_FP16 else "bf16"
    return {1: "int8"}.get(nbytes, f"{nbytes}B")
