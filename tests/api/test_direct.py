"""The calculators' POSTs and /healthz answered straight from ASGI (``app.api.direct``) answer
exactly what FastAPI's route answers: status, headers and bytes, for ordinary bodies and for
every refusal."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.direct import DirectAnswers
from app.main import create_app
from app.schemas.communication import CommunicationRequest
from app.schemas.memory import MemoryRequest
from app.schemas.sweep import MemorySweepRequest

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
    # a repeated key: the last one counts, in JSON mode as in json.loads
    ("/v1/memory", b'{"model": {"params": 7500000000}, "dp": 8, "dp": 64}', JSON, True),
    # a byte-order mark: json.loads reads it, JSON mode does not, so FastAPI answers it
    ("/v1/memory", b'\xef\xbb\xbf{"model": {"params": 7500000000}, "dp": 64}', JSON, False),
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
    layer = _layer(app.front)
    layer.answers, layer.fixed = {}, {}
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
        layer = _layer(direct.app.front)  # type: ignore[attr-defined]
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


def test_healthz_is_the_routes_answer(clients: tuple[TestClient, TestClient, Passed]) -> None:
    direct, routed, passed = clients
    passed.paths.clear()
    got, want = direct.get("/healthz"), routed.get("/healthz")
    assert (got.status_code, got.content) == (want.status_code, want.content) == (200, want.content)
    assert _comparable(got.headers) == _comparable(want.headers)
    assert passed.paths == []
    # a query parameter is the route's to refuse, and other methods are the router's
    assert direct.get("/healthz?x=1").status_code == routed.get("/healthz?x=1").status_code == 422
    assert direct.post("/healthz").status_code == 405
    assert passed.paths == ["/healthz", "/healthz"]


def test_configured_telemetry_hands_everything_to_fastapi(
    clients: tuple[TestClient, TestClient, Passed],
) -> None:
    """With OpenTelemetry on, FastAPI's instrumentation sees every request."""
    direct, _, passed = clients
    layer = _layer(direct.app.front)  # type: ignore[attr-defined]
    passed.paths.clear()
    layer.telemetry = lambda: True
    try:
        assert direct.get("/healthz").status_code == 200
        assert direct.post("/v1/memory", json=PAPER).status_code == 200
    finally:
        layer.telemetry = direct.app.telemetry_configured  # type: ignore[attr-defined]
    assert passed.paths == ["/healthz", "/v1/memory"]


@pytest.mark.parametrize("path", ["/v1/memory", "/v1/memory/sweep"])
def test_an_unexpected_failure_is_the_handlers_500(
    clients: tuple[TestClient, TestClient, Passed], path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Paper question on the event loop, sweep on the worker thread: the same 500, logged."""
    direct, _, passed = clients
    layer = _layer(direct.app.front)  # type: ignore[attr-defined]
    kept = layer.answers[path]

    def broken(_: Any) -> Any:
        raise RuntimeError("a bug")

    layer.answers[path] = dataclasses.replace(kept, answer=broken)
    passed.paths.clear()
    try:
        got = direct.post(path, json=PAPER)
    finally:
        layer.answers[path] = kept
    assert got.status_code == 500
    assert got.json() == {
        "detail": [{"loc": [], "field": "", "msg": "internal error", "type": "internal"}]
    }
    assert got.headers["x-content-type-options"] == "nosniff"
    assert passed.paths == []
    assert any("a bug" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


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


# JSON values a body may carry where the schemas expect numbers, strings, lists and objects
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["7.5B", "80GiB", "paper", "deepspeed", "torch", "cpu", "bf16", "x"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
_whole = st.integers(0, 5000) | st.integers(0, 5000).map(float) | st.sampled_from([0.5, -1, 1e400])
_bodies = st.fixed_dictionaries(
    {
        "model": st.fixed_dictionaries(
            {"params": st.integers(1, 10**13) | st.sampled_from(["7.5B", "1e9", 7.5e9]) | _json}
        ),
        "dp": _whole | _json,
    },
    optional={
        "stages": st.lists(st.integers(0, 3) | st.sampled_from([1.0, 2.5, True]), max_size=5)
        | _json,
        "tp": _whole | _json,
        "pp": _whole | _json,
        "k": st.floats(0, 2000) | _whole | _json,
        "precision": st.sampled_from(["mixed_fp16", "bf16", "fp32"]) | _json,
        "engine": st.sampled_from(["paper", "deepspeed", "torch"]) | _json,
        "offload": st.fixed_dictionaries({}, optional={"optimizer": st.sampled_from(["cpu"])})
        | _json,
        "master_weights": st.booleans() | _json,
        "dp_values": st.lists(_whole, max_size=3) | _json,
        "device_memory": st.sampled_from(["80GiB", 8e10, 80000000000]) | _json,
    },
)


@pytest.mark.parametrize("model", [MemoryRequest, MemorySweepRequest, CommunicationRequest])
@settings(max_examples=150, deadline=None)
@given(body=_bodies, spaced=st.booleans())
def test_json_mode_accepts_only_what_fastapi_accepts_alike(
    model: type[BaseModel], body: dict[str, Any], spaced: bool
) -> None:
    """The layer validates the raw body in JSON mode; FastAPI runs ``json.loads`` and then the
    model in Python mode. Whatever the first accepts, the second accepts as the same model (a
    body the first refuses goes to FastAPI, which words the refusal or answers it)."""
    raw = json.dumps(body, separators=None if spaced else (",", ":")).encode()
    try:
        fast = model.model_validate_json(raw)
    except ValidationError:
        return
    slow = model.model_validate(json.loads(raw))
    assert fast == slow
    assert fast.model_fields_set == slow.model_fields_set


ACCEPTED = [
    b'{"model": {"params": 7.5e9}, "dp": 64.0, "stages": [3, 1.0]}',
    b'{"model": {"params": "7.5B"}, "dp": 64, "dp": 8, "k": 0.1, "precision": "bf16"}',
    b'{"model": {"params": 99999999999}, "dp": 64, "pp": 1.0, "tp": 2.0}',
    b'{"model": {"params": 7500000000}, "dp": 64, "offload": {"optimizer": "cpu"}, '
    b'"stages": [1, 2, 3], "master_weights": false}',
    b'{"model": {"preset": "llama3-8b"}, "dp": 64, "engine": "deepspeed", "engine_config": '
    b'{"zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8}, "x": [1e300, -0.0]}}',
]


# what only the memory questions take: a batch, the device's memory
MEMORY_ONLY = [
    b'{"model": {"preset": "llama3-8b"}, "dp": 8, "batch": {"micro_batch_size": 2.0, '
    b'"seq_len": 4096}, "engine": "torch", "device_memory": "80GiB"}',
]


@pytest.mark.parametrize(
    ("model", "raw"),
    [
        *(
            (m, r)
            for m in (MemoryRequest, MemorySweepRequest, CommunicationRequest)
            for r in ACCEPTED
        ),
        *((m, r) for m in (MemoryRequest, MemorySweepRequest) for r in MEMORY_ONLY),
    ],
)
def test_json_mode_reads_bodies_as_fastapi_does(model: type[BaseModel], raw: bytes) -> None:
    fast = model.model_validate_json(raw)
    slow = model.model_validate(json.loads(raw))
    assert fast == slow
    assert fast.model_fields_set == slow.model_fields_set
