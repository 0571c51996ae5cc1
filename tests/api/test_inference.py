"""POST /v1/inference from the outside."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_preset_with_cache(client: TestClient) -> None:
    r = client.post(
        "/v1/inference",
        json={"model": {"preset": "llama2-7b"}, "context": 4096, "device_memory": 16 * 10**9},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kv_cache"] == 2 * 32 * 4096 * 4096 * 2
    assert body["total"] == body["weights"] + body["kv_cache"]
    assert body["fits"] is True
    assert body["readable"]["kv_cache"] == "2.15 GB (2.00 GiB)"


def test_bad_input_names_the_field(client: TestClient) -> None:
    r = client.post("/v1/inference", json={"model": {"preset": "llama3-8b"}, "tp": 3})
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "tp"
    r = client.post("/v1/inference", json={"model": {"params": 10}, "weights": "int3"})
    assert r.json()["detail"][0]["field"] == "weights"
