"""Plain ASGI middleware: metrics and security headers, CORS, a concurrency limit, a body cap.

Two layers that wrap ``send``/``receive`` directly (no ``BaseHTTPMiddleware``: it runs every
request through a task and a memory stream and costs more than the routes it guards), each one
function call and at most one ``send`` wrapper per request. ``front`` stacks them, outermost
first: :class:`ObserveMiddleware` (metrics and security headers, so refusals are counted and
headed) → CORS (only when origins are configured) → :class:`LimitMiddleware` (concurrency
limit, body cap) → the application. ``app.main`` puts that stack in front of FastAPI's own
(its telemetry, error handlers and router), so every request pays these once and the answers
``app.api.direct`` gives itself pay nothing of FastAPI's.
"""

from __future__ import annotations

import json
import time

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.config import Settings
from app.core.metrics import Metrics

UNROUTED = "<unrouted>"  # route label of requests no route matched or that were refused early

# Method labels kept as sent; any other token a client invents is counted as OTHER.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# Paths the concurrency limit never refuses: probes must answer while the service is busy.
UNLIMITED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

# JSON answers and everything not HTML: nothing may load, nothing may frame it (OWASP REST
# Security Cheat Sheet, "Security headers").
API_CSP = "default-src 'none'; frame-ancestors 'none'"
# The page (GET /) serves its own scripts and styles, never from a CDN.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
# Swagger UI and ReDoc are served from this origin (app/main.py) and start from an inline script;
# nothing else may load (ReDoc's footer logo from its CDN stays out, as on an offline host).
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "font-src 'self'; img-src 'self' data:; worker-src 'self' blob:; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=(), usb=()"),
)


async def send_problem(
    send: Send,
    status: int,
    kind: str,
    msg: str,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """A JSON error in the shape of ``app.core.errors`` (``{"detail": [{loc, field, ...}]}``)."""
    where = (["body"], "body") if status == 413 else ([], "")
    body = json.dumps(
        {"detail": [{"loc": where[0], "field": where[1], "msg": msg, "type": kind}]}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# Everything a JSON answer, the page and the docs pages get, built once.
_API_HEADERS = (*SECURITY_HEADERS, (b"content-security-policy", API_CSP.encode()))
_PAGE_HEADERS = (*SECURITY_HEADERS, (b"content-security-policy", PAGE_CSP.encode()))
_DOCS_HEADERS = (*SECURITY_HEADERS, (b"content-security-policy", DOCS_CSP.encode()))
_HSTS = (b"strict-transport-security", b"max-age=31536000")
_ADDED = frozenset(name for name, _ in (*_API_HEADERS, _HSTS))


def _with_security_headers(
    headers: list[tuple[bytes, bytes]], docs: bool, https: bool
) -> list[tuple[bytes, bytes]]:
    """``headers`` plus the security headers the answer does not set itself.

    The Content-Security-Policy fits the answer: the page's or the docs' for HTML, ``default-src
    'none'`` for everything else.
    """
    html = False
    own: set[bytes] | None = None
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"content-type":
            html = value.startswith(b"text/html")
        if lowered in _ADDED:
            own = {lowered} if own is None else own | {lowered}
    extra = (_DOCS_HEADERS if docs else _PAGE_HEADERS) if html else _API_HEADERS
    if https:
        extra = (*extra, _HSTS)
    if own is None:
        return [*headers, *extra]
    return [*headers, *(h for h in extra if h[0] not in own)]


class ObserveMiddleware:
    """Metrics and security headers for every answer, refusals included.

    Counts each answer by route template, method and status, with its latency, and adds to it
    nosniff, no framing, no referrer, a Content-Security-Policy fitting the answer (HSTS over
    HTTPS) and ``Server-Timing: app;dur=<ms>``: the time from the request's arrival to the start
    of its answer (body read, validation, computation and serialization).
    """

    def __init__(self, app: ASGIApp, metrics: Metrics, docs_paths: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.docs_paths = docs_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what an exception escaping the app becomes (ServerErrorMiddleware)
        docs = scope["path"] in self.docs_paths
        https = scope.get("scheme") == "https"

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = _with_security_headers(list(message.get("headers", ())), docs, https)
                elapsed_ms = (time.perf_counter() - start) * 1000
                headers.append((b"server-timing", b"app;dur=%.3f" % elapsed_ms))
                message = {**message, "headers": headers}
            await send(message)

        metrics = self.metrics
        metrics.in_flight += 1
        try:
            await self.app(scope, receive, observed_send)
        finally:
            metrics.in_flight -= 1
            route = scope.get("route")
            method = scope["method"]
            metrics.observe(
                UNROUTED if route is None else getattr(route, "path", UNROUTED),
                method if method in METHODS else "OTHER",
                status,
                time.perf_counter() - start,
            )


class LimitMiddleware:
    """At most ``limit`` requests in flight, and no body over ``max_bytes``.

    Beyond the limit: ``503`` with ``Retry-After`` (probes in ``UNLIMITED_PATHS`` are never
    refused). A ``Content-Length`` over the cap is refused with ``413`` before a byte is read
    (the server will not deliver more than it announces). A body without one
    (``Transfer-Encoding: chunked``) is read here up to the cap and handed on whole, so the
    application never sees a partial body.
    """

    def __init__(
        self, app: ASGIApp, limit: int, retry_after: int, max_bytes: int, metrics: Metrics
    ) -> None:
        self.app = app
        self.limit = limit
        self.retry_after = retry_after
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.in_flight = 0  # one event loop: a plain counter is race-free between awaits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] in UNLIMITED_PATHS:
            await self._capped(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self.metrics.reject("busy")
            await send_problem(
                send,
                503,
                "busy",
                f"the service is answering {self.limit} requests; retry after {self.retry_after} s",
                ((b"retry-after", str(self.retry_after).encode()),),
            )
            return
        self.in_flight += 1
        try:
            await self._capped(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _too_large(self, send: Send) -> None:
        self.metrics.reject("too_large")
        await send_problem(
            send,
            413,
            "too_large",
            f"the request body is larger than {self.max_bytes} bytes",
            ((b"connection", b"close"),),
        )

    async def _capped(self, scope: Scope, receive: Receive, send: Send) -> None:
        length: bytes | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
        if length is not None:
            try:
                announced = int(length)
            except ValueError:
                await send_problem(send, 400, "bad_request", "Content-Length is not a number")
                return
            if announced > self.max_bytes:
                await self._too_large(send)
                return
            await self.app(scope, receive, send)
            return
        if not chunked:
            await self.app(scope, receive, send)
            return

        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def front(
    app: ASGIApp, settings: Settings, metrics: Metrics, docs_paths: frozenset[str]
) -> ASGIApp:
    """The protections in front of ``app``, outermost first: metrics and security headers, CORS
    (only when origins are configured), the concurrency limit and the body cap."""
    inner: ASGIApp = LimitMiddleware(
        app,
        limit=settings.max_concurrent_requests,
        retry_after=settings.busy_retry_after_seconds,
        max_bytes=settings.max_body_bytes,
        metrics=metrics,
    )
    if settings.cors_origins:  # closed by default: no CORS headers unless origins are named
        inner = CORSMiddleware(
            inner,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Content-Type", "X-API-Key"],
            expose_headers=["Location", "Retry-After"],
        )
    return ObserveMiddleware(inner, metrics=metrics, docs_paths=docs_paths)
