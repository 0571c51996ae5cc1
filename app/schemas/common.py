"""The strict base every schema shares, and bounded field types."""

from __future__ import annotations

import math
from functools import cache
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, model_validator

from app.core.units import ByteCount, ParamCount
from calculators.capacity import MAX_DP


class NotANumber:
    """Stands in for a JSON value a number field must refuse (``true``, ``"1.5"``)."""

    def __repr__(self) -> str:
        return "not a number"


def _unwrap(tp: Any) -> Any:
    """``Annotated[X, ...]`` and ``X | None`` → ``X``."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _number_kind(tp: Any) -> str | None:
    """``int``, ``float``, ``list_int`` or ``None`` for a field's annotation."""
    tp = _unwrap(tp)
    if tp is int:
        return "int"
    if tp is float:
        return "float"
    if get_origin(tp) is list and _unwrap(get_args(tp)[0]) is int:
        return "list_int"
    return None


def _json_int(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


@cache
def _number_fields(model: type[BaseModel]) -> tuple[tuple[str, str], ...]:
    """``(key in the body, number kind)`` of each number field of ``model``, worked out once
    per class rather than on every validation."""
    fields = (
        (field.alias or name, _number_kind(field.annotation))
        for name, field in model.model_fields.items()
    )
    return tuple((key, kind) for key, kind in fields if kind is not None)


class StrictModel(BaseModel):
    """Unknown fields are errors; NaN and ±Infinity are refused; no silent coercion of str.

    Numbers follow JSON Schema, which the OpenAPI document speaks: an ``integer`` is any number
    without a fraction, so ``8.0`` is 8 (and ``8.5`` is refused); a ``number`` is never a
    boolean or a string.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, str_max_length=256)

    @model_validator(mode="before")
    @classmethod
    def _json_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for key, kind in _number_fields(cls):
            if key not in out:
                continue
            value = out[key]
            if kind == "int":
                out[key] = _json_int(value)
            elif kind == "list_int" and isinstance(value, list):
                out[key] = [_json_int(v) for v in value]
            elif kind == "float" and isinstance(value, bool | str):
                out[key] = NotANumber()
        return out


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
