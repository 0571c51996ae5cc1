"""POST /v1/memory with ``activation_model``: the traced ground truth offered to users."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import app

CONFIG: dict[str, Any] = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
}


def _body(activation_model: str, model: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "model": model or {"hf_config": CONFIG},
        "dp": 2,
        "engine": "torch",
        "precision": "mixed_bf16",
        "stages": [0, 3],
        "batch": {"micro_batch_size": 2, "seq_len": 24},
        "activation_model": activation_model,
    }


def test_traced_peak_equals_the_analytical_peak() -> None:
    pytest.importorskip("transformers", reason="traced mode needs transformers")
    pytest.importorskip("torch", reason="traced mode needs torch")
    with TestClient(app) as client:
        analytical = client.post("/v1/memory", json=_body("analytical"))
        traced = client.post("/v1/memory", json=_body("traced"))
    assert analytical.status_code == traced.status_code == 200
    peaks = [[s["per_device"]["peak"] for s in r.json()["stages"]] for r in (analytical, traced)]
    assert peaks[0] == peaks[1]
    assert all(p is not None and p > 0 for p in peaks[0])


def test_a_padded_batch_traced_equals_the_analytical_figures() -> None:
    pytest.importorskip("transformers", reason="traced mode needs transformers")
    pytest.importorskip("torch", reason="traced mode needs torch")
    figures = []
    with TestClient(app) as client:
        for model in ("analytical", "traced"):
            body = _body(model)
            body["batch"] = {**body["batch"], "padded": True}
            r = client.post("/v1/memory", json=body)
            assert r.status_code == 200, r.text
            figures.append([s["per_device"] for s in r.json()["stages"]])
        unpadded = client.post("/v1/memory", json=_body("traced")).json()["stages"]
    analytical, traced = ([d["peak"] for d in f] for f in figures)
    assert analytical == traced
    # the mask's bias and key/value expanded to every query head
    for padded, u in zip(figures[1], unpadded, strict=True):
        assert padded["activations"] > u["per_device"]["activations"]


def test_checkpoint_offload_traced_equals_the_analytical_figures() -> None:
    pytest.importorskip("transformers", reason="traced mode needs transformers")
    pytest.importorskip("torch", reason="traced mode needs torch")
    answers = []
    with TestClient(app) as client:
        for model in ("analytical", "traced"):
            body = _body(model)
            body["batch"] = {**body["batch"], "activation_checkpointing": "full"}
            body["batch"]["checkpoint_offload"] = True
            r = client.post("/v1/memory", json=body)
            assert r.status_code == 200, r.text
            answers.append(r.json()["stages"])
    analytical, traced = (
        [(s["per_device"]["peak"], s["cpu"]["activations"]) for s in a] for a in answers
    )
    assert analytical == traced
    # two layers' inputs: fp32 under DDP's autocast (stage 0), bf16 under FSDP2's policy (stage 3)
    assert [host for _, host in traced] == [2 * 4 * 48 * 64, 2 * 2 * 48 * 64]


def test_traced_without_transformers_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = pytest.importorskip("measure.trace", reason="needs torch", exc_type=ImportError)
    monkeypatch.setattr(trace, "transformers_available", lambda: False)
    with TestClient(app) as client:
        r = client.post("/v1/memory", json=_body("traced"))
    assert r.status_code == 422
    (error,) = r.json()["detail"]
    assert error["field"] == "activation_model"
    assert "pip install 'zerocalc[hf]'" in error["msg"]


def test_traced_needs_an_hf_config() -> None:
    with TestClient(app) as client:
        r = client.post("/v1/memory", json=_body("traced", {"preset": "gpt2"}))
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "activation_model"


def test_a_config_the_trace_cannot_run_gets_a_422(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = pytest.importorskip("measure.trace", reason="needs torch", exc_type=ImportError)
    pytest.importorskip("transformers", reason="traced mode needs transformers")

    def fails(*_: Any, **__: Any) -> None:
        raise RuntimeError("an op this config reaches has no fake-tensor rule\nsecond line")

    monkeypatch.setattr(trace, "trace", fails)
    trace._kept_trace.cache_clear()  # the traces an earlier test kept for this config
    with TestClient(app) as client:
        r = client.post("/v1/memory", json=_body("traced"))
    assert r.status_code == 422
    (error,) = r.json()["detail"]
    assert error["field"] == "activation_model"
    assert "RuntimeError: an op this config reaches has no fake-tensor rule" in error["msg"]
    assert "second line" not in error["msg"]


def test_traced_takes_a_position_dependent_rotary_scaling() -> None:
    """LongRoPE (Phi-3.5-mini, Phi-4-mini) picks its frequencies from the positions at run time."""
    pytest.importorskip("transformers", reason="traced mode needs transformers")
    pytest.importorskip("torch", reason="traced mode needs torch")
    config = {
        **CONFIG,
        "model_type": "phi3",
        "partial_rotary_factor": 0.5,
        "pad_token_id": None,  # Phi-3's default (32000) lies outside this vocabulary
        "original_max_position_embeddings": 16,
        "rope_scaling": {"type": "longrope", "long_factor": [1.5] * 4, "short_factor": [1.0] * 4},
    }
    config.pop("head_dim")
    with TestClient(app) as client:
        analytical = client.post("/v1/memory", json=_body("analytical", {"hf_config": config}))
        traced = client.post("/v1/memory", json=_body("traced", {"hf_config": config}))
    assert analytical.status_code == traced.status_code == 200, traced.text
    peaks = [[s["per_device"]["peak"] for s in r.json()["stages"]] for r in (analytical, traced)]
    assert peaks[0] == peaks[1]


def test_only_the_regimes_asked_are_traced_and_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed trains in bf16 alone; DDP under autocast and FSDP2 in bf16; an answer already
    traced is not traced again."""
    trace = pytest.importorskip("measure.trace", reason="needs torch", exc_type=ImportError)
    pytest.importorskip("transformers", reason="traced mode needs transformers")
    calls: list[str] = []
    run = trace.trace

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[3])
        return run(*args, **kwargs)

    monkeypatch.setattr(trace, "trace", counted)
    trace._kept_trace.cache_clear()
    with TestClient(app) as client:
        deepspeed = {**_body("traced"), "engine": "deepspeed", "stages": [0, 1, 2, 3]}
        assert client.post("/v1/memory", json=deepspeed).status_code == 200
        assert calls == ["half"]
        assert client.post("/v1/memory", json=_body("traced")).status_code == 200
        assert calls == ["half", "autocast"]
        sweep = {**_body("traced"), "dp_values": [1, 2, 4, 8]}
        assert client.post("/v1/memory/sweep", json=sweep).status_code == 200
        fp32 = {**_body("traced"), "precision": "fp32"}
        assert client.post("/v1/memory", json=fp32).status_code == 200
    assert calls == ["half", "autocast", "fp32"]
