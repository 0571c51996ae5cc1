"""The middleware: body cap (announced and chunked), concurrency limit, security headers, CORS."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.config import get_settings
from app.core.metrics import Metrics
from app.core.middleware import API_CSP, DOCS_CSP, ConcurrencyLimitMiddleware
from app.main import create_app

BODY = {"model": {"params": 7_500_000_000}, "dp": 64}


@pytest.fixture
def make_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A client on a fresh app built under the given ZEROCALC_* settings."""
    opened: list[TestClient] = []

    def make(**env: str) -> TestClient:
        for name, value in env.items():
            monkeypatch.setenv(f"ZEROCALC_{name.upper()}", value)
        get_settings.cache_clear()
        client = TestClient(create_app()).__enter__()
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)
    get_settings.cache_clear()


def chunks(data: bytes, size: int = 65536) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_announced_body_over_the_cap_is_413(make_client: Any) -> None:
    client = make_client(max_body_bytes="1000")
    response = client.post(
        "/v1/memory", content=b" " * 1001, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["detail"][0] == {
        "loc": ["body"],
        "field": "body",
        "msg": "the request body is larger than 1000 bytes",
        "type": "too_large",
    }


def test_chunked_body_over_the_cap_is_413(make_client: Any) -> None:
    client = make_client(max_body_bytes="1000")
    body = json.dumps({**BODY, "pad": "x" * 5000}).encode()
    response = client.post(
        "/v1/memory", content=chunks(body, 100), headers={"content-type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert response.json()["detail"][0]["type"] == "too_large"


def test_chunked_body_under_the_cap_is_answered(make_client: Any) -> None:
    client = make_client(max_body_bytes="1000")
    response = client.post(
        "/v1/memory",
        content=chunks(json.dumps(BODY).encode(), 7),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 200
    assert response.json()["stages"][0]["per_device"]["model_states"] == 120_000_000_000


def test_default_cap_refuses_five_megabytes(make_client: Any) -> None:
    client = make_client()
    response = client.post(
        "/v1/memory",
        content=b"[" + b"1," * 2_500_000 + b"1]",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 413
    assert client.get("/healthz").status_code == 200


def test_concurrency_limit_answers_503_with_retry_after() -> None:
    """Two requests held in flight by a slow app: the third is refused, probes are not."""
    release = asyncio.Event()

    async def slow_app(scope: Any, receive: Any, send: Any) -> None:  # noqa: ARG001
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    metrics = Metrics()
    limited = ConcurrencyLimitMiddleware(slow_app, limit=2, retry_after=3, metrics=metrics)

    async def call(path: str) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": path, "headers": []}
        await limited(scope, receive, send)
        return sent

    async def scenario() -> tuple[list[Any], list[Any], list[Any]]:
        held = [asyncio.create_task(call("/v1/memory")) for _ in range(2)]
        await asyncio.sleep(0.01)
        refused = await call("/v1/memory")
        probe = asyncio.create_task(call("/healthz"))  # exempt: waits like the held ones
        await asyncio.sleep(0.01)
        assert not probe.done()
        release.set()
        done = await asyncio.gather(*held, probe)
        return refused, done, await call("/v1/memory")

    refused, done, after = asyncio.run(scenario())
    assert refused[0]["status"] == 503
    assert (b"retry-after", b"3") in refused[0]["headers"]
    assert json.loads(refused[1]["body"])["detail"][0]["type"] == "busy"
    assert [d[0]["status"] for d in done] == [200, 200, 200]
    assert after[0]["status"] == 200  # the slots were given back
    assert metrics.rejected == {"busy": 1}


def test_concurrency_limit_comes_from_settings(make_client: Any) -> None:
    client = make_client(max_concurrent_requests="3", busy_retry_after_seconds="5")
    stack = client.app.middleware_stack  # type: ignore[attr-defined]
    while not isinstance(stack, ConcurrencyLimitMiddleware):
        stack = stack.app
    assert (stack.limit, stack.retry_after) == (3, 5)


def test_security_headers_on_json_and_docs(make_client: Any) -> None:
    client = make_client()
    api = client.post("/v1/memory", json=BODY)
    assert api.headers["x-content-type-options"] == "nosniff"
    assert api.headers["x-frame-options"] == "DENY"
    assert api.headers["referrer-policy"] == "no-referrer"
    assert api.headers["content-security-policy"] == API_CSP
    assert "strict-transport-security" not in api.headers  # plain HTTP: HSTS would mean nothing
    docs = client.get("/docs")
    assert docs.headers["content-security-policy"] == DOCS_CSP
    refused = client.post("/v1/memory", content=b"x" * 2_000_000)
    assert refused.headers["x-content-type-options"] == "nosniff"


def test_page_gets_the_page_policy(make_client: Any) -> None:
    client = make_client()
    page = client.get("/")
    if page.status_code == 404 or not page.headers["content-type"].startswith("text/html"):
        pytest.skip("no page at / yet")
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "http" not in policy  # nothing from outside the service


def test_cors_is_closed_by_default(make_client: Any) -> None:
    client = make_client()
    preflight = client.options(
        "/v1/memory",
        headers={
            "origin": "https://evil.example",
            "access-control-request-method": "POST",
        },
    )
    assert "access-control-allow-origin" not in preflight.headers
    simple = client.post("/v1/memory", json=BODY, headers={"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in simple.headers


def test_cors_allows_only_configured_origins(make_client: Any) -> None:
    client = make_client(cors_origins='["https://ok.example"]')
    ok = client.options(
        "/v1/memory",
        headers={
            "origin": "https://ok.example",
            "access-control-request-method": "POST",
        },
    )
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == "https://ok.example"
    other = client.options(
        "/v1/memory",
        headers={
            "origin": "https://evil.example",
            "access-control-request-method": "POST",
        },
    )
    assert other.status_code == 400
    assert "access-control-allow-origin" not in other.headers
