"""Communication per optimizer step: which collectives each stage issues, how many bytes each
rank sends, over which links, and how long it takes.

Three conventions, each modelled from its source:

- ``paper``: ZeRO (arXiv 1910.02054) §7: all-reduce 2Ψ; stages 1/2 reduce-scatter + all-gather
  (2Ψ); stage 3 all-gather forward + all-gather backward + reduce-scatter (3Ψ).
- ``deepspeed``: DeepSpeed 0.19.8 (deepspeed/runtime/engine.py, zero/stage_1_and_2.py,
  zero/stage3.py, zero/partitioned_param_coordinator.py, zero/parameter_offload.py).
- ``torch``: DDP (stage 0), DDP + ZeroRedundancyOptimizer (stage 1), FSDP2 ``fully_shard``
  with ``reshard_after_forward=False`` (stage 2) and ``True`` (stage 3).

Bytes sent per rank use the exact ring factors (NVIDIA nccl-tests doc/PERFORMANCE.md):
all-reduce 2(N−1)/N, all-gather / reduce-scatter / all-to-all (N−1)/N. Broadcast and reduce move
the whole payload over every ring link but the last: each rank sends (N−1)/N of it on average
(the root sends all of it); their bus-bandwidth factor is 1.

Time is an α–β model: per call NCCL's base latency plus one hop latency per ring step
(NCCL src/graph/tuning.cc), plus bus-factor × payload / bus bandwidth of the slowest link class
the ring crosses. It ignores overlap with compute, congestion from other traffic, protocol
and kernel efficiency below the link's peak rate, and NVLS/SHARP in-network reduction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from fractions import Fraction
from typing import Any

from calculators.architecture import tensors as architecture_tensors
from calculators.conventions import (
    FP32_BYTES,
    HALF_BYTES,
    PRECISION_BYTES,
    Engine,
    OffloadDevice,
    Precision,
    Stage,
)
from calculators.engines.deepspeed import Knobs as DeepSpeedKnobs
from calculators.engines.deepspeed import Param as DeepSpeedParam
from calculators.engines.deepspeed import param_list, parse_config, stage3_trace
from calculators.errors import InputError
from calculators.interconnects import (
    DEFAULT_HOST_LINK,
    DEFAULT_INTER_NODE,
    DEFAULT_INTRA_NODE,
    NCCL_BASE_LATENCY,
    PRESETS,
    Interconnect,
)
from calculators.model_states import Offload, TrainingSetup, ceil_div

# ---------------------------------------------------------------------------------------------
# Collectives and their ring factors
# ---------------------------------------------------------------------------------------------


class Op(StrEnum):
    """A collective operation (NCCL names, as torch.distributed calls them)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_TO_ALL = "all_to_all"


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


class Algorithm(StrEnum):
    """How a collective that spans nodes is laid out."""

    RING = "ring"
    """One flat ring over all ranks (NCCL's Ring algorithm)."""
    HIERARCHICAL = "hierarchical"
    """Reduce-scatter in the node, the operation across nodes on 1/g of the data, all-gather in
    the node (2D / hierarchical all-reduce)."""


def sent_factor(op: Op, n: int) -> Fraction:
    """Bytes one rank sends per payload byte (mean over ranks).

    nccl-tests doc/PERFORMANCE.md: all-reduce 2(n−1)/n; all-gather, reduce-scatter
    (n−1)/n (payload = the full, unsharded size); all-to-all (n−1)/n. Broadcast and reduce: a
    ring pipeline in which every rank but one forwards the payload, (n−1)/n on average.
    """
    if n < 1:
        raise ValueError("group size must be at least 1")
    if op is Op.ALL_REDUCE:
        return Fraction(2 * (n - 1), n)
    return Fraction(n - 1, n)


def bus_factor(op: Op, n: int) -> Fraction:
    """nccl-tests busbw / algbw (doc/PERFORMANCE.md): 2(n−1)/n all-reduce, (n−1)/n all-gather,
    reduce-scatter and all-to-all, 1 broadcast and reduce."""
    if op in (Op.BROADCAST, Op.REDUCE):
        return Fraction(1) if n > 1 else Fraction(0)
    return sent_factor(op, n)


def ring_steps(op: Op, n: int) -> int:
    """Ring steps per call (NCCL tuning.cc: 2(n−1) all-reduce, n−1 otherwise)."""
    return 2 * (n - 1) if op is Op.ALL_REDUCE else n - 1


# ---------------------------------------------------------------------------------------------
# Topology
# ---------------------------------------------------------------------------------------------


class Link(StrEnum):
    """The link class a collective's ring crosses."""

    NONE = "none"
    """Group of one: nothing is sent."""
    INTRA_NODE = "intra_node"
    INTER_NODE = "inter_node"
    """The ring leaves the node: bounded by the slower of NVLink and the NICs."""


@dataclass(frozen=True)
class Group:
    """A process group as the topology places it.

    Attributes:
        size: ranks in the group.
        nodes: nodes the group spans.
        per_node: group ranks on one node.
    """

    size: int
    nodes: int
    per_node: int

    @property
    def link(self) -> Link:
        if self.size <= 1:
            return Link.NONE
        return Link.INTRA_NODE if self.nodes == 1 else Link.INTER_NODE


