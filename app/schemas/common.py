"""The strict base every schema shares, and bounded field types."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

from calculators.capacity import MAX_DP, MAX_PARAMS


class StrictModel(BaseModel):
    """Unknown fields are errors; NaN and ±Infinity are refused; no silent coercion of str."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, str_max_length=256)


Params = Annotated[StrictInt, Field(ge=1, le=MAX_PARAMS, description="Parameter count Ψ.")]
Degree = Annotated[StrictInt, Field(ge=1, le=MAX_DP)]
SmallDegree = Annotated[StrictInt, Field(ge=1, le=65536)]
DeviceBytes = Annotated[StrictInt, Field(ge=1, le=2**50, description="Bytes per device.")]

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


class Problem(BaseModel):
    """One reason a request was refused."""

    loc: list[str | int] = Field(
        description="Where: `body`, `query`, `path` or `header`, then the path to the value "
        "(keys and list indexes); empty when the request as a whole is refused."
    )
    field: str = Field(
        description="The same path written with dots, without the location (`model.preset`, "
        "`X-API-Key`); empty when the request as a whole is refused."
    )
    msg: str = Field(description="Why, in one sentence a person can act on.")
    type: str = Field(
        description="A stable name for the kind of problem: a JSON-schema failure as pydantic "
        "names it (`missing`, `extra_forbidden`, `int_type`, ...), `json_invalid`, `rule` (a "
        "well-formed request breaking a rule between values that JSON Schema cannot state, "
        "such as heads dividing hidden), `limit` (over a bound this service sets), "
        "`unsupported_media_type`, `unauthorized`, `forbidden`, `not_found`, "
        "`method_not_allowed`, `too_large`, `bad_request`, `queue_full` or `busy`."
    )


class ErrorResponse(BaseModel):
    """Every 4xx and 5xx answer of the API has this body."""

    detail: list[Problem] = Field(description="The problems found, at least one.")
