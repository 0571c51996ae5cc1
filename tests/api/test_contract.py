"""The OpenAPI document as a contract: one error body, every status documented, the model's
"exactly one of" in the schema, readable refusals for bodies that are not JSON, measure safe by
default on a network and bounded by settings."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from fastapi.testclient import TestClient

from app.api.examples import EXAMPLES
from app.main import create_app
from tests.api.fakes import fake_runner

app = create_app()
DOC = app.openapi()
SMALL_MEASURE = EXAMPLES["/v1/measure"]["mlp_all_stages"]["value"]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with fake_runner(app), TestClient(app) as c:
        yield c


def body_schema(path: str) -> dict[str, Any]:
    """The request schema of POST ``path``, with the document's components to resolve refs."""
    ref = DOC["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**ref, "components": DOC["components"]}


def valid(path: str, body: Any) -> bool:
    return jsonschema.Draft202012Validator(body_schema(path)).is_valid(body)


def test_every_error_status_of_every_operation_has_the_one_error_schema() -> None:
    for path, operations in DOC["paths"].items():
        for method, op in operations.items():
            errors = {code: r for code, r in op["responses"].items() if code >= "400"}
            assert {"400", "413", "422"} <= set(errors), (method, path)
            for code, answer in errors.items():
                schema = answer["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (path, code)
    assert "HTTPValidationError" not in DOC["components"]["schemas"]
    problem = DOC["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"loc", "field", "msg", "type"}
    measure = DOC["paths"]["/v1/measure"]["post"]["responses"]
    assert {"401", "403", "415", "429"} <= set(measure)


def test_every_post_operation_has_examples() -> None:
    posts = [p for p, ops in DOC["paths"].items() if "post" in ops]
    assert set(posts) == set(EXAMPLES)
    for path in posts:
        for name, example in EXAMPLES[path].items():
            assert valid(path, example["value"]), (path, name)


@pytest.mark.parametrize(
    "model",
    [
        {"params": 7_500_000_000},
        {
            "architecture": {
                "layers": 2,
                "hidden": 64,
                "heads": 4,
                "vocab_size": 100,
                "max_seq_len": 64,
            }
        },
        {"preset": "gpt2"},
        {"hf_config": EXAMPLES["/v1/memory"]["hf_config"]["value"]["model"]["hf_config"]},
        {"params": 7_500_000_000, "preset": None},  # null counts as not given
    ],
)
def test_the_four_model_forms_are_valid_and_accepted(client: TestClient, model: Any) -> None:
    body = {"model": model, "dp": 8}
    assert valid("/v1/memory", body)
    assert client.post("/v1/memory", json=body).status_code == 200


@pytest.mark.parametrize(
    "model",
    [{}, {"params": 1000, "preset": "gpt2"}, {"params": None}, {"preset": "no-such-model"}],
)
def test_model_not_exactly_one_is_invalid_by_the_schema_too(client: TestClient, model: Any) -> None:
    body = {"model": model, "dp": 1}
    assert not valid("/v1/memory", body)
    answer = client.post("/v1/memory", json=body)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["field"].startswith("model")


def test_json_syntax_error_says_line_and_column(client: TestClient) -> None:
    raw = b'{\n  "dp": 8,\n  "model": {"params": 42,}\n}'
    answer = client.post("/v1/memory", content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 422
    problem = answer.json()["detail"][0]
    assert problem["type"] == "json_invalid" and problem["loc"] == ["body"]
    assert "line 3 column 26" in problem["msg"], problem


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_sent_as_json_is_415_saying_so(
    client: TestClient, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    answer = client.post("/v1/memory", content=b'{"dp": 8}', headers=headers)
    assert answer.status_code == 415
    problem = answer.json()["detail"][0]
    assert problem["loc"] == ["header", "Content-Type"]
    assert "Content-Type: application/json" in problem["msg"]


def test_integral_floats_are_integers_and_booleans_are_not_numbers(client: TestClient) -> None:
    assert client.post("/v1/memory", json={"model": {"params": 1e9}, "dp": 8.0}).status_code == 200
    half = client.post("/v1/memory", json={"model": {"params": 1e9}, "dp": 8.5})
    assert half.status_code == 422 and half.json()["detail"][0]["field"] == "dp"
    k = client.post("/v1/memory", json={"model": {"params": 1e9}, "dp": 8, "k": True})
    assert k.status_code == 422 and k.json()["detail"][0]["field"] == "k"


def test_unknown_query_parameters_are_refused(client: TestClient) -> None:
    answer = client.get("/v1/presets", params={"limit": 3})
    assert answer.status_code == 422
    assert answer.json()["detail"][0] == {
        "loc": ["query", "limit"],
        "field": "limit",
        "msg": "this operation takes no such query parameter",
        "type": "extra_forbidden",
    }


async def _over(base_url: str, api_key: str | None, headers: dict[str, str]) -> httpx.Response:
    """POST the small measure example to a fresh app as reached at ``base_url``."""
    fresh = create_app()
    with fake_runner(fresh, api_key=api_key):
        async with fresh.router.lifespan_context(fresh):
            transport = httpx.ASGITransport(app=fresh)
            async with httpx.AsyncClient(transport=transport, base_url=base_url) as c:
                return await c.post("/v1/measure", json=SMALL_MEASURE, headers=headers)


@pytest.mark.parametrize(
    ("base_url", "api_key", "headers", "status"),
    [
        ("http://127.0.0.1:8000", None, {}, 202),  # loopback, no key: this host's own use
        ("http://[::1]:8000", None, {}, 202),
        ("http://10.1.2.3:8000", None, {}, 403),  # network, no key: refused, naming the setting
        ("http://10.1.2.3:8000", "k", {}, 401),
        ("http://10.1.2.3:8000", "k", {"X-API-Key": "wrong"}, 401),
        ("http://10.1.2.3:8000", "k", {"X-API-Key": "k"}, 202),
    ],
)
def test_measure_is_safe_by_default_on_a_network(
    base_url: str, api_key: str | None, headers: dict[str, str], status: int
) -> None:
    answer = asyncio.run(_over(base_url, api_key, headers))
    assert answer.status_code == status, answer.text
    if status == 403:
        assert "ZEROCALC_API_KEY" in answer.json()["detail"][0]["msg"]
    if status in (401, 403):
        assert answer.json()["detail"][0]["field"] == "X-API-Key"


@pytest.mark.parametrize(
    ("change", "setting"),
    [
        ({"dp": 16}, "ZEROCALC_MEASURE_MAX_WORLD_SIZE"),
        ({"steps": 100, "warmup_steps": 20, "dp": 2}, "ZEROCALC_MEASURE_MAX_STEPS"),
        ({"model": {"preset": "mlp-64x4096"}}, "ZEROCALC_MEASURE_MAX_PARAMS"),
    ],
)
def test_measure_jobs_are_bounded_by_settings(change: dict[str, Any], setting: str) -> None:
    fresh = create_app()
    limits = {"measure_max_world_size": 8, "measure_max_steps": 100, "measure_max_params": 10**9}
    with fake_runner(fresh, **limits), TestClient(fresh) as c:
        assert c.post("/v1/measure", json=SMALL_MEASURE).status_code == 202
        answer = c.post("/v1/measure", json={**SMALL_MEASURE, **change})
    assert answer.status_code == 422, answer.text
    problem = answer.json()["detail"][0]
    assert problem["type"] == "limit" and setting in problem["msg"]
