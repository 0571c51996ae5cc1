"""The strict base every schema shares, and bounded field types."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from calculators.capacity import MAX_DP, MAX_PARAMS


class StrictModel(BaseModel):
    """Unknown fields are errors; NaN and ±Infinity are refused; no silent coercion of str."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, str_max_length=256)


Params = Annotated[int, Field(ge=1, le=MAX_PARAMS, description="Parameter count Ψ.")]
Degree = Annotated[int, Field(ge=1, le=MAX_DP)]
SmallDegree = Annotated[int, Field(ge=1, le=65536)]
DeviceBytes = Annotated[int, Field(ge=1, le=2**50, description="Bytes per device.")]
