"""Where ranks sit and what a collective costs on a ring.

Bytes sent per rank use the exact ring factors (NVIDIA nccl-tests doc/PERFORMANCE.md):
all-reduce 2(N−1)/N, all-gather / reduce-scatter / all-to-all (N−1)/N. Broadcast and reduce move
the whole payload over every ring link but the last: each rank sends (N−1)/N of it on average
(the root sends all of it); their bus-bandwidth factor is 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from functools import lru_cache

from calculators.errors import InputError
from calculators.interconnects import (
    DEFAULT_HOST_LINK,
    DEFAULT_INTER_NODE,
    DEFAULT_INTRA_NODE,
    PRESETS,
    Interconnect,
)


class Op(StrEnum):
    """A collective operation (NCCL names, as torch.distributed calls them)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_TO_ALL = "all_to_all"


class Algorithm(StrEnum):
    """How a collective that spans nodes is laid out."""

    RING = "ring"
    """One flat ring over all ranks (NCCL's Ring algorithm)."""
    HIERARCHICAL = "hierarchical"
    """Reduce-scatter in the node, the operation across nodes on 1/g of the data, all-gather in
    the node (2D / hierarchical all-reduce)."""


@lru_cache(maxsize=1024)  # a constant of (op, n), asked for every collective of every stage
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


@lru_cache(maxsize=1024)
def bus_factor(op: Op, n: int) -> Fraction:
    """nccl-tests busbw / algbw (doc/PERFORMANCE.md): 2(n−1)/n all-reduce, (n−1)/n all-gather,
    reduce-scatter and all-to-all, 1 broadcast and reduce."""
    if op in (Op.BROADCAST, Op.REDUCE):
        return Fraction(1) if n > 1 else Fraction(0)
    return sent_factor(op, n)


def ring_steps(op: Op, n: int) -> int:
    """Ring steps per call (NCCL tuning.cc: 2(n−1) all-reduce, n−1 otherwise)."""
    return 2 * (n - 1) if op is Op.ALL_REDUCE else n - 1


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
