"""POST /v1/communication, GET /v1/interconnects."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body
from starlette.responses import Response

from app.api.convert import communication_question
from app.api.examples import COMMUNICATION_EXAMPLES
from app.api.presenters import communication_body, communication_response, json_response
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


@router.post("/communication", response_model=CommunicationResponse)
def communication(
    request: Annotated[CommunicationRequest, Body(openapi_examples=COMMUNICATION_EXAMPLES)],
) -> CommunicationResponse:
    """Collectives, bytes sent per rank and estimated time per optimizer step, per ZeRO stage."""
    question = communication_question(request)
    result = estimate_communication(question.setup, question.stages)
    return communication_response(result, question.decided)


def answer(request: CommunicationRequest) -> Response:
    """The route's answer as FastAPI writes it for ``response_model``, encoded once from plain
    values (``CommunicationResponse`` stays the documented schema)."""
    question = communication_question(request)
    result = estimate_communication(question.setup, question.stages)
    return json_response(communication_body(result, question.decided))


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
