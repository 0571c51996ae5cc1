"""POST /v1/communication, GET /v1/interconnects."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from app.api.convert import communication_question
from app.api.presenters import communication_response
from app.schemas.communication import (
    CommunicationRequest,
    CommunicationResponse,
    InterconnectPreset,
)
from calculators.communication import (
    estimate_communication,
)
from calculators.interconnects import (
    PRESETS,
)

router = APIRouter(prefix="/v1", tags=["communication"])


COMMUNICATION_EXAMPLES: dict[str, dict[str, Any]] = {
    "paper_figure": {
        "summary": "ZeRO §7: Ψ = 1e9, Nd = 8, fp16 (3.5e9 / 3.5e9 / 3.5e9 / 5.25e9 bytes)",
        "value": {"model": {"params": 1_000_000_000}, "dp": 8},
    },
    "deepspeed_llama2_7b": {
        "summary": "Llama 2 7B on 4 × 8 H100, DeepSpeed defaults, NDR InfiniBand",
        "value": {
            "model": {"preset": "llama2-7b"},
            "dp": 32,
            "precision": "mixed_bf16",
            "engine": "deepspeed",
            "gpus_per_node": 8,
            "interconnect": "nvlink4",
            "inter_node_interconnect": "ib_ndr",
        },
    },
    "torch_fsdp2_hsdp": {
        "summary": "FSDP2 with HSDP: shard in a node of 8, replicate across 4 nodes",
        "value": {
            "model": {"preset": "llama3-8b"},
            "dp": 32,
            "stages": [2, 3],
            "precision": "mixed_bf16",
            "engine": "torch",
            "gpus_per_node": 8,
            "shard_group_size": 8,
        },
    },
    "custom_link": {
        "summary": "Two nodes over 100 GbE given as numbers, gradient accumulation 4",
        "value": {
            "model": {"params": 1_300_000_000},
            "dp": 16,
            "gpus_per_node": 8,
            "grad_accumulation_steps": 4,
            "inter_node_interconnect": {"bandwidth": 12.5e9, "latency": 2e-5},
        },
    },
}


@router.post("/communication", response_model=CommunicationResponse)
def communication(
    request: Annotated[CommunicationRequest, Body(openapi_examples=COMMUNICATION_EXAMPLES)],
) -> CommunicationResponse:
    """Collectives, bytes sent per rank and estimated time per optimizer step, per ZeRO stage."""
    question = communication_question(request)
    result = estimate_communication(question.setup, question.stages)
    return communication_response(result, question.decided)


@router.get("/interconnects", response_model=list[InterconnectPreset])
def interconnects() -> list[InterconnectPreset]:
    """Interconnect presets: per-direction bandwidth with its vendor source, hop latency."""
    return [
        InterconnectPreset(
            name=p.name,
            kind=p.kind.value,
            bandwidth=p.bandwidth,
            latency_seconds=float(p.latency),
            source=p.source,
        )
        for p in PRESETS.values()
    ]
