"""POST /v1/memory/sweep."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Body
from starlette.concurrency import run_in_threadpool

from app.api.convert import memory_setup
from app.api.examples import SWEEP_EXAMPLES
from app.api.presenters import memory_response, per_device
from app.schemas.sweep import MemorySweepRequest, MemorySweepResponse, StageAtDp, SweepPoint
from calculators.conventions import Stage
from calculators.errors import InputError
from calculators.memory import estimate

router = APIRouter(prefix="/v1", tags=["memory"])

# Computation one sweep may take: the 13-point default costs 1-15 ms on a 2-core machine; an
# architecture with tens of thousands of tensors (a 256-expert MoE) costs seconds per point.
SWEEP_BUDGET_S = 5.0


@router.post("/memory/sweep", response_model=MemorySweepResponse)
async def memory_sweep(
    request: Annotated[MemorySweepRequest, Body(openapi_examples=SWEEP_EXAMPLES)],
) -> MemorySweepResponse:
    """Per-device memory of one model for each Nd in dp_values, under each requested stage."""
    # off the event loop: up to 64 x 4 estimates, each walking the model's tensors
    return await run_in_threadpool(sweep, request)


def sweep(request: MemorySweepRequest) -> MemorySweepResponse:
    """The sweep, refused (422) once it has computed for more than ``SWEEP_BUDGET_S``."""
    started = time.perf_counter()
    setup = memory_setup(request)
    stages = [Stage(s) for s in request.stages]
    reference = memory_response(estimate(setup, stages), request.device_memory)
    points = []
    for n, dp in enumerate(request.dp_values):
        if time.perf_counter() - started > SWEEP_BUDGET_S:
            raise InputError(
                "dp_values",
                f"the sweep took over {SWEEP_BUDGET_S:g} s of computation after {n} of "
                f"{len(request.dp_values)} values; send fewer dp_values (or ask /v1/memory)",
            )
        result = estimate(replace(setup, dp=dp), stages)
        points.append(
            SweepPoint(
                dp=dp,
                stages=[
                    StageAtDp(
                        stage=int(s.stage),
                        per_device=per_device(s),
                        fits=None
                        if request.device_memory is None
                        else s.fits(request.device_memory),
                    )
                    for s in result.stages
                ],
            )
        )
    return MemorySweepResponse(
        params=reference.params,
        params_per_device=reference.params_per_device,
        dp=reference.dp,
        convention=reference.convention,
        points=points,
    )