@dataclass(frozen=True)
class Topology:
    """``nodes`` × ``gpus_per_node`` devices holding ``dp`` × ``tp`` × ``pp`` ranks.

    Ranks are laid out Megatron-style, tensor parallel innermost, then data parallel, then
    pipeline: global rank = (pp_rank · dp + dp_rank) · tp + tp_rank, node = rank // gpus_per_node.

    Attributes:
        nodes: hosts.
        gpus_per_node: devices per host.
        dp, tp, pp: parallel degrees.
        nics_per_node: network adapters per host (one per GPU on DGX/HGX H100).
        assumed: the request gave neither nodes nor gpus_per_node.
    """

    nodes: int
    gpus_per_node: int
    dp: int
    tp: int = 1
    pp: int = 1
    nics_per_node: int = 0
    assumed: bool = False

    def __post_init__(self) -> None:
        if self.nodes * self.gpus_per_node != self.world:
            raise InputError(
                "gpus_per_node",
                f"nodes × gpus_per_node = {self.nodes} × {self.gpus_per_node} = "
                f"{self.nodes * self.gpus_per_node} must equal dp × tp × pp = {self.world}",
            )
        if self.nics_per_node < 0:
            raise InputError("nics_per_node", "must not be negative")

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def nics(self) -> int:
        return self.nics_per_node or self.gpus_per_node

    def dp_group(self, size: int | None = None, stride: int = 1) -> Group:
        """The group of ``size`` data-parallel ranks ``stride`` apart, starting at DP rank 0.

        ``size=None, stride=1`` is the whole DP group; a shard group of S is ``(S, 1)``, its
        replica group ``(dp // S, S)``.
        """
        size = self.dp if size is None else size
        step = stride * self.tp  # global-rank distance between neighbours in the group
        gpn = self.gpus_per_node
        if size <= 1 or step >= gpn and step % gpn == 0:
            return Group(size=size, nodes=size, per_node=1)
        if step < gpn and gpn % step == 0:
            per_node = min(size, gpn // step)
            # A group inside one node must tile it, or some copy of it straddles two nodes.
            aligned = per_node < size or gpn % (size * step) == 0
            if aligned and size % per_node == 0:
                return Group(size=size, nodes=size // per_node, per_node=per_node)
        raise InputError(
            "gpus_per_node",
            f"a group of {size} data-parallel ranks {step} global ranks apart does not split "
            f"evenly over nodes of {gpn} devices (tp = {self.tp})",
        )


def make_topology(
    dp: int,
    tp: int,
    pp: int,
    nodes: int | None,
    gpus_per_node: int | None,
    nics_per_node: int | None = None,
) -> Topology:
    """Fill in whichever of ``nodes`` / ``gpus_per_node`` is missing.

    Neither given: 8 devices per node (DGX/HGX) when the world divides by 8, else one node.
    """
    world = dp * tp * pp
    assumed = nodes is None and gpus_per_node is None
    if nodes is None and gpus_per_node is None:
        gpus_per_node = 8 if world % 8 == 0 else world
        nodes = world // gpus_per_node
    elif nodes is None:
        assert gpus_per_node is not None
        if world % gpus_per_node:
            raise InputError(
                "gpus_per_node", f"{gpus_per_node} does not divide dp × tp × pp = {world}"
            )
        nodes = world // gpus_per_node
    elif gpus_per_node is None:
        if world % nodes:
            raise InputError("nodes", f"{nodes} does not divide dp × tp × pp = {world}")
        gpus_per_node = world // nodes
    return Topology(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        dp=dp,
        tp=tp,
        pp=pp,
        nics_per_node=nics_per_node or 0,
        assumed=assumed,
    )


@dataclass(frozen=True)
class Network:
    """The link classes the time model uses.

    Attributes:
        intra: the link between devices of one node (bandwidth per device, one direction).
        inter: one network adapter (bandwidth per NIC, one direction).
        host: the device–host link for offload traffic.
        algorithm: ring or hierarchical for groups that span nodes.
    """

    intra: Interconnect = field(default_factory=lambda: PRESETS[DEFAULT_INTRA_NODE])
    inter: Interconnect = field(default_factory=lambda: PRESETS[DEFAULT_INTER_NODE])
    host: Interconnect = field(default_factory=lambda: PRESETS[DEFAULT_HOST_LINK])
    algorithm: Algorithm = Algorithm.RING


# ---------------------------------------------------------------------------------------------
# What engines emit
# ---------------------------------------------------------------------------------------------


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
        return ceil_div(self.exact_sent)


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
    """

    training: TrainingSetup
    topology: Topology
    network: Network = field(default_factory=Network)
    grad_accumulation_steps: int = 1
    grad_sync: GradSync = GradSync.PER_STEP
    shard_group_size: int | None = None
    zeropp: ZeroPlusPlus = field(default_factory=ZeroPlusPlus)

    def __post_init__(self) -> None:
        if self.grad_accumulation_steps < 1:
            raise InputError("grad_accumulation_steps", "must be at least 1")
        s = self.shard_group_size
        if s is not None and (s < 1 or self.training.dp % s):
            raise InputError("shard_group_size", f"must divide dp = {self.training.dp}")
        if self.zeropp.hpz < 1 or self.training.dp % self.zeropp.hpz:
            raise InputError("zeropp.hpz", f"must divide dp = {self.training.dp}")


# ---------------------------------------------------------------------------------------------
# Parameter tensors as an engine sees them
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One parameter tensor: its module (the name without ``.weight``/``.bias``) and shape."""

    module: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def params_of(setup: TrainingSetup) -> list[Param] | None:
    """The device's parameter tensors in ``named_parameters`` order, when exactly known.

    Known for an architecture without tensor or pipeline parallelism; otherwise ``None`` and
    engines fall back to Ψ as one contiguous run of elements.
    """
    if setup.architecture is None or setup.tp * setup.pp != 1:
        return None
    arch_tensors = architecture_tensors(setup.architecture)
    return [Param(t.name.rsplit(".", 1)[0], t.shape) for t in arch_tensors]


def padded(numel: int, n: int) -> int:
    """numel rounded up to a multiple of n (DeepSpeed stage 3 ``_aligned_size``)."""
    return ceil_div(numel, n) * n


def dtype_name(nbytes: int, precision: Precision) -> str:
    if nbytes == FP32_BYTES:
        return "fp32"
    if nbytes == HALF_BYTES:
        return "fp16" if precision is Precision.MIXED_FP16 else "bf16"
    return {1: "int8"}.get(nbytes, f"{nbytes}B")


# ---------------------------------------------------------------------------------------------
# Costs
# ---------------------------------------------------------------------------------------------


def _node_bandwidth(setup: CommunicationSetup, group: Group) -> Fraction:
    """Bytes/s one group can push out of a node: its share of the node's NICs.

    gpus_per_node / per_node groups of this kind run at once on a node (one per TP/PP rank) and
    share its ``nics_per_node`` adapters.
    """
    topo = setup.topology
    return Fraction(setup.network.inter.bandwidth * topo.nics * group.per_node, topo.gpus_per_node)


def cost(setup: CommunicationSetup, c: Collective) -> CollectiveCost:
    """Link split and α–β time of one collective entry."""
    g = c.group
    sent = c.sent_bytes_per_rank
    if g.size <= 1 or c.calls == 0:
        return CollectiveCost(c, 0, 0, 0.0)
    net = setup.network
    m, per = g.nodes, g.per_node
    per_call = Fraction(c.payload_bytes, c.calls)
    if m == 1:
        steps = ring_steps(c.op, g.size)
        latency = NCCL_BASE_LATENCY + steps * net.intra.latency
        transfer = per_call * bus_factor(c.op, g.size) / net.intra.bandwidth
        return CollectiveCost(c, sent, 0, float(c.calls * (latency + transfer)))
    node_bw = _node_bandwidth(setup, g)
    hierarchical = (
        net.algorithm is Algorithm.HIERARCHICAL
        and per > 1
        and c.op in (Op.ALL_REDUCE, Op.ALL_GATHER, Op.REDUCE_SCATTER)
    )
    if hierarchical:
        # In-node phases on the whole payload, the cross-node phase on 1/per of it.
        intra_op_factor = (
            sent_factor(Op.ALL_REDUCE, per) if c.op is Op.ALL_REDUCE else sent_factor(c.op, per)
        )
        inter_factor = sent_factor(c.op, m) / per
        intra = ceil_div(c.payload_bytes * intra_op_factor)
        inter = sent - intra
        latency = (
            2 * NCCL_BASE_LATENCY
            + ring_steps(c.op, per) * net.intra.latency
            + ring_steps(c.op, m) * net.inter.latency
        )
        transfer = (
            per_call * intra_op_factor / net.intra.bandwidth
            + per_call * inter_factor * per / node_bw
        )
        return CollectiveCost(c, intra, inter, float(c.calls * (latency + transfer)))
    # Flat ring: each node is entered and left once per ring, so a rank's mean share of the
    # node's egress is 1/per of what it sends; the ring runs at the slower link class.
    inter = ceil_div(sent, per)
    steps = ring_steps(c.op, g.size)
    inter_steps = min(steps, (2 if c.op is Op.ALL_REDUCE else 1) * (m - 1))
    latency = (
        NCCL_BASE_LATENCY
        + (steps - inter_steps) * net.intra.latency
        + inter_steps * net.inter.latency
    )
    bandwidth = min(Fraction(net.intra.bandwidth), node_bw) if per > 1 else node_bw
    transfer = per_call * bus_factor(c.op, g.size) / bandwidth
    return CollectiveCost(c, sent - inter, inter, float(c.calls * (latency + transfer)))


def transfer_time(setup: CommunicationSetup, t: Transfer) -> float:
    """Bytes over the host link at its peak one-direction rate (no latency term)."""
    return float(Fraction(t.bytes, setup.network.host.bandwidth))


# ---------------------------------------------------------------------------------------------
# Engine models
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineTraffic:
    collectives: tuple[Collective, ...]
    transfers: tuple[Transfer, ...] = ()
    notes: tuple[str, ...] = ()


CONVENTIONS: dict[Engine, str] = {
    Engine.PAPER: (
        "paper: ZeRO (arXiv 1910.02054) §7 — stage 0 all-reduce of gradients (2Ψ); stages 1 "
        "and 2 reduce-scatter of gradients + all-gather of updated parameters (2Ψ); stage 3 "
        "all-gather in forward + all-gather in backward + reduce-scatter (3Ψ), elements in the "
        "parameter dtype, ring factors (N−1)/N. ZeRO++ (arXiv 2306.10209) options and "
        "HSDP/MiCS shard groups follow their papers."
    ),
    Engine.DEEPSPEED: (
        "deepspeed: DeepSpeed 0.19.8 defaults read from its source — stage 0 bucketed "
        "all-reduce at the accumulation boundary (engine.py allreduce_gradients); stages 1/2 "
        "all-reduce of IPG gradient buckets (reduce_scatter=True with "
        "use_multi_rank_bucket_allreduce=True issues all_reduce, stage_1_and_2.py "
        "average_tensor) then one all_gather_into_tensor of the padded 16-bit flat buffer; stage "
        "3 the all-gathers of a simulated partitioned_param_coordinator in steady state (module "
        "fetches and prefetches; persistent parameters, numel <= "
        "stage3_param_persistence_threshold, stay gathered; backward re-gathers only what the "
        "coordinator released, nothing on models whose prefetch reaches backward), bucketed "
        "reduce-scatter of padded gradients, all-gather of persistent parameters after the "
        "step. Knobs from engine_config (calculators.engines.deepspeed.parse_config)."
    ),
    Engine.TORCH: (
        "torch: PyTorch engines — stage 0 DDP bucketed all-reduce (1 MiB first bucket, 25 MiB "
        "after); stage 1 DDP all-reduce + ZeroRedundancyOptimizer broadcast of every parameter "
        "from its owner after step(); stage 2 FSDP2 reshard_after_forward=False (all-gather "
        "forward, reduce-scatter); stage 3 FSDP2 reshard_after_forward=True (all-gather forward "
        "and backward, reduce-scatter), dim 0 padded to a multiple of N; mixed precision = "
        "fp32 parameters with autocast for DDP, MixedPrecisionPolicy(param_dtype=16-bit, "
        "reduce_dtype=fp32) for FSDP2."
    ),
}

IGNORED = (
    "The time ignores overlap of communication with compute (engines overlap most of it), "
    "congestion from other jobs or parallel dimensions, kernel/protocol efficiency below the "
    "links' peak rates, NVLS/SHARP in-network reduction, and scalar all-reduces (overflow flag, "
    "gradient norm)."
)


def _micro(setup: CommunicationSetup) -> int:
    return setup.grad_accumulation_steps


def _reductions(setup: CommunicationSetup) -> int:
    """Gradient reductions per step where the user picks (DDP no_sync and the like)."""
    return _micro(setup) if setup.grad_sync is GradSync.PER_MICRO_STEP else 1


def _groups(setup: CommunicationSetup) -> tuple[Group, Group, Group]:
    """(whole DP group, shard group, replica group) under ``shard_group_size``."""
    topo = setup.topology
    dp_group = topo.dp_group()
    s = setup.shard_group_size
    if s is None or s == setup.training.dp:
        return dp_group, dp_group, topo.dp_group(1)
    return dp_group, topo.dp_group(s), topo.dp_group(setup.training.dp // s, s)


# ----- paper ---------------------------------------------------------------------------------


def _paper(setup: CommunicationSetup, stage: Stage) -> EngineTraffic:
    """ZeRO §7 (and ZeRO++ §3 for its options, MiCS §3 for shard groups)."""
    t = setup.training
    psi = t.params_per_device
    b = PRECISION_BYTES[t.precision].parameter
    dt = dtype_name(b, t.precision)
    dp_group, shard, replica = _groups(setup)
    k, r = _micro(setup), _reductions(setup)
    out: list[Collective] = []
    notes: list[str] = []
    zpp = setup.zeropp
    if zpp.any and stage < Stage.PARAMETERS:
        notes.append("ZeRO++ options apply to stage 3 only; ignored here")
    if stage is Stage.NONE:
        out.append(
            Collective(Op.ALL_REDUCE, Phase.BACKWARD, r, r * b * psi, dt, dp_group, "gradients")
        )
        return EngineTraffic(tuple(out), notes=tuple(notes))
    if stage < Stage.PARAMETERS:
        out.append(
            Collective(Op.REDUCE_SCATTER, Phase.BACKWARD, r, r * b * psi, dt, shard, "gradients")
        )
        if replica.size > 1:
            out.append(
                Collective(
                    Op.ALL_REDUCE,
                    Phase.BACKWARD,
                    r,
                    r * ceil_div(b * psi, shard.size),
                    dt,
                    replica,
                    "gradient shard across replicas",
                )
            )
        out.append(
            Collective(Op.ALL_GATHER, Phase.STEP, 1, b * psi, dt, shard, "updated parameters")
        )
        if stage is Stage.GRADIENTS and r == 1 and k > 1:
            notes.append(
                "per_step gradient sync under stage 2 holds full gradients between "
                "micro-steps, which the paper's P_g memory does not count"
            )
        return EngineTraffic(tuple(out), notes=tuple(notes))
    # Stage 3: gathers on every micro-step; partitioned gradients are reduced every micro-step.
    fwd_b, fwd_dt = b, dt
    if zpp.qwz:  # ZeRO++ §3.1: int8 weights, forward all-gather 0.5M instead of M
        fwd_b, fwd_dt = 1, "int8"
    out.append(
        Collective(Op.ALL_GATHER, Phase.FORWARD, k, k * fwd_b * psi, fwd_dt, shard, "parameters")
    )
    bwd_group = shard if zpp.hpz == 1 else setup.topology.dp_group(zpp.hpz)
    out.append(
        Collective(
            Op.ALL_GATHER,
            Phase.BACKWARD,
            k,
            k * fwd_b * psi,
            fwd_dt,
            bwd_group,
            "parameters" + (" (hpZ secondary partition)" if zpp.hpz > 1 else ""),
        )
    )
    if zpp.qgz:
        # ZeRO++ §3.3: int4 gradients, hierarchical all-to-all: in the node on all of them,
        # across nodes on 1/g of them.
        topo = setup.topology
        in_node = topo.dp_group(min(shard.per_node, shard.size))
        across = topo.dp_group(shard.nodes, in_node.size)
        out.append(
            Collective(
                Op.ALL_TO_ALL,
                Phase.BACKWARD,
                k,
                k * psi // 2,
                "int4",
                in_node,
                "gradients (qgZ, in node)",
            )
        )
        if across.size > 1:
            out.append(
                Collective(
                    Op.ALL_TO_ALL,
                    Phase.BACKWARD,
                    k,
                    k * ceil_div(psi, 2 * in_node.size),
                    "int4",
                    across,
                    "gradients (qgZ, across nodes)",
                )
            )
    else:
        out.append(
            Collective(Op.REDUCE_SCATTER, Phase.BACKWARD, k, k * b * psi, dt, shard, "gradients")
        )
    if replica.size > 1:
        out.append(
            Collective(
                Op.ALL_REDUCE,
                Phase.BACKWARD,
                r,
                r * ceil_div(b * psi, shard.size),
                dt,
                replica,
                "gradient shard across replicas",
            )
        )
    return EngineTraffic(tuple(out), notes=tuple(notes))


def _paper_offload(setup: CommunicationSetup, stage: Stage) -> tuple[Transfer, ...]:
    """ZeRO-Offload (arXiv 2101.06840 §4.1): 16-bit gradients down, 16-bit parameters up, each
    rank its 1/N partition; ZeRO-Infinity parameters up for every gather."""
    t = setup.training
    psi = t.params_per_device
    b = PRECISION_BYTES[t.precision].parameter
    part = ceil_div(b * psi, t.dp)
    out: list[Transfer] = []
    if t.offload.optimizer is not OffloadDevice.NONE:
        out.append(Transfer("d2h", Phase.BACKWARD, _reductions(setup) * part, "gradient partition"))
        out.append(Transfer("h2d", Phase.STEP, part, "updated parameter partition"))
    if t.offload.params is not OffloadDevice.NONE and stage is Stage.PARAMETERS:
        out.append(Transfer("h2d", Phase.FORWARD, _micro(setup) * part, "parameter partition"))
        out.append(Transfer("h2d", Phase.BACKWARD, _micro(setup) * part, "parameter partition"))
    return tuple(out)


# ----- deepspeed -----------------------------------------------------------------------------


# One model of DeepSpeed: the knob parsing, parameter list and stage-3 coordinator simulation
# of the memory profile (calculators/engines/deepspeed.py) serve this convention too.


def deepspeed_knobs(config: Mapping[str, Any] | None, zeropp: ZeroPlusPlus) -> DeepSpeedKnobs:
    """The DeepSpeed config body's knobs (engines.deepspeed.parse_config), with the request's
    ZeRO++ options switched on where the config leaves them off."""
    knobs = parse_config(config)
    return replace(
        knobs,
        qwz=knobs.qwz or zeropp.qwz,
        qgz=knobs.qgz or zeropp.qgz,
        hpz=zeropp.hpz if zeropp.hpz > 1 else knobs.hpz,
    )


def deepspeed_params(setup: TrainingSetup) -> tuple[list[DeepSpeedParam], bool]:
    """The device's parameters in ``named_parameters`` order and whether they are exact
    (engines.deepspeed.param_list); with tp or pp > 1, Ψ per device as one tensor."""
    if setup.architecture is not None and setup.tp * setup.pp == 1:
        return param_list(setup)
    return [DeepSpeedParam("model", setup.params_per_device, None)], False


def _elements(params: Sequence[Param] | None, psi: int) -> list[int]:
    """Element counts in registration order; Ψ as one run when the tensors are unknown."""
    return [p.numel for p in params] if params is not None else [psi]


def ipg_buckets(numels: Sequence[int], bucket: int, *, whole_run: bool) -> list[int]:
    """Elements of each reduction bucket, DeepSpeed's IPG rule.

    stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads and stage3.py
    __add_grad_to_ipg_bucket: the bucket is reduced before a gradient that would overflow it
    (``elements + numel > reduce_bucket_size``); a gradient larger than the bucket goes alone.
    ``whole_run``: the single entry is Ψ of unknown tensors, cut into full buckets.
    """
    if whole_run:
        (psi,) = numels
        full, rest = divmod(psi, bucket)
        return [bucket] * full + ([rest] if rest else [])
    out: list[int] = []
    current = 0
    for n in numels:
        if n == 0:
            continue
        if current and current + n > bucket:
            out.append(current)
            current = 0
        current += n
        if current > bucket:  # an oversized gradient, reduced on its own
            out.append(current)
            current = 0
    if current:
        out.append(current)
    return out


def fallback_buckets(numels: Sequence[int], bucket: int, *, whole_run: bool) -> list[int]:
    """Engine stage-0 buckets (engine.py allreduce_no_retain): closed once they exceed the size."""
    if whole_run:
        return ipg_buckets(numels, bucket + 1, whole_run=True)
    out: list[int] = []
    current = 0
    for n in numels:
        current += n
        if current > bucket:
            out.append(current)
            current = 0
    if current:
        out.append(current)
    return out


def _ds_stage12(setup: CommunicationSetup, stage: Stage, knobs: DeepSpeedKnobs) -> EngineTraffic:
    t = setup.training
    n = t.dp
    psi = t.params_per_device
    params, exact = deepspeed_params(t)
    pb = PRECISION_BYTES[t.precision].parameter
    cb = knobs.communication_bytes or pb  # engine.py communication_data_type: model dtype
    dp_group = setup.topology.dp_group()
    k = _micro(setup)
    # engine.py allreduce_gradients: stage 2 reduces on every micro-step, stage 1 only at the
    # accumulation boundary (optimizer.reduce_gradients).
    reductions = k if stage is Stage.GRADIENTS else 1
    numels = [p.numel for p in params]
    order = numels if stage is Stage.OPTIMIZER else list(reversed(numels))
    buckets = ipg_buckets(order, knobs.reduce_bucket_size, whole_run=not exact)
    out: list[Collective] = []
    grad_bytes = cb * psi
    if knobs.reduce_scatter and not knobs.use_multi_rank_bucket_allreduce:
        # average_tensor: one dist.reduce per destination partition touched by each bucket.
        psi12 = padded(psi, 2 * n)
        calls = sum(
            _partitions_touched(start, size, psi12 // n)
            for start, size in _bucket_spans(order, buckets)
        )
        out.append(
            Collective(
                Op.REDUCE,
                Phase.BACKWARD,
                reductions * calls,
                reductions * grad_bytes,
                dtype_name(cb, t.precision),
                dp_group,
                "gradient buckets, one reduce per owning rank",
            )
        )
    else:
        # reduce_scatter=True + use_multi_rank_bucket_allreduce=True: allreduce_bucket (all_reduce)
        # of the flattened bucket; reduce_scatter=False: gradient_reduction_w_predivide, in place.
        out.append(
            Collective(
                Op.ALL_REDUCE,
                Phase.BACKWARD,
                reductions * len(buckets),
                reductions * grad_bytes,
                dtype_name(cb, t.precision),
                dp_group,
                "gradient buckets",
            )
        )
    # step(): utils.py all_gather_dp_groups -> all_gather_into_tensor of the flat 16-bit buffer,
    # padded to a multiple of 2N (nccl_start_alignment_factor = 2); skipped when N = 1.
    if n > 1:
        out.append(
            Collective(
                Op.ALL_GATHER,
                Phase.STEP,
                1,
                pb * padded(psi, 2 * n),
                dtype_name(pb, t.precision),
                dp_group,
                "updated parameter partitions (flat buffer)",
            )
        )
    notes = [
        "allgather_bucket_size is not used: DeepSpeed calls all_gather_into_tensor once per "
        "parameter group whenever torch has it (runtime/utils.py all_gather_dp_groups)",
    ]
    if stage is Stage.GRADIENTS and k > 1:
        notes.append(
            "stage 2 reduces gradients on every micro-step (engine.py: 'ZeRO stage >= 2 "
            "communicates during non gradient accumulation boundaries as well')"
        )
    return EngineTraffic(tuple(out), notes=tuple(notes))


def _bucket_spans(order: Sequence[int], buckets: Sequence[int]) -> list[tuple[int, int]]:
    """(start, size) in flat-buffer element offsets, approximating each bucket as contiguous."""
    total = sum(order)
    spans = []
    pos = 0
    for size in buckets:
        spans.append((pos, size))
        pos += size
    return [(min(s, total), z) for s, z in spans]


def _partitions_touched(start: int, size: int, part: int) -> int:
    return (start + size - 1) // part - start // part + 1 if size else 0


@dataclass(frozen=True)
class Stage3Plan:
    """Stage-3 element counts per micro-step, each parameter padded to a multiple of N.

    From the simulated coordinator (engines.deepspeed.stage3_trace, steady state).
    """

    forward_padded: int
    backward_padded: int
    persistent_padded: int
    reduce_padded: int
    reduce_plain: int
    forward_calls: int
    backward_calls: int
    reduce_buckets: int
    persistent: int
    kept: int
    params: int


def stage3_plan(
    params: Sequence[DeepSpeedParam], n: int, knobs: DeepSpeedKnobs, *, exact: bool = True
) -> Stage3Plan:
    """What DeepSpeed stage 3 all-gathers and reduces per micro-step on N ranks.

    - Gathers: the coordinator simulation's per-parameter counts (stage3_trace: module fetches,
      prefetches that record every use they pop, the reuse-distance and max-live rules). Each
      gathered parameter moves ``ceil(numel / N) · N`` elements: all_gather_coalesced builds a
      flat buffer of the partitions, ``partition_sz * world_size`` (partition_parameters.py
      _all_gather_dtype :1336-1362), and ``_all_gather_sequential`` one of
      ``ceil(ds_numel / world_size) · world_size`` (:1376). One rank gathers nothing
      (``_no_gather_coalesced``, :1558-1559).
    - Persistent parameters (parameter_offload.py mark_persistent_parameters) stay gathered
      and are all-gathered after each step, one call each (stage3.py:2840-2841 ->
      partition_parameters.py _allgather_params_coalesced :2066-2076).
    - Gradients: IPG buckets in reverse registration order (stage3.py
      __add_grad_to_ipg_bucket), padded per parameter by reduce_scatter_coalesced.
    """
    trace = stage3_trace(params, knobs)
    numels = [p.numel for p in params]
    gathers = n > 1

    def moved(counts: Sequence[int]) -> int:
        return sum(c * padded(x, n) for c, x in zip(counts, numels, strict=True)) if gathers else 0

    whole = ipg_buckets(list(reversed(numels)), knobs.reduce_bucket_size, whole_run=not exact)
    return Stage3Plan(
        forward_padded=moved(trace.forward_gathers),
        backward_padded=moved(trace.backward_gathers),
        persistent_padded=sum(
            padded(x, n) for x, f in zip(numels, trace.persistent, strict=True) if f
        )
        if gathers
        else 0,
        reduce_padded=sum(padded(x, n) for x in numels),
        reduce_plain=sum(numels),
        forward_calls=trace.forward_calls if gathers else 0,
        backward_calls=trace.backward_calls if gathers else 0,
        reduce_buckets=len(whole),
        persistent=sum(trace.persistent),
        kept=sum(trace.kept),
        params=len(params),
    )


# CUDAQuantizer.target_group_size (zero/partition_parameters.py): one fp32 scale per group of at
# most ~8000 int8 weights; we count ceil(numel / 8000) scales (a lower bound: the search may
# pick groups down to half that size).
QWZ_GROUP = 8000


def _ds_stage3(setup: CommunicationSetup, knobs: DeepSpeedKnobs) -> EngineTraffic:
    t = setup.training
    n = t.dp
    params, exact = deepspeed_params(t)
    pb = PRECISION_BYTES[t.precision].parameter
    cb = knobs.communication_bytes or pb
    topo = setup.topology
    dp_group = topo.dp_group()
    k = _micro(setup)
    plan = stage3_plan(params, n, knobs, exact=exact)
    out: list[Collective] = []
    notes: list[str] = [
        f"steady state (trace complete), simulated partitioned_param_coordinator: {plan.kept} of "
        f"{plan.params} parameters ({plan.persistent} persistent) are still gathered when "
        "forward ends (a prefetch recorded their backward use); the first step records the "
        "trace, releases everything and re-gathers all of it in backward",
        "calls: one all-gather per module fetch and one per prefetch that finds parameters to "
        "gather (all_gather_coalesced), as the simulation issues them",
    ]
    if not exact:
        notes.append(
            "approximate: without an architecture (or with tp/pp > 1) the coordinator "
            "sees Ψ per device as one tensor, which is never re-gathered in backward; "
            "a real model larger than stage3_max_live_parameters re-gathers what the "
            "prefetcher cannot reach, so give model.architecture"
        )
    if knobs.hpz > 1 and n % knobs.hpz:  # zero_hpz_partition_size 0 and 1 both mean off
        raise InputError(
            "engine_config.zero_optimization.zero_hpz_partition_size", f"must divide dp = {n}"
        )
    gather_b, gather_dt = pb, dtype_name(pb, t.precision)
    if knobs.qwz:
        gather_b, gather_dt = 1, "int8"  # partition_parameters.py CUDAQuantizer, 8 bits

    def gathers(phase: Phase, elements: int, calls: int, group: Group, what: str) -> None:
        if not elements:
            return
        out.append(
            Collective(
                Op.ALL_GATHER, phase, k * calls, k * gather_b * elements, gather_dt, group, what
            )
        )
        if knobs.qwz:
            scales = FP32_BYTES * ceil_div(elements, QWZ_GROUP)
            out.append(
                Collective(
                    Op.ALL_GATHER,
                    phase,
                    k * calls,
                    k * scales,
                    "fp32",
                    group,
                    "qwZ quantization scales",
                )
            )

    gathers(
        Phase.FORWARD,
        plan.forward_padded,
        plan.forward_calls,
        dp_group,
        "parameters (non-persistent)",
    )
    bwd_group = dp_group if knobs.hpz <= 1 else topo.dp_group(knobs.hpz)
    gathers(
        Phase.BACKWARD,
        plan.backward_padded,
        plan.backward_calls,
        bwd_group,
        "parameters the coordinator released in forward"
        + (" (hpZ secondary partition)" if knobs.hpz > 1 else ""),
    )
    if knobs.qgz and topo.dp_group().nodes > 1:
        # coalesced_collectives.py all_to_all_quant_reduce: int4 all-to-all within the node,
        # quantized reduction, int4 all-to-all across nodes on 1/local_world_size of it.
        local = topo.dp_group(min(dp_group.per_node, n))
        across = topo.dp_group(dp_group.nodes, local.size)
        out.append(
            Collective(
                Op.ALL_TO_ALL,
                Phase.BACKWARD,
                k * plan.reduce_buckets,
                k * ceil_div(plan.reduce_plain, 2),
                "int4",
                local,
                "gradients (qgZ, in node)",
            )
        )
        out.append(
            Collective(
                Op.ALL_TO_ALL,
                Phase.BACKWARD,
                k * plan.reduce_buckets,
                k * ceil_div(plan.reduce_plain, 2 * local.size),
                "int4",
                across,
                "gradients (qgZ, across nodes)",
            )
        )
        notes.append(
            "qgZ: 1-D tensors and tensors whose numel does not divide by 2 × world "
            "fall back to reduce-scatter; scales are not counted"
        )
    elif knobs.reduce_scatter:
        # stage3.py __avg_scatter_grads -> reduce_scatter_coalesced: padded, interleaved flat
        # buffer, one reduce_scatter_tensor per IPG bucket.
        out.append(
            Collective(
                Op.REDUCE_SCATTER,
                Phase.BACKWARD,
                k * plan.reduce_buckets,
                k * cb * plan.reduce_padded,
                dtype_name(cb, t.precision),
                dp_group,
                "gradient buckets (padded per parameter)",
            )
        )
    else:
        # __avg_scatter_contiguous_grads: all-reduce of the contiguous bucket.
        out.append(
            Collective(
                Op.ALL_REDUCE,
                Phase.BACKWARD,
                k * plan.reduce_buckets,
                k * cb * plan.reduce_plain,
                dtype_name(cb, t.precision),
                dp_group,
                "gradient buckets",
            )
        )
    if plan.persistent_padded:
        # one all_gather_into_tensor per persistent parameter (_allgather_params_coalesced)
        out.append(
            Collective(
                Op.ALL_GATHER,
                Phase.STEP,
                plan.persistent,
                pb * plan.persistent_padded,
                dtype_name(pb, t.precision),
                dp_group,
                f"{plan.persistent} persistent parameters (stage3.py _post_step)",
            )
        )
    return EngineTraffic(tuple(out), notes=tuple(notes))


def _ds_offload(
    setup: CommunicationSetup, stage: Stage, plan_fwd_bwd: tuple[int, int] | None
) -> tuple[Transfer, ...]:
    """PCIe traffic of DeepSpeed offload per step (docs/engines/deepspeed.md §4.6, §5.7, §5.8).

    Stage 1/2 with optimizer offload: each rank's fp32 gradient partition down
    (async_inplace_copy_grad_to_fp32_buffer_from_gpu), its 16-bit updated partition up.
    Stage 3 with optimizer offload: the 16-bit gradient partition down and back up in
    partition_grads, the fp32 gradient down at the boundary, the 16-bit partition up after the
    CPU step. Parameter offload: every gather first copies the partition up.
    """
    t = setup.training
    n = t.dp
    psi = t.params_per_device
    pb = PRECISION_BYTES[t.precision].parameter
    k = _micro(setup)
    out: list[Transfer] = []
    if t.offload.optimizer is not OffloadDevice.NONE:
        if stage < Stage.PARAMETERS:
            part = padded(psi, 2 * n) // n
            if k > 1:
                # copy_grads_in_partition -> async_accumulate_grad_in_cpu_via_gpu whenever
                # micro_step_id > 0 or not at the boundary: the CPU copy comes up to be added to
                # (micro_step_id > 0) and goes back down. Stage 2 reduces every micro-step,
                # stage 1 once, at micro-step k - 1. Whole in-partition parameters move; we
                # count the partition.
                downs, ups = (k, k - 1) if stage is Stage.GRADIENTS else (1, 1)
                out.append(
                    Transfer(
                        "d2h",
                        Phase.BACKWARD,
                        downs * pb * part,
                        "16-bit gradient accumulation copy (accumulated_grads_in_cpu)",
                    )
                )
                out.append(
                    Transfer(
                        "h2d",
                        Phase.BACKWARD,
                        ups * pb * part,
                        "16-bit gradient accumulation copy back",
                    )
                )
            out.append(
                Transfer("d2h", Phase.BACKWARD, FP32_BYTES * part, "fp32 gradient partition")
            )
            out.append(Transfer("h2d", Phase.STEP, pb * part, "updated 16-bit partition"))
        else:
            part = ceil_div(psi, n)
            out.append(Transfer("d2h", Phase.BACKWARD, k * pb * part, "16-bit gradient partition"))
            out.append(
                Transfer(
                    "h2d",
                    Phase.BACKWARD,
                    k * pb * part,
                    "16-bit gradient partition back (partition_grads)",
                )
            )
            out.append(Transfer("d2h", Phase.STEP, FP32_BYTES * part, "fp32 gradient partition"))
            out.append(Transfer("h2d", Phase.STEP, pb * part, "updated 16-bit partition"))
    if t.offload.params is not OffloadDevice.NONE and stage is Stage.PARAMETERS and plan_fwd_bwd:
        fwd, bwd = plan_fwd_bwd
        out.append(Transfer("h2d", Phase.FORWARD, k * pb * fwd // n, "parameter partitions"))
        if bwd:
            out.append(Transfer("h2d", Phase.BACKWARD, k * pb * bwd // n, "parameter partitions"))
    return tuple(out)


def _deepspeed(setup: CommunicationSetup, stage: Stage) -> EngineTraffic:
    t = setup.training
    if setup.shard_group_size is not None and setup.shard_group_size != t.dp:
        raise InputError(
            "shard_group_size",
            "DeepSpeed 0.19.8 removed MiCS sharding (runtime/config.py); use engine "
            "paper or torch (HSDP) for shard groups",
        )
    knobs = deepspeed_knobs(t.engine_config, setup.zeropp)
    zpp_note = (
        ("ZeRO++ (qwZ/hpZ/qgZ) acts on stage 3 only; ignored here",)
        if (knobs.qwz or knobs.qgz or knobs.hpz > 1) and stage < Stage.PARAMETERS
        else ()
    )
    if stage is Stage.NONE:
        pb = PRECISION_BYTES[t.precision].parameter
        cb = knobs.communication_bytes or pb
        params, exact = deepspeed_params(t)
        numels = [p.numel for p in params]
        # engine.py allreduce_gradients -> buffered_allreduce_fallback(MEMORY_OPT_ALLREDUCE_SIZE
        # = 5e8 elements), at the accumulation boundary only.
        buckets = fallback_buckets(numels, 500_000_000, whole_run=not exact)
        c = Collective(
            Op.ALL_REDUCE,
            Phase.BACKWARD,
            len(buckets),
            cb * t.params_per_device,
            dtype_name(cb, t.precision),
            setup.topology.dp_group(),
            "gradient buckets",
        )
        return EngineTraffic((c,), notes=zpp_note)
    if stage < Stage.PARAMETERS:
        traffic = _ds_stage12(setup, stage, knobs)
        return EngineTraffic(
            traffic.collectives, _ds_offload(setup, stage, None), traffic.notes + zpp_note
        )
    traffic = _ds_stage3(setup, knobs)
    params, exact = deepspeed_params(t)
    plan = stage3_plan(params, t.dp, knobs, exact=exact)
    transfers = _ds_offload(setup, stage, (plan.forward_padded, plan.backward_padded))
    return EngineTraffic(traffic.collectives, transfers, traffic.notes)


# ----- torch ---------------------------------------------------------------------------------

# torch/csrc/distributed/c10d/reducer.hpp: kDefaultFirstBucketBytes = 1 MiB,
# kDefaultBucketBytesCap = 25 MiB (DDP bucket_cap_mb=25).
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
DDP_BUCKET_BYTES = 25 * 1024 * 1024


def ddp_buckets(numels: Sequence[int], elem: int, *, whole_run: bool) -> int:
    """Number of DDP buckets: parameters in reverse order, a bucket closes once its bytes reach
    the limit, 1 MiB for the first and 25 MiB after (reducer.cpp
    compute_bucket_assignment_by_size)."""
    if whole_run:
        (psi,) = numels
        total = psi * elem
        if total <= DDP_FIRST_BUCKET_BYTES:
            return 1
        return 1 + ceil_div(total - DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES)
    count = 0
    current = 0
    limit = DDP_FIRST_BUCKET_BYTES
    for n in reversed(numels):
        current += n * elem
        if current >= limit:
            count += 1
            current = 0
            limit = DDP_BUCKET_BYTES
    return count + (1 if current else 0)


def _fsdp_padded(params: Sequence[Param] | None, psi: int, n: int) -> int:
    """Elements FSDP2 moves: each parameter's dim 0 padded to a multiple of N
    (_fsdp_common.py _get_dim0_padded_size, _fsdp_param.py padded_sharded_param_size)."""
    if params is None:
        return padded(psi, n)
    total = 0
    for p in params:
        rest = math.prod(p.shape[1:])
        total += padded(p.shape[0], n) * rest
    return total


def _root_params(params: Sequence[Param]) -> list[Param]:
    """Parameters of the root FSDP group: everything outside the blocks."""
    return [p for p in params if not p.module.startswith("blocks.")]


def _fsdp_groups(params: Sequence[Param] | None) -> int:
    """FSDP groups: one per transformer block plus the root (embeddings, final norm, head)."""
    if params is None:
        return 1
    blocks = {p.module.split(".")[1] for p in params if p.module.startswith("blocks.")}
    return len(blocks) + 1


def _torch(setup: CommunicationSetup, stage: Stage) -> EngineTraffic:
    t = setup.training
    if setup.zeropp.any:
        raise InputError("zeropp", "ZeRO++ is a DeepSpeed feature; use engine deepspeed or paper")
    psi = t.params_per_device
    params = params_of(t)
    n = t.dp
    dp_group, shard, replica = _groups(setup)
    k, r = _micro(setup), _reductions(setup)
    # Mixed precision: DDP and ZeroRedundancyOptimizer keep fp32 parameters under autocast;
    # FSDP2 MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32).
    if t.precision.is_mixed:
        ddp_b, gather_b, reduce_b = FP32_BYTES, HALF_BYTES, FP32_BYTES
    else:
        ddp_b = gather_b = reduce_b = PRECISION_BYTES[t.precision].parameter
    numels = _elements(params, psi)
    out: list[Collective] = []
    notes: list[str] = []
    if stage < Stage.GRADIENTS:
        if setup.shard_group_size not in (None, n):
            raise InputError(
                "shard_group_size",
                "shard groups apply to FSDP2 (stages 2 and 3) under engine torch",
            )
        buckets = ddp_buckets(numels, ddp_b, whole_run=params is None)
        out.append(
            Collective(
                Op.ALL_REDUCE,
                Phase.BACKWARD,
                r * buckets,
                r * ddp_b * psi,
                dtype_name(ddp_b, t.precision),
                dp_group,
                "DDP gradient buckets",
            )
        )
        if stage is Stage.OPTIMIZER and n > 1:
            # zero_redundancy_optimizer.py _sync_params: for every rank, dist.broadcast of each
            # parameter it owns (parameters_as_bucket_view=False).
            calls = len(numels) if params is not None else n
            out.append(
                Collective(
                    Op.BROADCAST,
                    Phase.STEP,
                    calls,
                    ddp_b * psi,
                    dtype_name(ddp_b, t.precision),
                    dp_group,
                    "updated parameters from their owners",
                )
            )
            notes.append(
                "ZeroRedundancyOptimizer broadcasts each parameter from its owner: "
                "the owner sends all of it, the ring's last rank none; "
                "sent_bytes_per_rank is the mean, (N−1)/N of the payload"
            )
            if params is None:
                notes.append(
                    "broadcast calls: one per parameter tensor; without an architecture N is listed"
                )
        return EngineTraffic(tuple(out), notes=tuple(notes))
    elems = _fsdp_padded(params, psi, shard.size)
    groups = _fsdp_groups(params)
    out.append(
        Collective(
            Op.ALL_GATHER,
            Phase.FORWARD,
            k * groups,
            k * gather_b * elems,
            dtype_name(gather_b, t.precision),
            shard,
            "parameters",
        )
    )
    if stage is Stage.PARAMETERS:
        # An explicit reshard_after_forward=True reshards the root too (_fsdp_state.py keeps the
        # root unsharded only when the flag was defaulted); engine_config
        # {"fsdp_root_reshard_after_forward": false} models a root left unsharded.
        root_reshards = (t.engine_config or {}).get("fsdp_root_reshard_after_forward", True)
        if not isinstance(root_reshards, bool):
            raise InputError(
                "engine_config.fsdp_root_reshard_after_forward", "must be true or false"
            )
        again, again_groups = elems, groups
        if not root_reshards:
            again -= _fsdp_padded(_root_params(params), 0, shard.size) if params else elems
            again_groups -= 1
        if again:
            out.append(
                Collective(
                    Op.ALL_GATHER,
                    Phase.BACKWARD,
                    k * again_groups,
                    k * gather_b * again,
                    dtype_name(gather_b, t.precision),
                    shard,
                    "parameters (reshard_after_forward=True"
                    + (", root included)" if root_reshards else ", root kept)"),
                )
            )
    out.append(
        Collective(
            Op.REDUCE_SCATTER,
            Phase.BACKWARD,
            r * groups,
            r * reduce_b * elems,
            dtype_name(reduce_b, t.precision),
            shard,
            "gradients",
        )
    )
    if replica.size > 1:
        # _fsdp_collectives.py foreach_reduce: HSDP all-reduces the reduce-scatter output
        # across the replicate dimension.
        out.append(
            Collective(
                Op.ALL_REDUCE,
                Phase.BACKWARD,
                r * groups,
                r * reduce_b * elems // shard.size,
                dtype_name(reduce_b, t.precision),
                replica,
                "gradient shard across replicas (HSDP)",
            )
        )
    if params is None:
        notes.append(
            "FSDP2 calls: one per fully_shard group; without an architecture 1 is "
            "listed and padding is per Ψ, not per parameter"
        )
    else:
        notes.append(f"FSDP2 groups: {groups} (one per block + root)")
    notes.append(
        "forward all-gathers repeat on every micro-step (parameters are resharded "
        "after backward by default)"
    )
    transfers: list[Transfer] = []
    if t.offload.params is not OffloadDevice.NONE:
        # CPUOffloadPolicy: sharded fp32 parameters copied up for each all-gather, reduced
        # gradient shards copied down.
        shard_param_b = FP32_BYTES if t.precision.is_mixed else gather_b
        gathers = k * (2 if stage is Stage.PARAMETERS else 1)
        transfers.append(
            Transfer(
                "h2d",
                Phase.FORWARD,
                gathers * shard_param_b * elems // shard.size,
                "sharded parameters (CPUOffloadPolicy)",
            )
        )
        transfers.append(
            Transfer(
                "d2h", Phase.BACKWARD, r * reduce_b * elems // shard.size, "reduced gradient shards"
            )
        )
    return EngineTraffic(tuple(out), tuple(transfers), tuple(notes))


def _check_offload(setup: CommunicationSetup, stage: Stage) -> None:
    off = setup.training.offload
    if off.optimizer is not OffloadDevice.NONE and stage < Stage.OPTIMIZER:
        raise InputError("offload.optimizer", "optimizer offload needs ZeRO stage 1 or higher")
    if off.params is not OffloadDevice.NONE and stage < Stage.PARAMETERS:
        raise InputError("offload.params", "parameter offload needs ZeRO stage 3")
    if setup.training.engine is Engine.TORCH:
        if off.optimizer is not OffloadDevice.NONE and off.params is OffloadDevice.NONE:
            raise InputError(
                "offload.optimizer",
                "torch engines offload optimizer state only "
                "with parameters (FSDP2 CPUOffloadPolicy); set offload.params too",
            )
        if OffloadDevice.NVME in (off.optimizer, off.params):
            raise InputError("offload", "torch engines offload to CPU only")
        if off.params is not OffloadDevice.NONE and stage < Stage.GRADIENTS:
            raise InputError("offload.params", "torch offload needs FSDP2 (stages 2 and 3)")


ENGINES: dict[Engine, Callable[[CommunicationSetup, Stage], EngineTraffic]] = {
    Engine.PAPER: _paper,
    Engine.DEEPSPEED: _deepspeed,
    Engine.TORCH: _torch,
}


def engine_traffic(setup: CommunicationSetup, stage: Stage) -> EngineTraffic:
    """The collectives (and offload transfers) of one optimizer step under ``stage``."""
    engine = setup.training.engine
    _check_offload(setup, stage)
    traffic = ENGINES[engine](setup, stage)
    if engine is Engine.PAPER:
        traffic = EngineTraffic(traffic.collectives, _paper_offload(setup, stage), traffic.notes)
    return traffic


def _ddp_reference(setup: CommunicationSetup) -> EngineTraffic:
    """The same engine's plain data parallelism: no offload, ZeRO++ or shard groups."""
    training = replace(setup.training, offload=Offload())
    plain = replace(setup, training=training, zeropp=ZeroPlusPlus(), shard_group_size=None)
    return ENGINES[training.engine](plain, Stage.NONE)


def _split_note(t: TrainingSetup) -> tuple[str, ...]:
    if t.architecture is not None and t.tp * t.pp > 1:
        return (
            "with tp or pp > 1 the per-tensor rules (buckets, padding, persistence, reuse "
            "distance) see the device's Ψ as one run of elements",
        )
    return ()


def stage_communication(setup: CommunicationSetup, stage: Stage) -> StageCommunication:
    """Volumes, link split and time of one stage, with its ratio to the same engine's DDP."""
    traffic = engine_traffic(setup, stage)
    costs = tuple(cost(setup, c) for c in traffic.collectives)
    sent = sum(c.collective.sent_bytes_per_rank for c in costs)
    ddp = traffic if stage is Stage.NONE else _ddp_reference(setup)
    # The ratio from unrounded bytes, so that the paper's 1 and 1.5 come out exact.
    exact = sum((c.exact_sent for c in traffic.collectives), Fraction(0))
    ddp_sent = sum((c.exact_sent for c in ddp.collectives), Fraction(0))
    return StageCommunication(
        stage=stage,
        collectives=costs,
        transfers=traffic.transfers,
        sent_bytes_per_rank=sent,
        ratio_to_ddp=exact / ddp_sent if ddp_sent else None,
        collective_time_seconds=sum(c.time_seconds for c in costs),
        transfer_seconds=tuple(transfer_time(setup, t) for t in traffic.transfers),
        notes=traffic.notes + _split_note(setup.training),
    )


@dataclass(frozen=True)
class CommunicationEstimate:
    setup: CommunicationSetup
    stages: tuple[StageCommunication, ...]
    convention: str
    ignores: str = IGNORED


def estimate_communication(
    setup: CommunicationSetup, stages: Sequence[Stage]
) -> CommunicationEstimate:
    """Communication per optimizer step for each stage under ``setup.training.engine``."""
    return CommunicationEstimate(
        setup=setup,
        stages=tuple(stage_communication(setup, Stage(s)) for s in stages),
        convention=CONVENTIONS[setup.training.engine],
    )
