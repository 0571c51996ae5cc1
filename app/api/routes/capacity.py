"""POST /v1/capacity."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from app.api.convert import resolve_model, to_setup
from app.api.examples import CAPACITY_EXAMPLES
from app.core.units import readable
from app.schemas.capacity import CapacityRequest, CapacityResponse, StageCapacity
from calculators.capacity import max_params, min_dp
from calculators.conventions import Stage

router = APIRouter(prefix="/v1", tags=["memory"])


@router.post("/capacity", response_model=CapacityResponse)
def capacity(
    request: Annotated[CapacityRequest, Body(openapi_examples=CAPACITY_EXAMPLES)],
) -> CapacityResponse:
    """Largest model whose model states fit per stage; with a model, the smallest Nd."""
    probe = to_setup(request, params=1, arch=None)
    model_setup = None
    if request.model is not None:
        params, arch = resolve_model(request.model)
        model_setup = to_setup(request, params, arch)
    rows = []
    for s in request.stages:
        stage = Stage(s)
        largest = max_params(probe, stage, request.device_memory)
        rows.append(
            StageCapacity(
                stage=s,
                max_params=largest,
                max_params_readable=None if largest is None else f"{largest / 1e9:,.2f} B params",
                min_dp=None
                if model_setup is None
                else min_dp(model_setup, stage, request.device_memory, request.max_dp),
            )
        )
    return CapacityResponse(
        device_memory=request.device_memory,
        dp=request.dp,
        criterion=f"per-device model states <= device_memory ({readable(request.device_memory)})",
        stages=rows,
    )
