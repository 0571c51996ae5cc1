"""Communication per optimizer step: which collectives each stage issues, how many bytes each
rank sends, over which links, and how long it takes.

Each engine's traffic lives beside its memory model: ``paper`` (calculators/engines/paper.py,
ZeRO arXiv 1910.02054 §7), ``deepspeed`` (calculators/engines/deepspeed/traffic.py, DeepSpeed
0.19.8) and ``torch`` (calculators/engines/torch/traffic.py: DDP, ZeroRedundancyOptimizer,
FSDP2). This module asks the engine, prices each collective (calculators.cost) and compares
with the same engine's plain data parallelism.

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

from collections.abc import Callable, Sequence
from dataclasses import replace
from fractions import Fraction

from calculators.conventions import Engine, Stage
from calculators.cost import Ring, cost, transfer_time
from calculators.engines import engine_model
from calculators.model_states import Offload, TrainingSetup, check_offload
from calculators.topology import (
    Algorithm,
    Group,
    Link,
    Network,
    Op,
    Topology,
    bus_factor,
    make_topology,
    sent_factor,
)
from calculators.traffic import (
    Collective,
    CommunicationEstimate,
    CommunicationSetup,
    EngineTraffic,
    GradSync,
    Phase,
    StageCommunication,
    Transfer,
    ZeroPlusPlus,
)


def engine_traffic(setup: CommunicationSetup, stage: Stage) -> EngineTraffic:
    """The collectives (and offload transfers) of one optimizer step under ``stage``; the
    torch engines check their own offload (FSDP2's CPUOffloadPolicy runs at stages 2 and 3),
    the others ZeRO's (parameter offload at stage 3)."""
    if setup.training.engine is not Engine.TORCH:
        check_offload(setup.training.offload, stage)
    return engine_model(setup.training.engine).traffic(setup, stage)


def _ddp_reference(setup: CommunicationSetup) -> EngineTraffic:
    """The same engine's plain data parallelism: no offload, ZeRO++ or shard groups."""
    training = replace(setup.training, offload=Offload())
    plain = replace(setup, training=training, zeropp=ZeroPlusPlus(), shard_group_size=None)
    return engine_model(training.engine).traffic(plain, Stage.NONE)


def _is_plain(setup: CommunicationSetup) -> bool:
    """Whether ``setup`` is its own ``_ddp_reference`` (no offload, ZeRO++ or shard groups)."""
    return (
        setup.training.offload == Offload()
        and setup.zeropp == ZeroPlusPlus()
        and setup.shard_group_size is None
    )


def _exact_sent(traffic: EngineTraffic) -> Fraction:
    """Bytes a rank sends over ``traffic``'s collectives, before rounding up to whole bytes."""
    return sum((c.exact_sent for c in traffic.collectives), Fraction(0))


def _split_note(t: TrainingSetup) -> tuple[str, ...]:
    if t.architecture is not None and t.tp * t.pp > 1:
        return (
            "with tp or pp > 1 the per-tensor rules (buckets, padding, persistence, reuse "
            "distance) see the device's Ψ as one run of elements",
        )
    return ()


def stage_communication(
    setup: CommunicationSetup,
    stage: Stage,
    ddp_sent: Callable[[], Fraction] | None = None,
    seen_ddp: list[Fraction] | None = None,
    rings: dict[tuple[Op, Group], Ring] | None = None,
) -> StageCommunication:
    """Volumes, link split and time of one stage, with its ratio to the same engine's DDP.

    ``ddp_sent``: gives the exact bytes of the same engine's DDP step (they do not depend on
    the stage), for callers that ask for several stages; asked only after the stage's own
    traffic, so the stage's errors come first. ``seen_ddp``: where stage 0 of a setup that is
    already plain data parallelism leaves its bytes, which are that reference. ``rings``: the
    rings ``cost`` already worked out for ``setup``.
    """
    traffic = engine_traffic(setup, stage)
    costs = tuple(cost(setup, c, rings) for c in traffic.collectives)
    sent = sum(c.collective.sent_bytes_per_rank for c in costs)
    # The ratio from unrounded bytes, so that the paper's 1 and 1.5 come out exact.
    exact = _exact_sent(traffic)
    if stage is Stage.NONE:
        reference = exact
        if seen_ddp is not None and _is_plain(setup):  # this step is the DDP reference
            seen_ddp.append(exact)
    else:
        reference = ddp_sent() if ddp_sent is not None else _exact_sent(_ddp_reference(setup))
    return StageCommunication(
        stage=stage,
        collectives=costs,
        transfers=traffic.transfers,
        sent_bytes_per_rank=sent,
        ratio_to_ddp=exact / reference if reference else None,
        collective_time_seconds=sum(c.time_seconds for c in costs),
        transfer_seconds=tuple(transfer_time(setup, t) for t in traffic.transfers),
        notes=traffic.notes + _split_note(setup.training),
    )


def estimate_communication(
    setup: CommunicationSetup, stages: Sequence[Stage]
) -> CommunicationEstimate:
    """Communication per optimizer step for each stage under ``setup.training.engine``."""
    known: list[Fraction] = []
    rings: dict[tuple[Op, Group], Ring] = {}  # the step's groups, met again stage after stage

    def ddp_sent() -> Fraction:  # the same engine's DDP step, built once for every stage
        if not known:
            known.append(_exact_sent(_ddp_reference(setup)))
        return known[0]

    return CommunicationEstimate(
        setup=setup,
        stages=tuple(stage_communication(setup, Stage(s), ddp_sent, known, rings) for s in stages),
        convention=engine_model(setup.training.engine).traffic_convention,
    )


# the names callers import from here (their homes: calculators.topology, calculators.traffic)
__all__ = [
    "Algorithm",
    "Collective",
    "CommunicationEstimate",
    "CommunicationSetup",
    "EngineTraffic",
    "GradSync",
    "Group",
    "Link",
    "Network",
    "Op",
    "Phase",
    "StageCommunication",
    "Topology",
    "Transfer",
    "ZeroPlusPlus",
    "bus_factor",
    "cost",
    "engine_traffic",
    "estimate_communication",
    "make_topology",
    "sent_factor",
    "stage_communication",
    "transfer_time",
]
