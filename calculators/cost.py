"""Time of a step's traffic: an α–β model.

Per call NCCL's base latency plus one hop latency per ring step (NCCL src/graph/tuning.cc), plus
bus-factor × payload / bus bandwidth of the slowest link class the ring crosses. It ignores
overlap with compute, congestion from other traffic, protocol and kernel efficiency below the
link's peak rate, and NVLS/SHARP in-network reduction.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

from calculators.interconnects import NCCL_BASE_LATENCY
from calculators.model_states import ceil_div
from calculators.topology import Algorithm, Group, Op, bus_factor, ring_steps, sent_factor
from calculators.traffic import Collective, CollectiveCost, CommunicationSetup, Transfer


def _node_bandwidth(setup: CommunicationSetup, group: Group) -> Fraction:
    """Bytes/s one group can push out of a node: its share of the node's NICs.

    gpus_per_node / per_node groups of this kind run at once on a node (one per TP/PP rank) and
    share its ``nics_per_node`` adapters.
    """
    topo = setup.topology
    return Fraction(setup.network.inter.bandwidth * topo.nics * group.per_node, topo.gpus_per_node)


def ring_latency(
    intra_steps: int,
    intra: Fraction,
    inter_steps: int = 0,
    inter: Fraction = Fraction(0),
    bases: int = 1,
) -> Fraction:
    """``bases`` NCCL base latencies plus one hop latency per ring step on each link class."""
    return _ring_latency(
        intra_steps,
        intra.numerator,
        intra.denominator,
        inter_steps,
        inter.numerator,
        inter.denominator,
        bases,
    )


@lru_cache(maxsize=1024)  # a constant of the links and the ring, asked per collective
def _ring_latency(
    intra_steps: int,
    intra_n: int,
    intra_d: int,
    inter_steps: int,
    inter_n: int,
    inter_d: int,
    bases: int,
) -> Fraction:
    """``ring_latency`` keyed on integers (a Fraction's hash takes a modular inverse)."""
    return (
        bases * NCCL_BASE_LATENCY
        + intra_steps * Fraction(intra_n, intra_d)
        + inter_steps * Fraction(inter_n, inter_d)
    )


def alpha_beta_seconds(
    calls: int, latency: Fraction, payload: int, factor: Fraction, bandwidth: Fraction | int
) -> float:
    """float(calls · (latency + payload / calls · factor / bandwidth)): the exact rational,
    rounded once, over integer numerators and denominators (no Fraction per step).

    With latency = l/L, factor = f/F, bandwidth = w/W the sum is
    (calls·l·F·w + payload·f·W·L) / (L·F·w); int / int true division rounds it correctly, as
    ``float(Fraction)`` does.
    """
    ln, ld = latency.numerator, latency.denominator
    fn, fd = factor.numerator, factor.denominator
    wn, wd = bandwidth.numerator, bandwidth.denominator
    return (calls * ln * fd * wn + payload * fn * wd * ld) / (ld * fd * wn)


Ring = tuple[Fraction, Fraction, Fraction | int]
"""A flat ring's latency per call, bus factor and bus bandwidth."""


def _ring(setup: CommunicationSetup, op: Op, g: Group) -> Ring:
    """Latency per call, bus factor and bus bandwidth of ``op`` on a flat ring over ``g``."""
    net = setup.network
    m, per = g.nodes, g.per_node
    if m == 1:
        latency = ring_latency(ring_steps(op, g.size), net.intra.latency)
        return latency, bus_factor(op, g.size), net.intra.bandwidth
    # Flat ring: each node is entered and left once per ring, so a rank's mean share of the
    # node's egress is 1/per of what it sends; the ring runs at the slower link class.
    node_bw = _node_bandwidth(setup, g)
    steps = ring_steps(op, g.size)
    inter_steps = min(steps, (2 if op is Op.ALL_REDUCE else 1) * (m - 1))
    latency = ring_latency(steps - inter_steps, net.intra.latency, inter_steps, net.inter.latency)
    bandwidth = min(Fraction(net.intra.bandwidth), node_bw) if per > 1 else node_bw
    return latency, bus_factor(op, g.size), bandwidth


def cost(
    setup: CommunicationSetup, c: Collective, rings: dict[tuple[Op, Group], Ring] | None = None
) -> CollectiveCost:
    """Link split and α–β time of one collective entry.

    ``rings``: the flat rings already worked out for ``setup`` (a step runs a few collectives
    on the same few groups), filled in as new ones are met.
    """
    g = c.group
    sent = c.sent_bytes_per_rank
    if g.size <= 1 or c.calls == 0:
        return CollectiveCost(c, 0, 0, 0.0)
    net = setup.network
    m, per = g.nodes, g.per_node
    hierarchical = (
        m > 1
        and net.algorithm is Algorithm.HIERARCHICAL
        and per > 1
        and c.op in (Op.ALL_REDUCE, Op.ALL_GATHER, Op.REDUCE_SCATTER)
    )
    if hierarchical:
        node_bw = _node_bandwidth(setup, g)
        per_call = Fraction(c.payload_bytes, c.calls)
        # In-node phases on the whole payload, the cross-node phase on 1/per of it.
        intra_op_factor = (
            sent_factor(Op.ALL_REDUCE, per) if c.op is Op.ALL_REDUCE else sent_factor(c.op, per)
        )
        inter_factor = sent_factor(c.op, m) / per
        intra = ceil_div(c.payload_bytes * intra_op_factor)
        inter = sent - intra
        latency = ring_latency(
            ring_steps(c.op, per), net.intra.latency, ring_steps(c.op, m), net.inter.latency, 2
        )
        transfer = (
            per_call * intra_op_factor / net.intra.bandwidth
            + per_call * inter_factor * per / node_bw
        )
        return CollectiveCost(c, intra, inter, float(c.calls * (latency + transfer)))
    if rings is None:
        ring = _ring(setup, c.op, g)
    else:
        key = (c.op, g)
        ring = rings.get(key) or rings.setdefault(key, _ring(setup, c.op, g))
    latency, factor, bandwidth = ring
    seconds = alpha_beta_seconds(c.calls, latency, c.payload_bytes, factor, bandwidth)
    if m == 1:
        return CollectiveCost(c, sent, 0, seconds)
    inter = ceil_div(sent, per)
    return CollectiveCost(c, sent - inter, inter, seconds)


def transfer_time(setup: CommunicationSetup, t: Transfer) -> float:
    """Bytes over the host link at its peak one-direction rate (no latency term)."""
    return float(Fraction(t.bytes, setup.network.host.bandwidth))
