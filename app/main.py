"""The ASGI application ``app.main:app``."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api import direct, openapi
from app.api.convert import preload_trace
from app.api.deps import reject_unknown_query
from app.api.routes import (
    capacity,
    communication,
    health,
    inference,
    measure,
    memory,
    metrics,
    plan,
    presets,
    sweep,
    web,
)
from app.core import errors, middleware
from app.core.config import get_settings
from app.core.metrics import Metrics
from app.jobs.runner import JobManager
from app.jobs.store import JobStore

DESCRIPTION = """
How much GPU memory and communication a ZeRO (DeepSpeed / FSDP) training run needs, per device,
before you rent the GPUs. Sizes are integers in bytes; readable strings beside them say
GB (10^9 bytes) and GiB (2^30 bytes). Every figure names the convention it follows.
"""


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # the settings a test put in dependency_overrides, so its jobs go to its own data_dir
    settings = app.dependency_overrides.get(get_settings, get_settings)()
    jobs = JobManager(JobStore(settings.db_path), settings.queue_size)
    jobs.start()
    app.state.jobs = jobs
    app.state.metrics.register_job_counts(jobs.counts)
    if settings.preload_trace:
        # before gc.freeze, so torch's and transformers' objects are frozen with the rest
        await asyncio.to_thread(preload_trace)
    # Everything loaded so far lives as long as the process: out of the cyclic collector's sight,
    # its full passes stop scanning ~60k objects (a 10-30 ms pause in 1 of 10 sweep answers).
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        app.state.metrics.register_job_counts(None)
        await asyncio.to_thread(jobs.stop)


# Swagger UI and ReDoc are served from this service, never from a CDN, so /docs works on a GPU
# node without internet. The files come from the fastapi-offline package (MIT; it ships the
# swagger-ui-dist and ReDoc bundles with their licences and follows their releases), installed
# like any dependency: nothing vendored in this tree, and the Docker image carries them too.
DOCS_ASSETS = "/docs-assets"
DOCS_ASSETS_DIR = str(files("fastapi_offline") / "static")
FAVICON = "/web/favicon.svg"
SWAGGER_PARAMETERS = {
    "validatorUrl": None,  # no badge fetched from validator.swagger.io
    "tryItOutEnabled": True,
    "displayRequestDuration": True,
}


def add_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc, with their scripts, styles and icon from this origin."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=DOCS_ASSETS_DIR), name="docs-assets")
    oauth2_redirect = "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{oauth2_redirect}",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{FAVICON}",
            swagger_ui_parameters=SWAGGER_PARAMETERS,
        )

    @app.get(oauth2_redirect, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{FAVICON}",
            with_google_fonts=False,
        )

    # the middleware gives these pages the CSP that lets their start-up script run
    app.docs_url, app.redoc_url = "/docs", "/redoc"
    app.swagger_ui_oauth2_redirect_url = oauth2_redirect


TELEMETRY_RECHECK_S = 1.0


class Service(FastAPI):
    """FastAPI behind its protections: every HTTP request enters through ``front``
    (``app.core.middleware``: metrics, security headers, CORS, the concurrency limit and the
    body cap, then ``app.api.direct``), which hands what it does not answer itself to
    :meth:`routed`, FastAPI's own request path (telemetry, error handlers, router)."""

    front: ASGIApp | None = None
    # FastAPI asks the OpenTelemetry providers on every request (~4 µs); a provider, once
    # configured, stays so: asked again at most once a second until one is
    _telemetry_on = False
    _telemetry_asked = -float("inf")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is not None and scope["type"] == "http":
            await self.front(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def routed(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)

    def telemetry_configured(self) -> bool:
        """Whether FastAPI's OpenTelemetry instrumentation is on (a provider is configured;
        one configured while the service runs is seen within a second)."""
        if self._telemetry_on:
            return True
        now = time.monotonic()
        if now - self._telemetry_asked >= TELEMETRY_RECHECK_S:
            self._telemetry_asked = now
            self._telemetry_on = bool(self._native_telemetry.enabled())
        return self._telemetry_on


def create_app() -> Service:
    app = Service(
        title="zerocalc",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        dependencies=[Depends(reject_unknown_query)],
    )
    errors.install(app)
    openapi.install(app)
    add_docs(app)
    routers = (
        memory,
        sweep,
        capacity,
        communication,
        inference,
        plan,
        presets,
        measure,
        health,
        metrics,
        web,
    )
    for module in routers:
        app.include_router(module.router)
    app.state.metrics = Metrics()
    docs = frozenset(
        p for p in (app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url) if p
    )
    # the direct answers innermost: inside every protection
    answers = direct.layer(app.routed, app.telemetry_configured)
    app.front = middleware.front(answers, get_settings(), app.state.metrics, docs)
    return app


app = create_app()
