"""POST /v1/inference: request and response."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StrictInt

from app.schemas.common import DeviceBytes, SmallDegree, StrictModel
from app.schemas.model import ModelSpec
from calculators.inference import WeightDtype


class InferenceRequest(StrictModel):
    """Weights and KV cache of one model served on one device (or a TP/PP group)."""

    model: ModelSpec = Field(description="The model: params, architecture, preset or hf_config.")
    weights: WeightDtype = Field(WeightDtype.BF16, description="Weight storage dtype.")
    kv_cache: WeightDtype = Field(WeightDtype.BF16, description="KV cache dtype.")
    batch_size: Annotated[StrictInt, Field(ge=1, le=1_048_576)] = Field(
        1, description="Sequences decoded together."
    )
    context: Annotated[StrictInt, Field(ge=1, le=16_777_216)] = Field(
        2048, description="Tokens per sequence held in the KV cache (prompt + generated)."
    )
    tp: Annotated[SmallDegree, Field(description="Tensor-parallel degree.")] = 1
    pp: Annotated[SmallDegree, Field(description="Pipeline-parallel degree.")] = 1
    device_memory: DeviceBytes | None = Field(None, description="Bytes per device; turns on fits.")


class InferenceResponse(BaseModel):
    params: int = Field(description="Ψ of the whole model.")
    weights: int = Field(description="Weight bytes on the most loaded device.")
    kv_cache: int | None = Field(description="KV cache bytes per device (null without layers).")
    total: int | None = Field(description="weights + kv_cache.")
    readable: dict[str, str] = Field(description="The sizes as 'X GB (Y GiB)'.")
    fits: bool | None
    notes: list[str]
