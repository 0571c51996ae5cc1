"""POST /v1/capacity: the paper's Table 2 and the smallest Nd for a model."""

from __future__ import annotations

import pytest
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


GIB = 2**30
LLAMA_OFFLOAD = {
    "device_memory": 40 * GIB,
    "dp": 8,
    "stages": [2],
    "engine": "deepspeed",
    "precision": "mixed_bf16",
    "offload": {"optimizer": "cpu"},
    "shape": "llama3-8b",
    "batch": {"micro_batch_size": 1, "seq_len": 4096},
}


def _memory_of(client: TestClient, body: dict[str, object], row: dict[str, object]) -> dict:
    """/v1/memory for the model a capacity row found, under the capacity request's setup."""
    keep = ("dp", "engine", "precision", "offload", "batch", "device_memory")
    model = row["model"]
    assert isinstance(model, dict)
    request = {k: body[k] for k in keep if k in body}
    request["stages"] = [row["stage"]]
    request["model"] = (
        {"architecture": model["architecture"]}
        if model["architecture"] is not None
        else {"params": model["params"]}
    )
    r = client.post("/v1/memory", json=request)
    assert r.status_code == 200, r.text
    return r.json()


def test_deepspeed_offload_grows_the_llama_shape_and_agrees_with_memory(
    client: TestClient,
) -> None:
    r = client.post("/v1/capacity", json=LLAMA_OFFLOAD)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["engine"] == "deepspeed" and data["grown"].startswith("llama3-8b shape")
    (row,) = data["stages"]
    arch = row["model"]["architecture"]
    assert row["model"]["name"] == (
        f"llama3-8b shape, {arch['layers']} layers × {arch['hidden']}, "
        "trained with transformers' llama modelling code"
    )
    assert row["model"]["params"] == row["max_params"]
    # the batch and the engine's buffers count: activations and a peak, under the device
    assert row["per_device"]["activations"] > 0 and row["per_device"]["peak"] == row["needed"]
    assert row["needed"] <= LLAMA_OFFLOAD["device_memory"]
    mem = _memory_of(client, LLAMA_OFFLOAD, row)
    assert mem["params"] == row["max_params"]
    # as a bare architecture it is the canonical decoder: same model states, and its
    # activations are the canonical module's (transformers' llama saves more, see
    # calculators/transformers_activations.py)
    same = ("parameters", "gradients", "optimizer_states", "model_states", "resident")
    assert {k: mem["stages"][0]["per_device"][k] for k in same} == {
        k: row["per_device"][k] for k in same
    }
    assert mem["stages"][0]["per_device"]["activations"] < row["per_device"]["activations"]
    # the same request answered as before, model states of a bare Ψ only, said 21.47B fits
    assert row["max_params"] < 21_474_836_480


def test_engine_is_honoured_for_a_bare_count(client: TestClient) -> None:
    body = {
        "device_memory": 40 * GIB,
        "dp": 8,
        "stages": [2],
        "engine": "deepspeed",
        "precision": "mixed_bf16",
        "offload": {"optimizer": "cpu"},
    }
    data = client.post("/v1/capacity", json=body).json()
    (row,) = data["stages"]
    paper = client.post("/v1/capacity", json={**body, "engine": "paper"}).json()["stages"][0]
    assert row["max_params"] < paper["max_params"]
    assert row["model"]["architecture"] is None
    assert any("decoder it implies" in n for n in data["notes"])
    assert _memory_of(client, body, row)["stages"][0]["fits"] is True
    over = {**row, "model": {"architecture": None, "params": row["max_params"] + 1}}
    assert _memory_of(client, body, over)["stages"][0]["fits"] is False


def test_deepspeed_min_dp_with_a_batch_agrees_with_memory(client: TestClient) -> None:
    body = {
        "device_memory": 40 * GIB,
        "dp": 8,
        "engine": "deepspeed",
        "precision": "mixed_bf16",
        "model": {"preset": "llama3-8b"},
        "batch": {"micro_batch_size": 1, "seq_len": 2048},
    }
    data = client.post("/v1/capacity", json=body).json()
    assert data["grown"].startswith("llama3-8b shape")
    seen = 0
    for row in data["stages"]:
        n = row["min_dp"]
        if n is None:
            assert any(note.startswith("min_dp is null") for note in row["notes"])
            continue
        seen += 1
        model = {**body, "stages": [row["stage"]], "dp": n}
        model.pop("max_dp", None)
        fits = client.post("/v1/memory", json=model).json()["stages"][0]["fits"]
        assert fits is True
        if n > 1:
            before = client.post("/v1/memory", json={**model, "dp": n - 1}).json()
            assert before["stages"][0]["fits"] is False
    assert seen >= 1


