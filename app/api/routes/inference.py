"""POST /v1/inference."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from app.api.convert import resolve_model
from app.core.units import readable
from app.schemas.inference import InferenceRequest, InferenceResponse
from calculators.inference import InferenceSetup, inference_memory

router = APIRouter(prefix="/v1", tags=["memory"])

EXAMPLES: dict[str, dict[str, Any]] = {
    "llama2_7b_4k": {
        "summary": "Llama 2 7B in bf16, one 4096-token sequence",
        "value": {"model": {"preset": "llama2-7b"}, "context": 4096},
    },
    "seed_004_10b": {
        "summary": "Seed 004's 10B model: weights alone in fp16",
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
    sizes = {"weights": mem.weights, "kv_cache": mem.kv_cache, "total": mem.total}
    notes = ["decode-step activations are transient and not counted"]
    if mem.kv_cache is None:
        notes.append("give an architecture, preset or hf_config for the KV cache")
    needed = mem.total if mem.total is not None else mem.weights
    return InferenceResponse(
        params=params,
        weights=mem.weights,
        kv_cache=mem.kv_cache,
        total=mem.total,
        readable={k: readable(v) for k, v in sizes.items() if v is not None},
        fits=None if request.device_memory is None else needed <= request.device_memory,
        notes=notes,
    )
