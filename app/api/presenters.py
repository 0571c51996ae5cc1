"""Domain results out, response schemas in: bytes stay integers, readable strings beside them."""

from __future__ import annotations

from app.core.units import readable
from app.schemas.communication import (
    CollectiveOut,
    CommunicationConvention,
    CommunicationResponse,
    LinkOut,
    StageCommunicationOut,
    TopologyOut,
    TransferOut,
)
from app.schemas.inference import InferenceResponse
from app.schemas.memory import (
    Breakdown,
    Convention,
    HostMemory,
    MemoryResponse,
    OffloadIn,
    PerDevice,
    ResolvedConfig,
    ResolvedValue,
    StageMemory,
)
from calculators.config_resolution import Decided
from calculators.conventions import OPTIMIZER_ASSUMPTIONS, Engine
from calculators.estimates import MemoryEstimate, StageEstimate
from calculators.inference import InferenceMemory
from calculators.interconnects import Interconnect
from calculators.model_states import Placement, bytes_per_param
from calculators.traffic import CommunicationEstimate, StageCommunication


def _host(p: Placement, buffers: int = 0) -> HostMemory:
    return HostMemory(
        total=p.total + buffers,
        parameters=p.parameters,
        gradients=p.gradients,
        optimizer_states=p.optimizer_states,
        buffers=buffers,
    )


BREAKDOWN_NOTES = [
    "reserved is not predicted: PyTorch's caching allocator rounds requests (512 B; small "
    "tensors share 2 MiB segments) and keeps freed blocks for reuse, so reserved >= peak by an "
    "amount that depends on the order of allocations; /v1/measure reports it (10-25 % above "
    "the peak in bench/results/torch_peak.json)",
    "outside the allocator, nvidia-smi also counts the CUDA context and loaded kernels (about "
    "1.2-1.3 GiB with torch 2.11 on an H100: nvml_used - reserved in "
    "bench/results/torch_peak.json) and NCCL's buffers (NCCL_BUFFSIZE, 4 MiB by default, per "
    "channel and peer; NCCL environment-variable documentation)",
]


def breakdown(est: StageEstimate) -> Breakdown:
    return Breakdown(
        theory=est.theory,
        allocated_resident=est.resident,
        allocated_peak=est.peak,
    )


def per_device(est: StageEstimate) -> PerDevice:
    return PerDevice(
        parameters=est.device.parameters,
        gradients=est.device.gradients,
        optimizer_states=est.device.optimizer_states,
        model_states=est.model_states,
        activations=est.activations,
        temporary_buffers=est.temporary_buffers,
        resident=est.resident,
        peak=est.peak,
    )


def stage_memory(est: StageEstimate, device_memory: int | None) -> StageMemory:
    per = per_device(est)
    return StageMemory(
        stage=int(est.stage),
        per_device=per,
        per_device_readable={
            k: readable(v) for k, v in per.model_dump().items() if isinstance(v, int)
        },
        cpu=_host(est.cpu, est.cpu_buffers),
        nvme=_host(est.nvme),
        fits=None if device_memory is None else est.fits(device_memory),
        components=dict(est.components),
        breakdown=breakdown(est),
        notes=list(est.notes),
    )


def resolved_config(engine: Engine, decided: Decided | None) -> ResolvedConfig | None:
    if decided is None:
        return None
    return ResolvedConfig(
        engine=engine,
        stage=None if decided.stage is None else int(decided.stage),
        stages=[int(s) for s in decided.stages],
        precision=decided.precision,
        offload=OffloadIn(optimizer=decided.offload.optimizer, params=decided.offload.params),
        micro_batch_size=decided.micro_batch,
        gradient_accumulation_steps=decided.grad_accumulation,
        train_batch_size=decided.train_batch,
        values=[ResolvedValue(key=v.key, value=v.value, source=v.source) for v in decided.values],
        notes=list(decided.notes),
    )


def memory_response(
    result: MemoryEstimate, device_memory: int | None, decided: Decided | None = None
) -> MemoryResponse:
    setup = result.setup
    per = bytes_per_param(setup)
    return MemoryResponse(
        params=setup.params,
        params_per_device=setup.params_per_device,
        dp=setup.dp,
        tp=setup.tp,
        pp=setup.pp,
        convention=Convention(
            engine=setup.engine,
            description=result.convention,
            precision=setup.precision,
            optimizer=setup.optimizer,
            k=float(setup.k_value),
            optimizer_assumption=(
                "k given by the request"
                if setup.k is not None
                else OPTIMIZER_ASSUMPTIONS[setup.optimizer]
            ),
            gradients=setup.gradients,
            bytes_per_param={
                "parameters": float(per.parameters),
                "gradients": float(per.gradients),
                "optimizer_states": float(per.optimizer_states),
            },
        ),
        stages=[stage_memory(s, device_memory) for s in result.stages],
        breakdown_notes=BREAKDOWN_NOTES,
        resolved_config=resolved_config(setup.engine, decided),
    )


