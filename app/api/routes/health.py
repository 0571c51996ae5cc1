"""GET /healthz and GET /readyz."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Alive: answers without touching a GPU."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz() -> dict[str, Any]:
    """Ready: the devices the measure runner sees."""
    from app.core.devices import visible_devices

    return {"status": "ready", "devices": visible_devices()}
