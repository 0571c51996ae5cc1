"""GET /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from app.core.metrics import CONTENT_TYPE, Metrics

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> PlainTextResponse:
    """Request counts and latencies by route, and jobs by state, in the Prometheus text format."""
    registry: Metrics = request.app.state.metrics
    return PlainTextResponse(registry.render(), media_type=CONTENT_TYPE)