TIME_MODEL = (
    "per call: NCCL base latency 8.4 µs + ring steps × hop latency (NCCL tuning.cc Ring/Simple: "
    "NVLink 3.4 µs, PCIe 5.7 µs, network 14 µs, or the given latency); plus bus factor × "
    "payload / bus bandwidth, the bus bandwidth being the slowest link class the ring crosses "
    "(a node's share of its NICs when the group leaves the node). Offload transfers: bytes / "
    "host link bandwidth."
)


def _link_out(link: Interconnect) -> LinkOut:
    return LinkOut(
        name=link.name,
        bandwidth=link.bandwidth,
        latency_seconds=float(link.latency),
        source=link.source,
    )


def _stage_out(s: StageCommunication) -> StageCommunicationOut:
    return StageCommunicationOut(
        stage=int(s.stage),
        collectives=[
            CollectiveOut(
                op=c.collective.op,
                phase=c.collective.phase,
                calls=c.collective.calls,
                payload_bytes=c.collective.payload_bytes,
                sent_bytes_per_rank=c.collective.sent_bytes_per_rank,
                dtype=c.collective.dtype,
                group_size=c.collective.group.size,
                link=c.collective.group.link,
                nodes_spanned=c.collective.group.nodes,
                intra_node_bytes_per_rank=c.intra_node_bytes_per_rank,
                inter_node_bytes_per_rank=c.inter_node_bytes_per_rank,
                time_seconds=c.time_seconds,
                what=c.collective.what,
            )
            for c in s.collectives
        ],
        sent_bytes_per_rank=s.sent_bytes_per_rank,
        sent_readable=readable(s.sent_bytes_per_rank),
        ratio_to_ddp=None if s.ratio_to_ddp is None else float(s.ratio_to_ddp),
        time_seconds=s.time_seconds,
        collective_time_seconds=s.collective_time_seconds,
        offload_transfers=[
            TransferOut(
                direction=t.direction, phase=t.phase, bytes=t.bytes, time_seconds=secs, what=t.what
            )
            for t, secs in zip(s.transfers, s.transfer_seconds, strict=True)
        ],
        offload_time_seconds=s.transfer_time_seconds,
        notes=list(s.notes),
    )


def communication_response(
    result: CommunicationEstimate, decided: Decided | None = None
) -> CommunicationResponse:
    setup = result.setup
    t, topo, net = setup.training, setup.topology, setup.network
    dp_group = topo.dp_group()
    return CommunicationResponse(
        params=t.params,
        params_per_device=t.params_per_device,
        dp=t.dp,
        tp=t.tp,
        pp=t.pp,
        grad_accumulation_steps=setup.grad_accumulation_steps,
        convention=CommunicationConvention(
            engine=t.engine,
            description=result.convention,
            grad_sync=setup.grad_sync,
            time_model=TIME_MODEL,
            ignores=result.ignores,
        ),
        topology=TopologyOut(
            nodes=topo.nodes,
            gpus_per_node=topo.gpus_per_node,
            nics_per_node=topo.nics,
            dp_group_nodes=dp_group.nodes,
            dp_ranks_per_node=dp_group.per_node,
            assumed=topo.assumed,
            layout="global rank = (pp_rank · dp + dp_rank) · tp + tp_rank (tensor parallel "
            "innermost); node = rank // gpus_per_node",
        ),
        links={
            "intra_node": _link_out(net.intra),
            "inter_node": _link_out(net.inter),
            "host": _link_out(net.host),
        },
        stages=[_stage_out(s) for s in result.stages],
        resolved_config=resolved_config(t.engine, decided),
    )


def inference_response(
    params: int, mem: InferenceMemory, device_memory: int | None
) -> InferenceResponse:
    sizes = {"weights": mem.weights, "kv_cache": mem.kv_cache, "total": mem.total}
    notes = ["decode-step activations are transient and not counted"]
    if mem.kv_cache is None:
        notes.append("give an architecture, preset or hf_config for the KV cache")
    needed = mem.total if mem.total is not None else mem.weights
    return InferenceResponse(
        params=params,
        weights=mem.weights,
        kv_cache=mem.kv_cache,
        total=mem.total,
        readable={k: readable(v) for k, v in sizes.items() if v is not None},
        fits=None if device_memory is None else needed <= device_memory,
        notes=notes,
    )
