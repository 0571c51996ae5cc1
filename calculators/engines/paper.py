"""The ZeRO paper's accounting: model states only (arXiv 1910.02054 §3.1, §5) and the traffic
of §7 (ZeRO++ arXiv 2306.10209 §3 for its options, MiCS §3 for shard groups, ZeRO-Offload
arXiv 2101.06840 §4.1 for offload transfers)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from calculators.activations import Regime, activations
from calculators.conventions import PRECISION_BYTES, OffloadDevice, Precision, Stage
from calculators.estimates import DpEstimates, StageEstimate, stage_estimate
from calculators.model_states import TrainingSetup, ceil_div, model_state_placements_each
from calculators.topology import Op
from calculators.traffic import (
    Collective,
    CommunicationSetup,
    EngineTraffic,
    Phase,
    Transfer,
    dtype_name,
    micro_steps,
    process_groups,
    reductions,
)

CONVENTION = (
    "paper: ZeRO (arXiv 1910.02054) §5 model states, 2Ψ + 2Ψ + KΨ partitioned over Nd; "
    "with an architecture and a batch, peak adds the activations a 16-bit forward keeps "
    "for backward (Korthikanti et al. 2022 §4, SDPA attention); no buffers or allocator "
    "overhead"
)
TRAFFIC_CONVENTION = (
    "paper: ZeRO (arXiv 1910.02054) §7 — stage 0 all-reduce of gradients (2Ψ); stages 1 "
    "and 2 reduce-scatter of gradients + all-gather of updated parameters (2Ψ); stage 3 "
    "all-gather in forward + all-gather in backward + reduce-scatter (3Ψ), elements in the "
    "parameter dtype, ring factors (N−1)/N. ZeRO++ (arXiv 2306.10209) options and "
    "HSDP/MiCS shard groups follow their papers."
)


@dataclass(frozen=True)
class PaperModel:
    convention: str = CONVENTION
    traffic_convention: str = TRAFFIC_CONVENTION

    def estimate(self, setup: TrainingSetup, stage: Stage) -> StageEstimate:
        return next(self.estimates(setup, (stage,)))

    def estimates(self, setup: TrainingSetup, stages: Sequence[Stage]) -> Iterator[StageEstimate]:
        # the activations and the notes do not depend on the stage: worked out once, after the
        # first stage's model states (whose refusals come first)
        notes: tuple[str, ...] = ()
        acts: int | None = None
        offloaded = 0
        for stage, (device, cpu, nvme) in zip(
            stages, model_state_placements_each(setup, stages), strict=True
        ):
            resident = device.parameters + device.gradients + device.optimizer_states
            if not notes:
                acts, offloaded, said = self._activations(setup)
                notes = ("temporary_buffers is null: the paper counts no engine buffers", said)
            yield stage_estimate(
                stage=stage,
                device=device,
                cpu=cpu,
                nvme=nvme,
                resident=resident,
                activations=acts,
                peak=None if acts is None else resident + acts,
                notes=notes,
                theory=resident,  # the paper's model states are its own theory
                cpu_activations=offloaded,
            )

    @staticmethod
    def _activations(setup: TrainingSetup) -> tuple[int | None, int, str]:
        """The activations the peak adds, the host bytes checkpoint offload holds, and the
        note that says what they are (or why not)."""
        if setup.architecture is None or setup.batch is None:
            return (
                None,
                0,
                "activations and peak are null: they need "
                + ("a batch" if setup.architecture is not None else "an architecture and a batch"),
            )
        # everything autograd holds when forward and the loss are done, the paper's 16-bit
        # activations (34·s·b·h per layer for ffn = 4h) on the first pipeline stage
        regime = Regime.FP32 if setup.precision is Precision.FP32 else Regime.HALF
        acts = activations(setup.architecture, setup.batch, regime, tp=setup.tp, pp=setup.pp)
        return (
            acts.end_of_forward,
            acts.offloaded,
            f"activations in {regime.value} regime; peak = model states + activations",
        )

    def across_dp(self, setup: TrainingSetup) -> DpEstimates:  # noqa: ARG002
        # nothing worth sharing across Nd: each Nd is estimated afresh
        return self.estimates

    def traffic(self, setup: CommunicationSetup, stage: Stage) -> EngineTraffic:
        sent = _collectives(setup, stage)
        return EngineTraffic(sent.collectives, _offload(setup, stage), sent.notes)


MODEL = PaperModel()


def _collectives(setup: CommunicationSetup, stage: Stage) -> EngineTraffic:
    """ZeRO §7 (and ZeRO++ §3 for its options, MiCS §3 for shard groups)."""
    t = setup.training
    psi = t.params_per_device
    b = PRECISION_BYTES[t.precision].parameter
    dt = dtype_name(b, t.precision)
    dp_group, shard, replica = process_groups(setup)
    k, r = micro_steps(setup), reductions(setup)
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


def _offload(setup: CommunicationSetup, stage: Stage) -> tuple[Transfer, ...]:
    """ZeRO-Offload (arXiv 2101.06840 §4.1): 16-bit gradients down, 16-bit parameters up, each
    rank its 1/N partition; ZeRO-Infinity parameters up for every gather."""
    t = setup.training
    psi = t.params_per_device
    b = PRECISION_BYTES[t.precision].parameter
    part = ceil_div(b * psi, t.dp)
    out: list[Transfer] = []
    if t.offload.optimizer is not OffloadDevice.NONE:
        out.append(Transfer("d2h", Phase.BACKWARD, reductions(setup) * part, "gradient partition"))
        out.append(Transfer("h2d", Phase.STEP, part, "updated parameter partition"))
    if t.offload.params is not OffloadDevice.NONE and stage is Stage.PARAMETERS:
        out.append(Transfer("h2d", Phase.FORWARD, micro_steps(setup) * part, "parameter partition"))
        out.append(
            Transfer("h2d", Phase.BACKWARD, micro_steps(setup) * part, "parameter partition")
        )
    return tuple(out)
