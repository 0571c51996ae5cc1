"""The calculators' POST answers and the liveness probe, straight from ASGI: the same bytes,
without FastAPI's per-request machinery.

For ``/v1/memory``, ``/v1/memory/sweep`` and ``/v1/communication`` FastAPI's request path (route
matching over every route, the dependency solver, the body's content-type parsing, the exit
stacks, the telemetry hooks) costs more CPU than the paper question's whole computation. This
layer answers those three operations itself when the request is an ordinary one: a POST with
``Content-Type: application/json``, no query string, a body that parses and validates. It parses
and validates the body in one pass (the route's body model in JSON mode: whatever it accepts,
FastAPI's ``json.loads`` then Python-mode validation accepts as the same model), calls the same
function the route calls and sends the same ``Response``; a refused answer goes through the
same handler (``app.core.errors``).

``GET /healthz`` (no query string) is answered with the route's own bytes: a probe polled every
few seconds costs what the framework's bare floor costs, not a pass through the router.

Anything else (a query parameter, another content type, a body that does not parse or validate,
a mounted ``root_path``, OpenTelemetry configured) is handed to FastAPI unchanged, the body
replayed: refusals keep their exact bodies, and the routes stay the documented operations in
the OpenAPI document. An answer that fails unexpectedly is logged and refused with the same 500
FastAPI's handler gives (``app.core.errors``). The layer sits inside every protection
(``app.core.middleware``: metrics, security headers, CORS, the concurrency limit and the body
cap), so those apply alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi.routing import APIRoute, APIRouter
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.routes import communication, health, memory, sweep
from app.core.calculations import calculate
from app.core.errors import input_error_response, unexpected_error_response
from app.schemas.communication import CommunicationRequest
from app.schemas.memory import MemoryRequest
from app.schemas.sweep import MemorySweepRequest
from calculators.errors import InputError


@dataclass(frozen=True)
class Direct:
    """One operation answered directly: its body model and the route's own answer function."""

    route: APIRoute  # what FastAPI would match (the metrics label its path template)
    body: type[BaseModel]
    answer: Callable[[Any], Response]
    # whether the answer is cheap enough for the event loop (else: the calculators' worker
    # thread, as the route)
    on_loop: Callable[[Any], bool]


@dataclass(frozen=True)
class Fixed:
    """A GET whose answer never changes: the route and its bytes, encoded once."""

    route: APIRoute
    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


def _json_content(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the request says ``Content-Type: application/json`` (parameters ignored)."""
    for name, value in headers:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


class DirectAnswers:
    """ASGI layer: ordinary POSTs to the paths in ``answers`` and GETs of the paths in ``fixed``
    answered without the router; everything else handed to ``app`` (FastAPI)."""

    def __init__(
        self,
        app: ASGIApp,
        answers: dict[str, Direct],
        fixed: dict[str, Fixed],
        telemetry: Callable[[], bool],
    ) -> None:
        self.app = app
        self.answers = answers
        self.fixed = fixed
        # whether OpenTelemetry is configured: then FastAPI answers, so its spans cover everything
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("query_string") or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if method == "GET":
            fixed = self.fixed.get(scope["path"])
            if fixed is None or self.telemetry():
                await self.app(scope, receive, send)
                return
            scope["route"] = fixed.route
            await send(
                {"type": "http.response.start", "status": fixed.status, "headers": [*fixed.headers]}
            )
            await send({"type": "http.response.body", "body": fixed.body})
            return
        direct = None
        if method == "POST" and _json_content(scope["headers"]):
            direct = self.answers.get(scope["path"])
        if direct is None or self.telemetry():
            await self.app(scope, receive, send)
            return

        messages: list[Message] = []
        chunks: list[bytes] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":  # the client went away: FastAPI decides
                await self.app(scope, _replay(messages, receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            # pydantic-core parses and validates in one pass; what it accepts, FastAPI's
            # ``json.loads`` then Python-mode validation accepts as the same model
            # (tests/api/test_direct.py); what it refuses, FastAPI refuses or answers itself
            request = direct.body.model_validate_json(
                chunks[0] if len(chunks) == 1 else b"".join(chunks)
            )
        except Exception:  # noqa: BLE001 (a refusal: FastAPI's handlers word it)
            await self.app(scope, _replay(messages, receive), send)
            return

        route = direct.route
        scope["route"], scope["endpoint"], scope["path_params"] = route, route.endpoint, {}
        response: Response
        try:
            if direct.on_loop(request):
                response = direct.answer(request)
            else:
                response = await calculate(direct.answer, request)
        except InputError as exc:
            response = input_error_response(exc)
        except Exception as exc:  # noqa: BLE001 (FastAPI's handler of the unexpected, worded alike)
            response = unexpected_error_response(method, scope["path"], exc)
        await response(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that hands out ``messages`` again first."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


def _route(router: APIRouter, path: str, method: str) -> APIRoute:
    return next(
        r
        for r in router.routes
        if isinstance(r, APIRoute) and r.path == path and method in (r.methods or ())
    )


def _fixed(route: APIRoute, response: Response) -> Fixed:
    return Fixed(route, response.status_code, tuple(response.raw_headers), bytes(response.body))


def layer(app: ASGIApp, telemetry: Callable[[], bool]) -> DirectAnswers:
    """The direct answers in front of ``app`` (FastAPI's own stack); put it inside every
    protection (``app.core.middleware.front``)."""

    def off_loop(_: Any) -> bool:
        return False

    answers = {
        path: Direct(_route(module.router, path, "POST"), body, answer, cheap)
        for path, module, body, answer, cheap in (
            ("/v1/memory", memory, MemoryRequest, memory.answer, memory.on_loop),
            ("/v1/memory/sweep", sweep, MemorySweepRequest, sweep.sweep, off_loop),
            (
                "/v1/communication",
                communication,
                CommunicationRequest,
                communication.answer,
                off_loop,
            ),
        )
    }
    # what the route returns, as FastAPI encodes a plain dict: JSONResponse
    fixed = {
        "/healthz": _fixed(
            _route(health.router, "/healthz", "GET"), JSONResponse(health.healthy())
        ),
    }
    return DirectAnswers(app, answers, fixed, telemetry)
