"""The framework's floor: a bare FastAPI app with one async endpoint and no middleware.

``bench/http_bench.py`` serves it beside ``app.main:app`` (same uvicorn options, one worker
each) and reports every endpoint of the service as a ratio of this one's rate in the same round.
"""

from __future__ import annotations

from fastapi import FastAPI

app = FastAPI()


@app.get("/")
async def root() -> dict[str, str]:
    return {"status": "ok"}
