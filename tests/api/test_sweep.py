"""POST /v1/memory/sweep: each point equals /v1/memory at that Nd; bounded and strict."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.main import app
from app.schemas.sweep import MAX_SWEEP_POINTS, POWERS_OF_TWO

PAPER = {"model": {"params": 7_500_000_000}, "dp": 64}
WITH_BATCH = {
    "model": {
        "architecture": {
            "layers": 4,
            "hidden": 512,
            "heads": 8,
            "vocab_size": 32000,
            "max_seq_len": 1024,
        }
    },
    "dp": 8,
    "precision": "mixed_bf16",
    "engine": "torch",
    "batch": {"micro_batch_size": 2, "seq_len": 1024},
    "device_memory": 1_000_000_000,
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def test_default_sweep_is_nd_1_to_4096_for_four_stages(client: TestClient) -> None:
    response = client.post("/v1/memory/sweep", json=PAPER)
    assert response.status_code == 200
    body = response.json()
    assert [p["dp"] for p in body["points"]] == POWERS_OF_TWO == [2**i for i in range(13)]
    assert all([s["stage"] for s in p["stages"]] == [0, 1, 2, 3] for p in body["points"])
    assert response.headers["server-timing"].startswith("app;dur=")
    # ZeRO paper Figure 1 at Nd = 64 (7.5B, K = 12): 120 / 31.4 / 16.6 / 1.9 GB
    at_64 = next(p for p in body["points"] if p["dp"] == 64)
    assert [s["per_device"]["model_states"] for s in at_64["stages"]] == [
        120_000_000_000,
        31_406_250_000,
        16_640_625_000,
        1_875_000_000,
    ]


@pytest.mark.parametrize("body", [PAPER, WITH_BATCH], ids=["paper", "torch_with_batch"])
def test_each_point_equals_the_memory_answer_at_that_nd(client: TestClient, body: dict) -> None:
    dp_values = [1, 3, 8, 100, 4096]
    sweep = client.post("/v1/memory/sweep", json={**body, "dp_values": dp_values}).json()
    for point in sweep["points"]:
        single = client.post("/v1/memory", json={**body, "dp": point["dp"]}).json()
        assert point["stages"] == [
            {"stage": s["stage"], "per_device": s["per_device"], "fits": s["fits"]}
            for s in single["stages"]
        ]
    assert sweep["convention"] == client.post("/v1/memory", json=body).json()["convention"]


@pytest.mark.parametrize(
    ("dp_values", "why"),
    [
        ([], "at least 1"),
        (list(range(1, MAX_SWEEP_POINTS + 2)), f"at most {MAX_SWEEP_POINTS}"),
        ([1, 2, 2], "once"),
        ([0, 1], "greater than or equal to 1"),
        ([2**40], "less than or equal to"),
        ([1.5], "integer"),
    ],
)
def test_bad_dp_values_are_422_naming_the_field(
    client: TestClient, dp_values: list[object], why: str
) -> None:
    response = client.post("/v1/memory/sweep", json={**PAPER, "dp_values": dp_values})
    assert response.status_code == 422
    (error, *_) = response.json()["detail"]
    assert error["field"].startswith("dp_values")
    assert why in error["msg"]


def test_a_sweep_over_its_computation_budget_is_422(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.api.routes import sweep

    monkeypatch.setattr(sweep, "SWEEP_BUDGET_S", 0.0)
    response = client.post("/v1/memory/sweep", json=PAPER)
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["field"] == "dp_values"
    assert "send fewer dp_values" in error["msg"]
