"""One place that turns domain errors and bad requests into 4xx answers that name the field.

Every error body has one shape, ``app.schemas.common.ErrorResponse``:
``{"detail": [{"loc": [...], "field": "...", "msg": "...", "type": "..."}]}``. ``loc`` is
FastAPI's own (``["body", "model", "preset"]``); ``field`` is the same path with dots and without
the location (what the web page and the CLI show). The OpenAPI document names this schema for
every error status (``app.api.openapi``), so a generated client parses every refusal.

FastAPI's default 422 echoes the input; a NaN or Infinity in it cannot be written as JSON and
turns the 422 into a 500. These handlers never echo input.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from email.message import Message
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from calculators.errors import InputError

log = logging.getLogger("zerocalc")

LOCATIONS = ("body", "query", "path", "header", "cookie")
MAX_PROBLEMS = 20
JSON_HINT = "send the body as JSON with the header Content-Type: application/json"

# The `type` of a refusal without a more precise one, by status.
STATUS_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "rule",
    429: "queue_full",
    503: "busy",
}


class LimitError(InputError):
    """A request over a bound this service sets (``ZEROCALC_MAX_*``), not a wrong value."""


def field_of(loc: Sequence[Any]) -> str:
    """``["body", "model", "preset"]`` → ``"model.preset"``; ``["body"]`` → ``"body"``."""
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] in LOCATIONS:
        parts = parts[1:]
    return ".".join(parts)


def loc_of(field: str, where: str = "body") -> list[str | int]:
    """``"model.architecture.heads"`` → ``["body", "model", "architecture", "heads"]``."""
    if not field:
        return []
    if field == "body":
        return ["body"]
    return [where, *(int(p) if p.isdigit() else p for p in field.split("."))]


def problem(loc: Sequence[Any], msg: str, kind: str) -> dict[str, Any]:
    """One entry of ``detail``."""
    clean: list[str | int] = [p if isinstance(p, int) else str(p) for p in loc]
    return {"loc": clean, "field": field_of(clean), "msg": msg[:300], "type": kind}


def error_response(
    status: int, problems: list[dict[str, Any]], headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": problems}, headers=headers)


def is_json(content_type: str | None) -> bool:
    """``application/json`` or ``application/<anything>+json``, parameters ignored."""
    if not content_type:
        return False
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def json_position(doc: Any, pos: int) -> str:
    """``line L column C`` of character ``pos`` in the request body."""
    text = doc.decode("utf-8", "replace") if isinstance(doc, bytes) else str(doc)
    pos = max(0, min(pos, len(text)))
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line} column {column}"


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    raw = list(exc.errors())
    body_refused = any(tuple(e.get("loc", ())) == ("body",) for e in raw)
    if body_refused and request.method in ("POST", "PUT", "PATCH"):
        content_type = request.headers.get("content-type")
        if not is_json(content_type):
            given = f"Content-Type is {content_type!r}" if content_type else "no Content-Type"
            refusal = problem(
                ["header", "Content-Type"], f"{given}: {JSON_HINT}", "unsupported_media_type"
            )
            return error_response(415, [refusal])
    problems = []
    for e in raw[:MAX_PROBLEMS]:
        loc = tuple(e.get("loc", ()))
        kind = str(e.get("type", "value_error"))
        if kind == "json_invalid":
            pos = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else 0
            reason = str((e.get("ctx") or {}).get("error", "invalid JSON"))
            where = json_position(exc.body, pos)
            problems.append(problem(["body"], f"invalid JSON at {where}: {reason}", kind))
            continue
        msg = str(e.get("msg", "invalid value"))
        if kind == "missing" and loc == ("body",):
            msg = f"the request needs a JSON body: {JSON_HINT}"
        problems.append(problem(loc, msg, kind))
    return error_response(422, problems)


def input_error_response(exc: InputError) -> JSONResponse:
    """The 422 of a domain error: each field it names, with its message."""
    kind = "limit" if isinstance(exc, LimitError) else "rule"
    return error_response(422, [problem(loc_of(f), exc.message, kind) for f in exc.fields])


async def input_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InputError)
    return input_error_response(exc)


def _problems_of(status: int, detail: Any) -> list[dict[str, Any]]:
    """An ``HTTPException``'s detail (a string, or a list of ``{field, msg, type}``) in shape."""
    kind = STATUS_TYPES.get(status, "error")
    where = {401: "header", 403: "header", 404: "path"}.get(status, "body")
    if not isinstance(detail, list):
        return [problem([], str(detail), kind)]
    out = []
    for item in detail[:MAX_PROBLEMS]:
        if not isinstance(item, dict):
            out.append(problem([], str(item), kind))
            continue
        loc = item.get("loc")
        if loc is None:
            loc = loc_of(str(item.get("field", "")), where)
        out.append(problem(loc, str(item.get("msg", "")), str(item.get("type", kind))))
    return out


def allowed_methods(request: Request, fallback: str) -> str:
    """The documented methods at this path (Starlette's 405 names only the first route's)."""
    for path, operations in request.app.openapi().get("paths", {}).items():
        if compile_path(path)[0].match(request.url.path):
            return ", ".join(sorted(m.upper() for m in operations))
    return fallback


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = allowed_methods(request, headers.get("Allow", ""))
        detail = f"{request.method} is not served here; use {headers['Allow']}"
        return error_response(405, [problem([], detail, "method_not_allowed")], headers)
    return error_response(exc.status_code, _problems_of(exc.status_code, exc.detail), headers)


def unexpected_error_response(method: str, path: str, exc: Exception) -> JSONResponse:
    """The 500 of an error no handler expected, logged with its traceback (never echoed)."""
    log.exception("unhandled error on %s %s", method, path, exc_info=exc)
    return error_response(500, [problem([], "internal error", "internal")])


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    return unexpected_error_response(request.method, request.url.path, exc)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(InputError, input_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)
