"""Sizes and counts at the edge: GB is 10^9 bytes, GiB is 2^30 bytes.

Reading: ``parse_count`` and ``parse_size`` turn what people type ("7.5B", "7.5e9", "80GiB",
"40GB") into exact integers; the CLI's options and the API's ``params`` and memory fields
(``ParamCount``, ``ByteCount``) read them the same way, and every response carries integers.
Writing: ``readable`` names both units.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Annotated, Any

from pydantic import PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from calculators.capacity import MAX_PARAMS

GB = 10**9
GIB = 2**30

MAX_COUNT = MAX_PARAMS
MAX_BYTES = 2**50  # 1 PiB per device: far beyond any accelerator

COUNT_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": GB,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": GIB,
    "tib": 2**40,
}

# One number: digits (``_`` may group them), an optional fraction and exponent, then a unit;
# or a whole number grouped by commas in threes with no unit ("124,439,808"). Any other comma is
# ambiguous ("7,5B": 7.5B or 75B?) and refused.
_NUMBER = r"[0-9][0-9_]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_GROUPED = r"[0-9]{1,3}(?:,[0-9]{3})+"
_READ = re.compile(rf"\s*({_NUMBER})\s*([A-Za-z]*)\s*")
# The same shapes for OpenAPI (ECMA regex, no inline flags): what a string field accepts.
COUNT_PATTERN = rf"^\s*(?:{_GROUPED}|{_NUMBER}\s*[kKmMbBgGtT]?)\s*$"
SIZE_PATTERN = rf"^\s*(?:{_GROUPED}|{_NUMBER}\s*(?:(?:[kKmMgGtT][iI]?)?[bB])?)\s*$"


class TooLarge(ValueError):
    """A number beyond the field's bound: said as "too large", never as "not an integer"."""


class NotWhole(ValueError):
    """A number that reads but is not whole once its unit applies ("9.0871 KB" is 9,087.1
    bytes): a rule the string form's pattern cannot state."""


def _number(text: str) -> tuple[Decimal, str]:
    """The number and the (lower-case) unit of ``text``; ``ValueError`` says what is wrong."""
    if re.fullmatch(rf"\s*{_GROUPED}\s*", text):
        return Decimal(text.strip().replace(",", "")), ""
    if "," in text:
        raise ValueError(
            f"{text!r}: a comma is ambiguous (decimal point or thousands separator?); "
            "write 7.5B, 7.5e9, 7_500_000_000 or 7,500,000,000"
        )
    m = _READ.fullmatch(text)
    if m is None:
        raise ValueError(f"cannot read {text!r} as a number")
    try:
        return Decimal(m.group(1).replace("_", "")), m.group(2).lower()
    except InvalidOperation:
        raise ValueError(f"cannot read {text!r} as a number") from None


def _whole(value: Decimal, factor: int, text: str, what: str, limit: int) -> int:
    # before any arithmetic: "1e999999999" must not overflow nor build a billion-digit integer
    if value.adjusted() > len(str(limit)) or value * factor > limit:
        raise TooLarge(f"{text!r} is too large: at most {limit:,} {what}")
    value *= factor
    if value != value.to_integral_value():
        raise NotWhole(f"{text!r} is not a whole number of {what}")
    return int(value)


def parse_count(text: str, limit: int = MAX_COUNT) -> int:
    """``7.5B``, ``7.5e9``, ``7_500_000_000`` and ``7500000000`` are all 7,500,000,000."""
    value, suffix = _number(text)
    if suffix not in COUNT_SUFFIXES:
        raise ValueError(f"{text!r}: unknown suffix {suffix!r} (K, M, B or T)")
    return _whole(value, COUNT_SUFFIXES[suffix], text, "parameters", limit)


