"""POST /v1/capacity: request and response."""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.schemas.common import Degree, DeviceBytes
from app.schemas.memory import TrainingIn
from app.schemas.model import ModelSpec


class CapacityRequest(TrainingIn):
    """The largest model per stage for a device size and Nd; with a model, the smallest Nd."""

    device_memory: DeviceBytes = Field(description="Bytes per device.")
    model: ModelSpec | None = Field(None, description="When given, answer min_dp per stage.")
    max_dp: Degree = Field(1_048_576, description="Largest Nd min_dp searches.")


class StageCapacity(BaseModel):
    stage: int
    max_params: int | None = Field(
        description="Largest Ψ whose model states fit (total over TP×PP)."
    )
    max_params_readable: str | None = None
    min_dp: int | None = Field(None, description="Smallest Nd that fits the model (null: none).")


class CapacityResponse(BaseModel):
    device_memory: int
    dp: int
    criterion: str
    stages: list[StageCapacity]
