"""POST /v1/memory."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body
from starlette.responses import Response

from app.api.convert import memory_question
from app.api.examples import MEMORY_EXAMPLES
from app.api.presenters import memory_response
from app.core.calculations import calculate
from app.schemas.memory import MemoryRequest, MemoryResponse
from calculators.conventions import Engine
from calculators.memory import estimate

router = APIRouter(prefix="/v1", tags=["memory"])


@router.post("/memory", response_model=MemoryResponse)
async def memory(
    request: Annotated[MemoryRequest, Body(openapi_examples=MEMORY_EXAMPLES)],
) -> Response:
    """Per-device memory (bytes) of one model under each requested ZeRO stage."""
    if on_loop(request):
        return answer(request)
    return await calculate(answer, request)


def on_loop(request: MemoryRequest) -> bool:
    """Whether the answer is cheap enough for the event loop.

    The paper's bare Ψ: constant work well under a millisecond, cheaper than a thread hop. The
    engines walk tensors (an architecture's, or the decoder a bare Ψ implies; a 256-expert MoE:
    up to a second): off the event loop, so /healthz and everyone else keep being answered
    meanwhile.
    """
    return request.model.params is not None and request.engine is Engine.PAPER


def answer(request: MemoryRequest) -> Response:
    """The answer's JSON, encoded once (``MemoryResponse`` stays the documented schema)."""
    question = memory_question(request)
    result = estimate(question.setup, question.stages)
    return memory_response(result, request.device_memory, question.decided)
