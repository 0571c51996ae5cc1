"""POST /v1/capacity."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from app.api.convert import decide, resolve_model, to_batch, to_setup
from app.api.examples import CAPACITY_EXAMPLES
from app.api.presenters import capacity_response
from app.core.calculations import calculate
from app.schemas.capacity import CapacityRequest, CapacityResponse
from app.schemas.model import ModelSpec
from calculators.capacity import Search, search
from calculators.conventions import Engine
from calculators.errors import InputError
from calculators.presets import get_preset

router = APIRouter(prefix="/v1", tags=["memory"])


@router.post("/capacity", response_model=CapacityResponse)
async def capacity(
    request: Annotated[CapacityRequest, Body(openapi_examples=CAPACITY_EXAMPLES)],
) -> CapacityResponse:
    """Largest model per stage that fits with the engine and batch; with a model, its least Nd."""
    # growing a shape walks its tensors per trial (seconds for a deep model under deepspeed):
    # off the event loop, so /healthz and everyone else keep being answered meanwhile
    return await calculate(answer, request)


def _shape_name(spec: ModelSpec) -> str:
    if spec.preset is not None:
        return spec.preset
    if spec.hf_config is not None:
        return f"the hf_config's {spec.hf_config.get('model_type', 'model')}"
    return "the given architecture's"


def answer(request: CapacityRequest) -> CapacityResponse:
    batch = to_batch(request.batch)
    model_setup = shape = None
    shape_name = ""
    arch = None
    if request.model is not None:
        params, arch = resolve_model(request.model)
    if request.shape is not None:
        try:
            shape, shape_name = get_preset(request.shape).architecture, request.shape
        except InputError as err:
            raise InputError("shape", err.message) from None
    # an engine_config (DeepSpeed config, FSDP2 settings) decides stage, precision, offload and
    # batch as in /v1/memory; its "auto" hidden-size values follow the model given (or the shape)
    decided = decide(request, arch or shape, request.batch)
    stages = [int(s) for s in decided.stages] if decided else request.stages
    if request.model is not None:
        model_setup = to_setup(request, params, arch, batch, decided)
        # the paper's model states depend on Ψ alone: its bare-Ψ answer is exact (Table 2);
        # an engine's buffers and a batch's activations depend on the tensors, so grow the shape
        if arch is not None and (request.engine is not Engine.PAPER or batch is not None):
            if request.shape is None:
                shape, shape_name = arch, _shape_name(request.model)
    result = search(
        Search(
            setup=to_setup(request, 1, None, batch, decided),
            device_memory=request.device_memory,
            shape=shape,
            shape_name=shape_name,
            model=model_setup,
            max_dp=request.max_dp,
        ),
        stages,
    )
    return capacity_response(result)
