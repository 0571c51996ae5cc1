"""POST /v1/inference."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from app.api.convert import resolve_model
from app.api.presenters import inference_response
from app.schemas.inference import InferenceRequest, InferenceResponse
from calculators.inference import InferenceSetup, inference_memory

router = APIRouter(prefix="/v1", tags=["memory"])

EXAMPLES: dict[str, dict[str, Any]] = {
    "llama2_7b_4k": {
        "summary": "Llama 2 7B in bf16, one 4096-token sequence",
        "value": {"model": {"preset": "llama2-7b"}, "context": 4096},
    },
    "fp16_10b": {
        "summary": "A 10B model: weights alone in fp16",
        "value": {"model": {"params": 10_000_000_000}, "weights": "fp16"},
    },
}


@router.post("/inference", response_model=InferenceResponse)
def inference(
    request: Annotated[InferenceRequest, Body(openapi_examples=EXAMPLES)],
) -> InferenceResponse:
    """Inference memory per device: weights plus the KV cache of a batch at a context length."""
    params, arch = resolve_model(request.model)
    mem = inference_memory(
        InferenceSetup(
            params=params,
            architecture=arch,
            weights=request.weights,
            kv_cache=request.kv_cache,
            batch_size=request.batch_size,
            context=request.context,
            tp=request.tp,
            pp=request.pp,
        )
    )
    return inference_response(params, mem, request.device_memory)
