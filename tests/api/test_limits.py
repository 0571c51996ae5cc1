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
from app.core.middleware import API_CSP, DOCS_CSP, LimitMiddleware, ObserveMiddleware
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
    limited = LimitMiddleware(slow_app, limit=2, retry_after=3, max_bytes=1000, metrics=metrics)

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
    stack = client.app.front  # type: ignore[attr-defined]
    while not isinstance(stack, LimitMiddleware):
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
    probe = client.get("/healthz")  # answered without the router, headed all the same
    assert probe.headers["x-content-type-options"] == "nosniff"
    assert probe.headers["content-security-policy"] == API_CSP
    assert probe.headers["server-timing"].startswith("app;dur=")


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


def _call(app: Any, scope: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one request through a bare ASGI app; what it sent."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "http", "method": "GET", "headers": [], **scope}, receive, send))
    return sent


def test_an_answers_own_security_headers_are_kept() -> None:
    """A route that sets a header keeps its value; the rest are added once each."""

    async def framed(scope: Any, receive: Any, send: Any) -> None:  # noqa: ARG001
        headers = [(b"content-type", b"text/plain"), (b"X-Frame-Options", b"SAMEORIGIN")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    observed = ObserveMiddleware(framed, metrics=Metrics(), docs_paths=frozenset())
    headers = _call(observed, {"path": "/x", "scheme": "https"})[0]["headers"]
    names = [name.lower() for name, _ in headers]
    assert (b"X-Frame-Options", b"SAMEORIGIN") in headers
    assert names.count(b"x-frame-options") == 1
    assert len(names) == len(set(names))
    assert (b"content-security-policy", API_CSP.encode()) in headers
    assert (b"strict-transport-security", b"max-age=31536000") in headers  # HTTPS only
    assert any(name == b"server-timing" for name in names)


def test_refusals_are_counted_and_carry_the_headers(make_client: Any) -> None:
    client = make_client(max_body_bytes="1000")
    refused = client.post("/v1/memory", content=b" " * 1001)
    assert refused.status_code == 413
    assert refused.headers["content-security-policy"] == API_CSP
    assert refused.headers["server-timing"].startswith("app;dur=")
    text = client.get("/metrics").text
    assert 'zerocalc_http_requests_total{route="<unrouted>",method="POST",status="413"} 1' in text
    assert 'zerocalc_http_requests_rejected_total{reason="too_large"} 1' in text


def test_probe_bodies_are_capped_too() -> None:
    """Probes skip the concurrency limit, never the body cap."""

    async def ok(scope: Any, receive: Any, send: Any) -> None:  # noqa: ARG001
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limited = LimitMiddleware(ok, limit=1, retry_after=1, max_bytes=10, metrics=Metrics())
    sent = _call(limited, {"path": "/healthz", "headers": [(b"content-length", b"11")]})
    assert sent[0]["status"] == 413


def test_healthz_answers_while_the_thread_pool_is_full(make_client: Any) -> None:
    """Liveness never waits for a thread: every worker thread held, /healthz still answers."""
    import anyio
    import httpx

    app = make_client().app

    async def scenario() -> int:
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = 1
        held = anyio.Event()
        release = anyio.Event()

        def hold() -> None:
            anyio.from_thread.run_sync(held.set)
            anyio.from_thread.run(release.wait)

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, hold)
            await held.wait()
            assert limiter.borrowed_tokens == 1
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                with anyio.fail_after(10):  # a liveness bound, not a timing
                    status = (await client.get("/healthz")).status_code
            release.set()
        return status

    assert anyio.run(scenario) == 200
