"""One place that turns domain errors and bad requests into 4xx answers that name the field.

FastAPI's default 422 echoes the input; a NaN or Infinity in it cannot be written as JSON and
turns the 422 into a 500. These handlers never echo input.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from calculators.errors import InputError

log = logging.getLogger("zerocalc")


def _field(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def _problem(status: int, errors: list[dict[str, str]]) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": errors})


async def validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "field": _field(e.get("loc", ())),
            "msg": str(e.get("msg", "invalid value"))[:300],
            "type": str(e.get("type", "value_error")),
        }
        for e in exc.errors()[:20]
    ]
    return _problem(422, errors)


async def input_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InputError)
    return _problem(
        422, [{"field": f, "msg": exc.message, "type": "value_error"} for f in exc.fields]
    )


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _problem(500, [{"field": "", "msg": "internal error", "type": "internal"}])


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(InputError, input_error)
    app.add_exception_handler(Exception, unexpected_error)
