"""GET /healthz and GET /readyz."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.api.deps import JobsDep
from app.core.devices import visible_devices

router = APIRouter(tags=["health"])


def healthy() -> dict[str, str]:
    """What /healthz answers (``app.api.direct`` sends the same bytes without the router)."""
    return {"status": "ok"}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: answers without touching a GPU (on the event loop: no thread hop)."""
    return healthy()


@router.get("/readyz")
def readyz(jobs: JobsDep) -> dict[str, Any]:
    """Ready: the devices this host has (from nvidia-smi, no CUDA context) and the job runner."""
    runner = jobs.state()
    return {
        "status": "ready" if runner["worker"] == "running" else "degraded",
        "devices": visible_devices(),
        "jobs": runner,
    }
