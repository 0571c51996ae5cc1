"""POST /v1/memory/sweep: one memory request answered for many data-parallel degrees."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, field_validator

from app.schemas.common import Degree
from app.schemas.memory import Convention, MemoryRequest, PerDevice

MAX_SWEEP_POINTS = 64
# Nd = 1, 2, 4, ..., 4096: the x axis of the page's memory-vs-Nd chart.
POWERS_OF_TWO = [2**i for i in range(13)]


class MemorySweepRequest(MemoryRequest):
    """A /v1/memory request and the Nd values to answer it for (``dp`` stays the reference)."""

    dp_values: Annotated[
        list[Degree],
        Field(
            min_length=1,
            max_length=MAX_SWEEP_POINTS,
            description=f"Data-parallel degrees to sweep, at most {MAX_SWEEP_POINTS}, each once.",
            json_schema_extra={"uniqueItems": True},
        ),
    ] = Field(default_factory=lambda: list(POWERS_OF_TWO))

    @field_validator("dp_values")
    @classmethod
    def unique_dp_values(cls, values: list[int]) -> list[int]:
        if len(set(values)) != len(values):
            raise ValueError("each dp value may appear once")
        return values


class StageAtDp(BaseModel):
    stage: int
    per_device: PerDevice
    fits: bool | None = Field(description="Whether peak (or resident) fits device_memory.")


class SweepPoint(BaseModel):
    dp: int
    stages: list[StageAtDp]


class MemorySweepResponse(BaseModel):
    params: int = Field(description="Ψ of the whole model.")
    params_per_device: int = Field(description="Ψ on one device after TP and PP, before ZeRO.")
    dp: int = Field(description="The request's own Nd (the reference point).")
    convention: Convention
    points: list[SweepPoint] = Field(description="Per Nd of dp_values, in their order.")
