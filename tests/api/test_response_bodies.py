"""The memory and communication answers are encoded once from plain JSON bodies: each must be
exactly what its documented response model would send (the same fields, order, types and
bytes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, TypeAdapter

from app.api.routes.communication import answer, communication
from app.main import app
from app.schemas.communication import CommunicationRequest, CommunicationResponse
from app.schemas.memory import MemoryResponse
from app.schemas.sweep import MemorySweepResponse
from calculators.errors import InputError
from tests.api.test_figures_unchanged import cases

TINY = {"layers": 2, "hidden": 256, "heads": 4, "vocab_size": 1000, "max_seq_len": 512}
BODIES: list[dict[str, Any]] = [
    {"model": {"params": 7_500_000_000}, "dp": 64},
    {"model": {"params": "1.3B"}, "dp": 7, "precision": "fp32", "k": 6.5, "device_memory": "8GB"},
    {
        "model": {"params": 10**9},
        "dp": 8,
        "stages": [1, 2, 3],
        "offload": {"optimizer": "cpu"},
        "engine": "deepspeed",
    },
    {
        "model": {"params": 10**9},
        "dp": 8,
        "stages": [3],
        "offload": {"optimizer": "nvme", "params": "cpu"},
        "optimizer": "adam_8bit",
        "gradients": "fp32_grads",
    },
    {
        "model": {"architecture": TINY},
        "dp": 4,
        "pp": 2,
        "engine": "paper",
        "precision": "mixed_bf16",
        "batch": {"micro_batch_size": 2, "seq_len": 512},
        "device_memory": 10**9,
    },
    {
        "model": {"architecture": TINY},
        "dp": 2,
        "engine": "deepspeed",
        "batch": {"micro_batch_size": 1, "seq_len": 256},
    },
]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def same_as_model(content: bytes, model: type[BaseModel]) -> None:
    """``content`` parses as ``model`` and ``model`` writes it back byte for byte."""
    assert model.model_validate_json(content).model_dump_json().encode() == content


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_memory_body_is_the_response_models_json(client: TestClient, body: dict[str, Any]) -> None:
    r = client.post("/v1/memory", json=body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    same_as_model(r.content, MemoryResponse)


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_sweep_body_is_the_response_models_json(client: TestClient, body: dict[str, Any]) -> None:
    r = client.post(
        "/v1/memory/sweep", json={**body, "dp_values": sorted({1, 3, body["dp"], 4096})}
    )
    assert r.status_code == 200, r.text
    same_as_model(r.content, MemorySweepResponse)
    points = r.json()["points"]
    # the request's own Nd reuses the reference estimate: it must equal /v1/memory's answer
    at_dp = next(p for p in points if p["dp"] == body["dp"])
    alone = client.post("/v1/memory", json=body).json()
    assert [s["per_device"] for s in at_dp["stages"]] == [s["per_device"] for s in alone["stages"]]


def test_responses_keep_their_documented_schemas(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path, name in (
        ("/v1/memory", "MemoryResponse"),
        ("/v1/memory/sweep", "MemorySweepResponse"),
        ("/v1/communication", "CommunicationResponse"),
    ):
        schema = paths[path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{name}"}


_COMMUNICATION = {k: b for k, b in cases().items() if k.startswith("comm/")}


@pytest.mark.parametrize("key", sorted(_COMMUNICATION))
def test_communication_body_is_the_response_models_json(key: str) -> None:
    """Every communication case of the figures grid (engines, topologies, ZeRO++, offload,
    DeepSpeed knobs): the answer's bytes are those FastAPI writes for the route's model."""
    request = CommunicationRequest(**_COMMUNICATION[key])
    try:
        model = communication(request)
    except InputError:
        with pytest.raises(InputError):
            answer(request)
        return
    expected = TypeAdapter(CommunicationResponse).dump_json(model, by_alias=True)
    assert bytes(answer(request).body) == expected