def parse_size(text: str, limit: int = MAX_BYTES) -> int:
    """``80GB`` → 80·10^9, ``80GiB`` → 80·2^30, ``1234`` → 1234 bytes; whole bytes only."""
    value, unit = _number(text)
    if unit not in SIZE_UNITS:
        raise ValueError(
            f"{text!r}: unknown unit {unit!r} (B, KB, MB, GB, TB = powers of 10; "
            "KiB, MiB, GiB, TiB = powers of 2)"
        )
    return _whole(value, SIZE_UNITS[unit], text, "bytes", limit)


def _reader(parse: Any, what: str, limit: int) -> Any:
    """A pydantic validator: an integer, a whole JSON number (7.5e9) or a string ``parse`` reads."""

    def read(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise PydanticCustomError(
                "int_or_unit_string",
                "expected an integer or a string such as {example}",
                {"example": "'7.5B'" if what == "parameters" else "'80GiB' or '40GB'"},
            )
        if isinstance(value, float | int):
            if isinstance(value, float) and value != value:  # NaN: JSON's parser lets it in
                raise PydanticCustomError("finite_number", "must be a finite number")
            if value > limit:
                raise PydanticCustomError("too_large", f"too large: at most {limit:,} {what}")
            if isinstance(value, float) and not value.is_integer():
                raise PydanticCustomError("whole_number", f"not a whole number of {what}")
            n = int(value)
            if n < 1:
                raise PydanticCustomError("greater_than_equal", "must be at least 1")
            return n
        else:
            try:
                n = int(parse(value[:64], limit))
            except TooLarge as e:
                raise PydanticCustomError("too_large", str(e)) from None
            except NotWhole as e:
                # the pattern admits any fraction: whether it makes whole units is a rule
                raise PydanticCustomError("rule", str(e)) from None
            except ValueError as e:
                raise PydanticCustomError("number_or_unit_string", str(e)) from None
        if n < 1:
            # a rule the string form's pattern cannot state (the integer form says minimum 1)
            raise PydanticCustomError("rule", f"must be at least 1 {what}")
        return n

    return read


def _schema(pattern: str, limit: int, description: str, examples: list[Any]) -> dict[str, Any]:
    return {
        "anyOf": [
            {"type": "integer", "minimum": 1, "maximum": limit},
            {"type": "string", "pattern": pattern, "maxLength": 64},
        ],
        "description": description,
        "examples": examples,
    }


ParamCount = Annotated[
    int,
    PlainValidator(_reader(parse_count, "parameters", MAX_COUNT)),
    WithJsonSchema(
        _schema(
            COUNT_PATTERN,
            MAX_COUNT,
            "Parameter count Ψ: an integer, or a string such as '7.5B' or '7.5e9' "
            "(K = 10^3, M = 10^6, B = 10^9, T = 10^12).",
            [7_500_000_000, "7.5B"],
        )
    ),
]
"""Ψ in a request: ``7500000000``, ``7.5e9`` or ``"7.5B"``; an ``int`` once validated."""

ByteCount = Annotated[
    int,
    PlainValidator(_reader(parse_size, "bytes", MAX_BYTES)),
    WithJsonSchema(
        _schema(
            SIZE_PATTERN,
            MAX_BYTES,
            "Bytes: an integer, or a string such as '80GiB' (2^30) or '40GB' (10^9).",
            [80_000_000_000, "80GiB"],
        )
    ),
]
"""Bytes in a request: ``8e10``, ``"80GB"`` or ``"80GiB"``; read into an ``int``."""


@lru_cache(maxsize=4096)  # an answer's sizes repeat within it and across the same questions
def readable(n_bytes: int) -> str:
    """``31406250000`` → ``"31.41 GB (29.25 GiB)"``; both units named, never ambiguous."""
    gb, gib = n_bytes / GB, n_bytes / GIB
    if gb < 999:  # both under 1,000 (GiB < GB): no thousands separator to write
        return "%.2f GB (%.2f GiB)" % (gb, gib)  # noqa: UP031 (the faster form, same digits)
    return f"{gb:,.2f} GB ({gib:,.2f} GiB)"
