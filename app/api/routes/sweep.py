"""POST /v1/memory/sweep."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Body
from starlette.responses import Response

from app.api.convert import memory_setup
from app.api.examples import SWEEP_EXAMPLES
from app.api.presenters import convention_body, json_response, per_device_body
from app.core.calculations import calculate
from app.schemas.sweep import MemorySweepRequest, MemorySweepResponse
from calculators.conventions import Stage
from calculators.errors import InputError
from calculators.memory import across_dp

router = APIRouter(prefix="/v1", tags=["memory"])

# Computation one sweep may take: the 13-point default costs 1-15 ms on a 2-core machine; an
# architecture with tens of thousands of tensors (a 256-expert MoE) costs seconds per point.
SWEEP_BUDGET_S = 5.0


@router.post("/memory/sweep", response_model=MemorySweepResponse)
async def memory_sweep(
    request: Annotated[MemorySweepRequest, Body(openapi_examples=SWEEP_EXAMPLES)],
) -> Response:
    """Per-device memory of one model for each Nd in dp_values, under each requested stage."""
    # off the event loop: up to 64 x 4 estimates, each walking the model's tensors
    return await calculate(sweep, request)


def sweep(request: MemorySweepRequest) -> Response:
    """The sweep, refused (422) once it has computed for more than ``SWEEP_BUDGET_S``.

    Its JSON is built and encoded once (``MemorySweepResponse`` stays the documented schema).
    """
    started = time.perf_counter()
    setup = memory_setup(request)
    stages = [Stage(s) for s in request.stages]
    device_memory = request.device_memory
    # what the Nd values share, worked out once; a point carries no theory figure
    at_dp = across_dp(setup, stages, theory=False)
    reference = at_dp(setup.dp)  # the request's own Nd: its errors come first
    points = []
    for n, dp in enumerate(request.dp_values):
        if time.perf_counter() - started > SWEEP_BUDGET_S:
            raise InputError(
                "dp_values",
                f"the sweep took over {SWEEP_BUDGET_S:g} s of computation after {n} of "
                f"{len(request.dp_values)} values; send fewer dp_values (or ask /v1/memory)",
            )
        # the request's own Nd is already answered: the same setup, the same estimate
        result = reference if dp == setup.dp else at_dp(dp)
        points.append(
            {
                "dp": dp,
                "stages": [
                    {
                        "stage": int(s.stage),
                        "per_device": per_device_body(s),
                        "fits": None if device_memory is None else s.fits(device_memory),
                    }
                    for s in result.stages
                ],
            }
        )
    return json_response(
        {
            "params": setup.params,
            "params_per_device": setup.params_per_device,
            "dp": setup.dp,
            "convention": convention_body(reference),
            "points": points,
        }
    )
