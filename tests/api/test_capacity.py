"""POST /v1/capacity: the paper's Table 2 and the smallest Nd for a model."""

from __future__ import annotations

from fastapi.testclient import TestClient

GB = 10**9


def test_table_2_through_http(client: TestClient) -> None:
    r = client.post("/v1/capacity", json={"device_memory": 32 * GB, "dp": 64})
    assert r.status_code == 200, r.text
    got = [s["max_params"] for s in r.json()["stages"]]
    # ZeRO paper Table 2 (32 GB V100, Nd = 64): 2B / 7.6B / 14.4B / 128B.
    assert got == [2_000_000_000, 7_641_791_044, 14_422_535_210, 128_000_000_000]


def test_min_dp_agrees_with_memory(client: TestClient) -> None:
    body = {
        "device_memory": 80 * GB,
        "dp": 1,
        "model": {"preset": "llama2-70b"},
        "precision": "mixed_bf16",
    }
    rows = client.post("/v1/capacity", json=body).json()["stages"]
    assert rows[0]["min_dp"] is None  # 16 B/param × 69B never fits 80 GB
    for row in rows:
        n = row["min_dp"]
        if n is None:
            continue
        mem = client.post(
            "/v1/memory",
            json={
                "model": {"preset": "llama2-70b"},
                "dp": n,
                "stages": [row["stage"]],
                "precision": "mixed_bf16",
                "device_memory": 80 * GB,
            },
        ).json()
        assert mem["stages"][0]["fits"] is True
        if n > 1:
            before = client.post(
                "/v1/memory",
                json={
                    "model": {"preset": "llama2-70b"},
                    "dp": n - 1,
                    "stages": [row["stage"]],
                    "precision": "mixed_bf16",
                    "device_memory": 80 * GB,
                },
            ).json()
            assert before["stages"][0]["fits"] is False


def test_capacity_rejects_bad_memory(client: TestClient) -> None:
    r = client.post("/v1/capacity", json={"device_memory": 0, "dp": 64})
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "device_memory"
