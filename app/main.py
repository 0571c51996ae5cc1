"""The ASGI application ``app.main:app``."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

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
    # Everything loaded so far lives as long as the process: out of the cyclic collector's sight,
    # its full passes stop scanning ~60k objects (a 10-30 ms pause in 1 of 10 sweep answers).
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        app.state.metrics.register_job_counts(None)
        await asyncio.to_thread(jobs.stop)


def create_app() -> FastAPI:
    app = FastAPI(title="zerocalc", version="0.1.0", description=DESCRIPTION, lifespan=lifespan)
    errors.install(app)
    app.state.metrics = Metrics()
    middleware.install(app, get_settings(), app.state.metrics)
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
    return app


app = create_app()
