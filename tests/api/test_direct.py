"""The calculators' POSTs answered straight from ASGI (``app.api.direct``) answer exactly what
FastAPI's route answers: status, headers and bytes, for ordinary bodies and for every refusal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.direct import DirectAnswers
from app.main import create_app

PAPER = {"model": {"params": 7_500_000_000}, "dp": 64}
HEAVY = {
    "model": {"preset": "llama3-8b"},
    "dp": 64,
    "engine": "deepspeed",
    "batch": {"micro_batch_size": 2, "seq_len": 4096},
}
JSON = {"content-type": "application/json"}

# (path, body bytes, headers, whether the layer answers it itself)
CASES: list[tuple[str, bytes, dict[str, str], bool]] = [
    ("/v1/memory", b'{"model": {"params": 7500000000}, "dp": 64}', JSON, True),
    ("/v1/memory", b'{"model": {"preset": "llama3-8b"}, "dp": 8.0, "engine": "torch"}', JSON, True),
    (
        "/v1/memory",
        b'{"model": {"preset": "llama3-8b"}, "dp": 64, "engine": "deepspeed", '
        b'"batch": {"micro_batch_size": 2, "seq_len": 4096}, "device_memory": 80000000000}',
        {"content-type": "Application/JSON; charset=utf-8"},
        True,
    ),
    ("/v1/memory/sweep", b'{"model": {"params": 7500000000}, "dp": 64}', JSON, True),
    ("/v1/communication", b'{"model": {"preset": "llama3-8b"}, "dp": 64}', JSON, True),
    (
        "/v1/communication",
        b'{"model": {"preset": "llama3-8b"}, "dp": 64, "engine": "deepspeed"}',
        JSON,
        True,
    ),
    # a rule between values the schema cannot state: the domain error's 422
    (
        "/v1/memory",
        b'{"model": {"params": 1000}, "dp": 8, "stages": [0], "offload": {"optimizer": "cpu"}}',
        JSON,
        True,
    ),
    # refusals FastAPI words: the body replayed to it
    ("/v1/memory", b'{"model": {"params": 7500000000}, "dp": 64', JSON, False),
    ("/v1/memory", b'{"model": {"params": 7500000000}}', JSON, False),
    ("/v1/memory", b'{"model": {"params": 7500000000}, "dp": 64, "color": 1}', JSON, False),
    ("/v1/memory", b'{"model": {"params": NaN}, "dp": 64}', JSON, False),
    ("/v1/memory", b'{"model": {"params": 7500000000}, "dp": true}', JSON, False),
    ("/v1/memory", b"", JSON, False),
    ("/v1/memory", b"[]", JSON, False),
    ("/v1/memory", b'{"model": {"params": 7500000000}, "dp": 64}', {}, False),
    (
        "/v1/memory",
        b'{"model": {"params": 7500000000}, "dp": 64}',
        {"content-type": "text/plain"},
        False,
    ),
    (
        "/v1/memory",
        b'{"model": {"params": 7500000000}, "dp": 64}',
        {"content-type": "application/problem+json"},
        False,
    ),
    ("/v1/memory/sweep", b'{"model": {"params": 1}, "dp": 1, "dp_values": [0]}', JSON, False),
    ("/v1/communication", b'{"model": {"preset": "no-such"}, "dp": 64}', JSON, True),
]


def _without_direct() -> FastAPI:
    app = create_app()
    app.user_middleware = [m for m in app.user_middleware if m.cls is not DirectAnswers]
    return app


class Passed:
    """Records whether the layer handed a request on to FastAPI."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.paths: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        await self.app(scope, receive, send)


def _layer(app: Any) -> DirectAnswers:
    while not isinstance(app, DirectAnswers):
        app = app.app
    return app


@pytest.fixture(scope="module")
def clients() -> Iterator[tuple[TestClient, TestClient, Passed]]:
    with TestClient(create_app()) as direct, TestClient(_without_direct()) as routed:
        layer = _layer(direct.app.middleware_stack)  # type: ignore[attr-defined]
        passed = Passed(layer.app)
        layer.app = passed
        yield direct, routed, passed


def _comparable(headers: Any) -> list[tuple[str, str]]:
    return sorted((k, v) for k, v in headers.items() if k != "server-timing")


@pytest.mark.parametrize(("path", "body", "headers", "answered_directly"), CASES)
def test_same_answer_as_the_route(
    clients: tuple[TestClient, TestClient, Passed],
    path: str,
    body: bytes,
    headers: dict[str, str],
    answered_directly: bool,
) -> None:
    direct, routed, passed = clients
    passed.paths.clear()
    got = direct.post(path, content=body, headers=headers)
    want = routed.post(path, content=body, headers=headers)
    assert (got.status_code, got.content) == (want.status_code, want.content)
    assert _comparable(got.headers) == _comparable(want.headers)
    assert passed.paths == ([] if answered_directly else [path])


def test_query_parameters_and_chunked_bodies_reach_the_route(
    clients: tuple[TestClient, TestClient, Passed],
) -> None:
    direct, routed, passed = clients
    passed.paths.clear()
    got = direct.post("/v1/memory?dp=8", json=PAPER)
    assert got.status_code == 422
    assert got.json() == routed.post("/v1/memory?dp=8", json=PAPER).json()
    chunked = direct.post(
        "/v1/memory", content=iter([b'{"model": {"params": 75', b'}, "dp": 8}']), headers=JSON
    )
    assert chunked.status_code == 200
    assert (
        chunked.content
        == routed.post("/v1/memory", json={"model": {"params": 75}, "dp": 8}).content
    )
    assert passed.paths == ["/v1/memory"]  # the query; the chunked body is read, then answered


def test_metrics_count_direct_answers_under_the_route(
    clients: tuple[TestClient, TestClient, Passed],
) -> None:
    direct, _, passed = clients
    passed.paths.clear()
    assert direct.post("/v1/memory", json=HEAVY).status_code == 200
    assert passed.paths == []
    text = direct.get("/metrics").text
    assert 'route="/v1/memory"' in text
    assert 'route="<unrouted>",method="POST"' not in text
