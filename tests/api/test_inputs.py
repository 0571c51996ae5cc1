"""Inputs people type: unit strings and 7.5e9 for Ψ and bytes, ambiguous commas, too-large
numbers, a tensor list posing as an engine setting, a sequence longer than a position table."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import app
from tests.api.fakes import fake_runner

GPT_SMALL = {"layers": 2, "hidden": 256, "heads": 4, "vocab_size": 1000, "max_seq_len": 128}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with fake_runner(), TestClient(app) as c:
        yield c


def refusal(response: Any) -> dict[str, str]:
    assert response.status_code == 422, response.text
    errors: list[dict[str, str]] = response.json()["detail"]
    assert len(errors) == 1, errors
    return errors[0]


@pytest.mark.parametrize("params", [7_500_000_000, 7.5e9, "7.5B", "7.5e9", "7_500_000_000"])
def test_params_in_any_written_form_is_one_integer(client: TestClient, params: Any) -> None:
    # the ZeRO paper's 7.5B example, Nd = 64
    reference = client.post("/v1/memory", json={"model": {"params": 7_500_000_000}, "dp": 64})
    r = client.post("/v1/memory", json={"model": {"params": params}, "dp": 64})
    assert r.status_code == 200, r.text
    assert r.json() == reference.json()
    assert type(r.json()["params"]) is int


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/memory", {"model": {"params": "7.5B"}, "dp": 64}),
        ("/v1/capacity", {"dp": 64}),
        ("/v1/inference", {"model": {"preset": "llama3-8b"}}),
    ],
)
@pytest.mark.parametrize(
    ("written", "n_bytes"),
    [("80GiB", 80 * 2**30), ("40GB", 40 * 10**9), (8e10, 8 * 10**10), ("1.5 TiB", 3 * 2**39)],
)
def test_device_memory_takes_units_and_answers_bytes(
    client: TestClient, path: str, body: dict[str, Any], written: Any, n_bytes: int
) -> None:
    as_string = client.post(path, json={**body, "device_memory": written})
    as_int = client.post(path, json={**body, "device_memory": n_bytes})
    assert as_string.status_code == 200, as_string.text
    assert as_string.json() == as_int.json()
    if "device_memory" in as_int.json():
        assert as_string.json()["device_memory"] == n_bytes


@pytest.mark.parametrize("written", ["7,5B", "7,5", "7,500B", "1,5e9"])
def test_an_ambiguous_comma_is_refused(client: TestClient, written: str) -> None:
    error = refusal(client.post("/v1/memory", json={"model": {"params": written}, "dp": 8}))
    assert error["field"] == "model.params"
    assert "comma is ambiguous" in error["msg"]


def test_thousands_groups_are_read(client: TestClient) -> None:
    r = client.post("/v1/memory", json={"model": {"params": "124,439,808"}, "dp": 8})
    assert r.status_code == 200, r.text
    assert r.json()["params"] == 124_439_808


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("model.params", {"model": {"params": 1e30}, "dp": 8}),
        ("model.params", {"model": {"params": 10**30}, "dp": 8}),
        ("model.params", {"model": {"params": "1e30"}, "dp": 8}),
        ("model.params", {"model": {"params": "1e999999999"}, "dp": 8}),
        ("device_memory", {"model": {"params": 10**9}, "dp": 8, "device_memory": 1e300}),
        ("device_memory", {"model": {"params": 10**9}, "dp": 8, "device_memory": "2048TiB"}),
    ],
)
def test_too_large_says_so(client: TestClient, field: str, body: dict[str, Any]) -> None:
    error = refusal(client.post("/v1/memory", json=body))
    assert error["field"] == field
    assert "too large" in error["msg"] and "integer" not in error["msg"]


@pytest.mark.parametrize("size", ["9.0871 KB", "1.5", "0.3KiB "])
def test_a_size_that_reads_but_is_not_whole_bytes_is_a_rule(client: TestClient, size: str) -> None:
    # the string form's pattern admits any fraction: whole bytes are a rule it cannot state
    error = refusal(
        client.post("/v1/memory", json={"model": {"params": 10**9}, "dp": 8, "device_memory": size})
    )
    assert error["field"] == "device_memory" and error["type"] == "rule"
    assert "whole number of bytes" in error["msg"]


@pytest.mark.parametrize(
    ("params", "words"),
    [(7.5, "whole number"), ("7.25", "whole number"), (True, "integer or a string"),
     ([7], "integer or a string"), ("7.5X", "unknown suffix"), (0, "at least 1")],
)  # fmt: skip
def test_other_bad_counts_say_why(client: TestClient, params: Any, words: str) -> None:
    error = refusal(client.post("/v1/memory", json={"model": {"params": params}, "dp": 8}))
    assert error["field"] == "model.params" and words in error["msg"]


def test_openapi_describes_integer_or_unit_string(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for schema, field, good, bad in [
        ("ModelSpec", "params", ["7.5B", "7.5e9", "124,439,808", "7500000000"], ["7,5B", "7.5GB"]),
        ("CapacityRequest", "device_memory", ["80GiB", "40GB", "1.5 TiB", "123"], ["80G,5", "x"]),
    ]:
        forms = schemas[schema].get("oneOf", [schemas[schema]])  # model: one form per input
        declared = next(f["properties"][field] for f in forms if field in f.get("properties", {}))
        branches = [b for b in declared["anyOf"] if b.get("type") != "null"]
        if len(branches) == 1 and "anyOf" in branches[0]:  # nullable: anyOf [ours, null]
            branches = branches[0]["anyOf"]
        kinds = {b["type"]: b for b in branches}
        assert set(kinds) == {"integer", "string"}
        assert kinds["integer"]["minimum"] == 1
        pattern = re.compile(kinds["string"]["pattern"])
        assert all(pattern.search(text) for text in good), (schema, field)
        assert not any(pattern.search(text) for text in bad), (schema, field)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/memory", {"model": {"params": 10**6}, "dp": 2, "engine": "torch"}),
        ("/v1/capacity", {"device_memory": "80GB", "dp": 2, "engine": "torch"}),
        ("/v1/measure", {"model": {"architecture": GPT_SMALL}, "dp": 2, "engine": "torch"}),
    ],
)
def test_engine_config_tensors_is_refused(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    tensors = [["w", [1000, 1000], "layers.0"]]
    error = refusal(client.post(path, json={**body, "engine_config": {"tensors": tensors}}))
    assert error["field"] == "engine_config"
    assert "engine_config.tensors" in error["msg"] and "model" in error["msg"]


def test_seq_len_beyond_a_learned_position_table_is_refused(client: TestClient) -> None:
    batch = {"micro_batch_size": 1, "seq_len": 256}
    learned = {"model": {"architecture": GPT_SMALL}, "dp": 2, "batch": batch}
    error = refusal(client.post("/v1/memory", json=learned))
    assert error["field"] == "batch.seq_len"
    assert "max_seq_len 128" in error["msg"]
    # gpt2's table has 1024 rows
    gpt2 = {"model": {"preset": "gpt2"}, "dp": 2, "batch": {"micro_batch_size": 1, "seq_len": 2048}}
    assert refusal(client.post("/v1/memory", json=gpt2))["field"] == "batch.seq_len"
    # RoPE has no table: a longer sequence is a question of quality, not of shape
    rope = {**GPT_SMALL, "position_embedding": "rope"}
    r = client.post("/v1/memory", json={**learned, "model": {"architecture": rope}})
    assert r.status_code == 200, r.text
    # at the table's length it fits exactly
    fits = {**learned, "batch": {"micro_batch_size": 1, "seq_len": 128}}
    assert client.post("/v1/memory", json=fits).status_code == 200