NULL_CASES = [
    # a device too small for one block of the shape, and for the model at any Nd
    {
        "device_memory": 2 * GIB,
        "dp": 8,
        "engine": "deepspeed",
        "precision": "mixed_bf16",
        "model": {"preset": "llama3-8b"},
        "batch": {"micro_batch_size": 1, "seq_len": 1024},
        "max_dp": 64,
    },
    # the paper engine: no batch, then a batch with no architecture
    {"device_memory": 80 * GIB, "dp": 8, "model": {"preset": "llama2-70b"}, "max_dp": 4},
    {"device_memory": 80 * GIB, "dp": 8, "batch": {"micro_batch_size": 1, "seq_len": 1024}},
    {"device_memory": 80 * GIB, "dp": 8, "engine": "torch", "precision": "mixed_bf16"},
]


@pytest.mark.parametrize("body", NULL_CASES)
def test_every_null_says_why(client: TestClient, body: dict[str, object]) -> None:
    r = client.post("/v1/capacity", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    for row in data["stages"]:
        text = " ".join(row["notes"] + data["notes"])
        if row["max_params"] is None:
            assert "max_params is null" in text
            assert row["model"] is None and row["per_device"] is None
        if row["min_dp"] is None and "model" in body:
            assert "min_dp is null" in text
        for key, value in (row["per_device"] or {}).items():
            if value is None:
                assert key in text, (key, text)


def test_no_block_fits_names_what_it_needs(client: TestClient) -> None:
    rows = client.post("/v1/capacity", json=NULL_CASES[0]).json()["stages"]
    assert rows[0]["max_params"] is None
    assert "one block of the llama3-8b shape" in rows[0]["notes"][0]
    assert "never fits at any Nd up to max_dp = 64" in " ".join(rows[0]["notes"])


def test_paper_engine_counts_the_batch_with_a_shape(client: TestClient) -> None:
    body = {"device_memory": 80 * GIB, "dp": 8, "shape": "gpt2-xl", "stages": [3]}
    bare = client.post("/v1/capacity", json=body).json()["stages"][0]
    batch = {"micro_batch_size": 8, "seq_len": 1024}
    with_batch = client.post("/v1/capacity", json={**body, "batch": batch}).json()["stages"][0]
    assert with_batch["per_device"]["activations"] > 0
    assert bare["per_device"]["activations"] is None
    assert with_batch["max_params"] < bare["max_params"]
    assert _memory_of(client, {**body, "batch": batch}, with_batch)["stages"][0]["fits"] is True


def test_capacity_rejects_an_unknown_shape(client: TestClient) -> None:
    r = client.post("/v1/capacity", json={"device_memory": GB, "dp": 1, "shape": "nope"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "shape"


def test_an_hf_config_model_is_grown_and_named(client: TestClient) -> None:
    hf = {
        "model_type": "llama",
        "num_hidden_layers": 16,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    }
    body = {
        "device_memory": 80 * GIB,
        "dp": 8,
        "stages": [3],
        "engine": "torch",
        "precision": "mixed_bf16",
        "model": {"hf_config": hf},
        "batch": {"micro_batch_size": 1, "seq_len": 2048},
    }
    r = client.post("/v1/capacity", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    (row,) = data["stages"]
    arch = row["model"]["architecture"]
    assert data["grown"].startswith("the hf_config's llama shape: 128 hidden per layer")
    assert row["model"]["name"].startswith("the hf_config's llama shape, ")
    # 128 hidden per layer, rounded to whole groups of 4 heads of 64 (256 wide)
    assert arch["hidden"] == round(arch["layers"] * 128 / 256) * 256
    assert arch["heads"] == arch["hidden"] // 64 == 4 * arch["kv_heads"]
    assert arch["tied_embeddings"] is True and arch["layers"] > 16
    assert row["min_dp"] == 1
    assert _memory_of(client, body, row)["stages"][0]["fits"] is True


def test_a_deepspeed_config_decides_the_capacity_question(client: TestClient) -> None:
    # the same question as LLAMA_OFFLOAD, its stage and offload said by a Trainer-style config
    config = {
        "bf16": {"enabled": "auto"},
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "zero_optimization": {
            "stage": 2,
            "reduce_bucket_size": "auto",
            "offload_optimizer": {"device": "cpu"},
        },
    }
    body = {k: v for k, v in LLAMA_OFFLOAD.items() if k not in ("stages", "offload")}
    by_config = client.post("/v1/capacity", json={**body, "engine_config": config})
    assert by_config.status_code == 200, by_config.text
    (row,) = by_config.json()["stages"]
    explicit = client.post("/v1/capacity", json=LLAMA_OFFLOAD).json()["stages"][0]
    assert row["stage"] == 2
    assert row["max_params"] == explicit["max_params"]
    assert row["model"]["name"] == explicit["model"]["name"]
