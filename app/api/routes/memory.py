"""POST /v1/memory."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from app.api.convert import memory_setup
from app.api.examples import MEMORY_EXAMPLES
from app.api.presenters import memory_response
from app.schemas.memory import MemoryRequest, MemoryResponse
from calculators.conventions import Stage
from calculators.memory import estimate

router = APIRouter(prefix="/v1", tags=["memory"])


@router.post("/memory", response_model=MemoryResponse)
def memory(
    request: Annotated[MemoryRequest, Body(openapi_examples=MEMORY_EXAMPLES)],
) -> MemoryResponse:
    """Per-device memory (bytes) of one model under each requested ZeRO stage."""
    result = estimate(memory_setup(request), [Stage(s) for s in request.stages])
    return memory_response(result, request.device_memory)
