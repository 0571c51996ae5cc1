"""The strict base every schema shares, and bounded field types."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

from app.core.units import ByteCount, ParamCount
from calculators.capacity import MAX_DP


class StrictModel(BaseModel):
    """Unknown fields are errors; NaN and ±Infinity are refused; no silent coercion of str."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, str_max_length=256)


Params = ParamCount
Degree = Annotated[StrictInt, Field(ge=1, le=MAX_DP)]
SmallDegree = Annotated[StrictInt, Field(ge=1, le=65536)]
DeviceBytes = ByteCount

MAX_JSON_DEPTH = 16
MAX_JSON_ITEMS = 10_000


def _check_json(value: Any, depth: int = 0, seen: list[int] | None = None) -> None:
    """Free-form JSON (a config body): finite numbers, bounded nesting and size."""
    seen = [0] if seen is None else seen
    seen[0] += 1
    if seen[0] > MAX_JSON_ITEMS:
        raise ValueError(f"more than {MAX_JSON_ITEMS} values")
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("numbers must be finite")
    children = (
        value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    )
    for child in children:
        _check_json(child, depth + 1, seen)


def _plain_json(value: dict[str, Any]) -> dict[str, Any]:
    _check_json(value)
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_plain_json)]
"""A free-form JSON object (config body): finite numbers, at most 16 levels, 10,000 values."""
