"""POST /v1/capacity: request and response."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from app.schemas.common import Degree, DeviceBytes
from app.schemas.memory import PerDevice, TrainingIn
from app.schemas.model import BatchIn, ModelSpec


class CapacityRequest(TrainingIn):
    """The largest model per stage for a device size and Nd; with a model, the smallest Nd."""

    device_memory: DeviceBytes = Field(description="Bytes per device.")
    model: ModelSpec | None = Field(
        None,
        description="When given, answer min_dp per stage. When it has an architecture (preset, "
        "hf_config or architecture) and the engine is not paper or a batch is given, its shape "
        "is the one grown unless shape names another (the paper's model states depend on Ψ "
        "alone, so without a batch it searches Ψ).",
    )
    shape: Annotated[
        str | None,
        Field(
            max_length=64,
            description="A preset name (/v1/presets) whose shape, layers × width, is grown to "
            "the largest that fits; null grows the model's architecture (see model), or searches "
            "a bare parameter count.",
        ),
    ] = None
    batch: BatchIn | None = Field(
        None,
        description="Micro-batch; with a shape to grow it adds activations and the engine's "
        "buffers at the peak to what must fit.",
    )
    max_dp: Degree = Field(1_048_576, description="Largest Nd min_dp searches.")


class FoundModel(BaseModel):
    """The largest model that fits one stage."""

    name: str = Field(description="What was grown and to what, e.g. 'llama3-8b shape, 40 × 5120'.")
    params: int = Field(description="Ψ of the whole model.")
    params_readable: str
    architecture: dict[str, Any] | None = Field(
        description="The grown architecture (the fields /v1/memory accepts as "
        "model.architecture); null for a bare parameter count."
    )


class StageCapacity(BaseModel):
    stage: int
    max_params: int | None = Field(
        description="Ψ of the largest model that fits (total over TP×PP); null: see notes."
    )
    max_params_readable: str | None = None
    model: FoundModel | None = Field(None, description="The largest model that fits (null: notes).")
    per_device: PerDevice | None = Field(
        None, description="What the largest model takes on one device, as /v1/memory says."
    )
    needed: int | None = Field(
        None,
        description="The figure compared with device_memory for that model (peak or resident).",
    )
    min_dp: int | None = Field(None, description="Smallest Nd that fits the model (null: notes).")
    notes: list[str] = Field(default_factory=list, description="Why a figure is null, and caveats.")


class CapacityResponse(BaseModel):
    device_memory: int
    dp: int
    engine: str = Field(description="Whose accounting the search used: paper, deepspeed, torch.")
    criterion: str = Field(description="What must fit device_memory.")
    grown: str | None = Field(
        None, description="The shape grown (layers × width), or null for a bare Ψ search."
    )
    stages: list[StageCapacity]
    notes: list[str] = Field(default_factory=list)
