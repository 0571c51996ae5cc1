"""One way to ask: in-process through the service's own ASGI app, or over HTTP to ``--url``."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from app.cli.request import CliError

DEFAULT_URL = "http://127.0.0.1:8000"
LOCAL_BASE = "http://zerocalc.local"  # in-process requests never leave this process


def remote_client(url: str, api_key: str | None = None) -> httpx.Client:
    """A client for a running service (tests swap this for a mock transport)."""
    headers = {"X-API-Key": api_key} if api_key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30.0)


async def _local(path: str, body: dict[str, Any]) -> httpx.Response:
    from app.main import app  # the service only when asked in-process: --help stays fast

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=LOCAL_BASE) as client:
        response = await client.post(path, json=body)
        await response.aread()
        return response


def post(path: str, body: dict[str, Any], url: str | None) -> dict[str, Any]:
    """POST ``body`` to ``path``: in-process through the ASGI app, or to ``url``."""
    try:
        if url is None:
            response = asyncio.run(_local(path, body))
        else:
            with remote_client(url) as client:
                response = client.post(path, json=body)
    except httpx.TransportError as e:
        raise CliError(f"cannot reach {url}: {e}") from None
    return answer(response)


def answer(response: httpx.Response) -> dict[str, Any]:
    """The JSON object of a 2xx answer; a ``CliError`` naming each refused field otherwise."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.status_code == 404 and not (
        isinstance(data, dict) and isinstance(data.get("detail"), list)
    ):
        raise CliError(f"{response.request.url.path}: this service does not offer it (404)")
    if response.status_code >= 400:
        raise CliError(_problem_text(response.status_code, data))
    if not isinstance(data, dict):
        raise CliError(f"{response.request.url.path}: answered something that is not JSON")
    return data


def _problem_text(status: int, data: Any) -> str:
    detail = data.get("detail") if isinstance(data, dict) else None
    if isinstance(detail, list):
        lines = [
            f"{d.get('field') or 'request'}: {d.get('msg', '')}"
            for d in detail
            if isinstance(d, dict)
        ]
        return f"the service refused the request ({status}):\n  " + "\n  ".join(lines)
    return f"the service answered {status}: {detail if detail is not None else data}"
