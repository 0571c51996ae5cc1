"""POST /v1/communication, GET /v1/interconnects."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from app.api.convert import resolve_model, to_setup
from app.core.units import readable
from app.schemas.communication import (
    CollectiveOut,
    CommunicationConvention,
    CommunicationRequest,
    CommunicationResponse,
    InterconnectIn,
    InterconnectPreset,
    LinkIn,
    LinkOut,
    StageCommunicationOut,
    TopologyOut,
    TransferOut,
)
from calculators.communication import (
    CommunicationEstimate,
    CommunicationSetup,
    Network,
    StageCommunication,
    ZeroPlusPlus,
    estimate_communication,
    make_topology,
)
from calculators.conventions import Stage
from calculators.interconnects import (
    PRESETS,
    Interconnect,
    custom_interconnect,
    get_interconnect,
)

router = APIRouter(prefix="/v1", tags=["communication"])

TIME_MODEL = (
    "per call: NCCL base latency 8.4 µs + ring steps × hop latency (NCCL tuning.cc Ring/Simple: "
    "NVLink 3.4 µs, PCIe 5.7 µs, network 14 µs, or the given latency); plus bus factor × "
    "payload / bus bandwidth, the bus bandwidth being the slowest link class the ring crosses "
    "(a node's share of its NICs when the group leaves the node). Offload transfers: bytes / "
    "host link bandwidth."
)

COMMUNICATION_EXAMPLES: dict[str, dict[str, Any]] = {
    "paper_figure": {
        "summary": "ZeRO §7: Ψ = 1e9, Nd = 8, fp16 (3.5e9 / 3.5e9 / 3.5e9 / 5.25e9 bytes)",
        "value": {"model": {"params": 1_000_000_000}, "dp": 8},
    },
    "deepspeed_llama2_7b": {
        "summary": "Llama 2 7B on 4 × 8 H100, DeepSpeed defaults, NDR InfiniBand",
        "value": {
            "model": {"preset": "llama2-7b"}, "dp": 32, "precision": "mixed_bf16",
            "engine": "deepspeed", "gpus_per_node": 8, "interconnect": "nvlink4",
            "inter_node_interconnect": "ib_ndr",
        },
    },
    "torch_fsdp2_hsdp": {
        "summary": "FSDP2 with HSDP: shard in a node of 8, replicate across 4 nodes",
        "value": {
            "model": {"preset": "llama3-8b"}, "dp": 32, "stages": [2, 3],
            "precision": "mixed_bf16", "engine": "torch", "gpus_per_node": 8,
            "shard_group_size": 8,
        },
    },
    "custom_link": {
        "summary": "Two nodes over 100 GbE given as numbers, gradient accumulation 4",
        "value": {
            "model": {"params": 1_300_000_000}, "dp": 16, "gpus_per_node": 8,
            "grad_accumulation_steps": 4,
            "inter_node_interconnect": {"bandwidth": 12.5e9, "latency": 2e-5},
        },
    },
}


def _link(spec: LinkIn, field: str) -> Interconnect:
    if isinstance(spec, InterconnectIn):
        return custom_interconnect(spec.bandwidth, spec.latency, field)
    return get_interconnect(spec, field)


def communication_setup(req: CommunicationRequest) -> CommunicationSetup:
    """The calculators' view of a communication request."""
    params, arch = resolve_model(req.model)
    training = to_setup(req, params, arch)
    return CommunicationSetup(
        training=training,
        topology=make_topology(req.dp, req.tp, req.pp, req.nodes, req.gpus_per_node,
                               req.nics_per_node),
        network=Network(
            intra=_link(req.interconnect, "interconnect"),
            inter=_link(req.inter_node_interconnect, "inter_node_interconnect"),
            host=_link(req.host_interconnect, "host_interconnect"),
            algorithm=req.algorithm,
        ),
        grad_accumulation_steps=req.grad_accumulation_steps,
        grad_sync=req.grad_sync,
        shard_group_size=req.shard_group_size,
        zeropp=ZeroPlusPlus(qwz=req.zeropp.qwz, hpz=req.zeropp.hpz, qgz=req.zeropp.qgz),
    )


def _link_out(link: Interconnect) -> LinkOut:
    return LinkOut(name=link.name, bandwidth=link.bandwidth,
                   latency_seconds=float(link.latency), source=link.source)


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
            TransferOut(direction=t.direction, phase=t.phase, bytes=t.bytes, time_seconds=secs,
                        what=t.what)
            for t, secs in zip(s.transfers, s.transfer_seconds, strict=True)
        ],
        offload_time_seconds=s.transfer_time_seconds,
        notes=list(s.notes),
    )


def communication_response(result: CommunicationEstimate) -> CommunicationResponse:
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
    )


@router.post("/communication", response_model=CommunicationResponse)
def communication(
    request: Annotated[CommunicationRequest, Body(openapi_examples=COMMUNICATION_EXAMPLES)],
) -> CommunicationResponse:
    """Collectives, bytes sent per rank and estimated time per optimizer step, per ZeRO stage."""
    result = estimate_communication(
        communication_setup(request), [Stage(s) for s in request.stages]
    )
    return communication_response(result)


@router.get("/interconnects", response_model=list[InterconnectPreset])
def interconnects() -> list[InterconnectPreset]:
    """Interconnect presets: per-direction bandwidth with its vendor source, hop latency."""
    return [
        InterconnectPreset(name=p.name, kind=p.kind.value, bandwidth=p.bandwidth,
                           latency_seconds=float(p.latency), source=p.source)
        for p in PRESETS.values()
    ]
