"""The ASGI application ``app.main:app``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.api.routes import capacity, health, memory, presets
from app.core import errors

DESCRIPTION = """
How much GPU memory and communication a ZeRO (DeepSpeed / FSDP) training run needs, per device,
before you rent the GPUs. Sizes are integers in bytes; readable strings beside them say
GB (10^9 bytes) and GiB (2^30 bytes). Every figure names the convention it follows.
"""


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    yield


def create_app() -> FastAPI:
    app = FastAPI(title="zerocalc", version="0.1.0", description=DESCRIPTION, lifespan=lifespan)
    errors.install(app)
    for module in (memory, capacity, presets, health):
        app.include_router(module.router)
    return app


app = create_app()
