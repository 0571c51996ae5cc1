"""GET /v1/presets, /healthz, /readyz and the OpenAPI examples."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_presets_list_counts(client: TestClient) -> None:
    rows = {p["name"]: p for p in client.get("/v1/presets").json()}
    required = {
        "gpt2",
        "gpt2-medium",
        "gpt2-large",
        "gpt2-xl",
        "gpt3-175b",
        "bloom-176b",
        "llama2-7b",
        "llama2-13b",
        "llama2-70b",
        "llama3-8b",
        "llama3-70b",
        "mistral-7b",
        "mixtral-8x7b",
    }
    assert required <= set(rows)
    assert rows["llama3-8b"]["params"] == 8_030_261_248
    assert "8 experts" in rows["mixtral-8x7b"]["note"]


def test_health(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready"
    assert "gpus" in ready["devices"]
    assert ready["jobs"]["worker"] == "running"


def test_docs_carry_the_paper_example_first(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    examples = spec["paths"]["/v1/memory"]["post"]["requestBody"]["content"]["application/json"][
        "examples"
    ]
    first = next(iter(examples.values()))
    assert first["value"] == {"model": {"params": 7_500_000_000}, "dp": 64}
    for example in examples.values():
        assert client.post("/v1/memory", json=example["value"]).status_code == 200
    assert client.get("/docs").status_code == 200


def test_every_request_field_has_a_description(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    missing = [
        f"{name}.{field}"
        for name in ("MemoryRequest", "ArchitectureIn", "BatchIn", "OffloadIn", "CapacityRequest")
        for field, prop in schemas[name]["properties"].items()
        if not prop.get("description")
    ]
    assert missing == []
