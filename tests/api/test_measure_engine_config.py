"""POST /v1/measure takes the config users train with, as /v1/memory does: a transformers Trainer
DeepSpeed config full of "auto", FSDP2 settings; 422 naming both fields only on an explicit
contradiction; the result states what was resolved (``resolved_config``)."""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.config import Settings, get_settings
from app.main import create_app
from tests.measure.test_measure_engine_config import TINY_GPT, trainer_config

FAKE_RUNNER = "tests.api.fake_runner:succeed"


def deepspeed_body(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"architecture": TINY_GPT},
        "dp": 1,
        "engine": "deepspeed",
        "mode": "distributed",
        "device": "cpu",
        "steps": 1,
        "warmup_steps": 1,
        "batch": {"micro_batch_size": 2, "seq_len": 32},
        "engine_config": trainer_config(3),
    }
    body.update(extra)
    return body


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """The service with DeepSpeed importable as far as the request check asks, jobs going to a
    stand-in runner."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return real("json") if name == "deepspeed" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    app = create_app()
    settings = Settings(data_dir=tmp_path, measure_runner=FAKE_RUNNER)
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app) as c:
        yield c


def test_a_trainer_config_is_accepted_and_the_config_decides(client: TestClient) -> None:
    answer = client.post("/v1/measure", json=deepspeed_body(stages=[3]))
    assert answer.status_code == 202, answer.text
    job = client.get(answer.headers["location"]).json()
    request = job["request"]
    # the fields the config decides stay as sent: precision and offload come from the config
    assert "precision" not in request and "offload" not in request
    assert request["stages"] == [3]
    assert "grad_accumulation_steps" not in request["batch"]
    assert request["engine_config"] == trainer_config(3)  # as the user wrote it, "auto" and all


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            {"precision": "mixed_fp16", "engine_config": {"bf16": {"enabled": True}}},
            ["precision", "engine_config.bf16.enabled"],
        ),
        (
            {"stages": [1, 2]},
            ["stages", "engine_config.zero_optimization.stage"],
        ),
        (
            {"engine_config": {"train_micro_batch_size_per_gpu": 4}},
            ["batch.micro_batch_size", "engine_config.train_micro_batch_size_per_gpu"],
        ),
    ],
)
def test_an_explicit_contradiction_is_a_422_naming_both(
    client: TestClient, extra: dict[str, Any], named: list[str]
) -> None:
    answer = client.post("/v1/measure", json=deepspeed_body(**extra))
    assert answer.status_code == 422, answer.text
    assert [d["field"] for d in answer.json()["detail"]] == named
    assert client.get("/v1/measurements").json()["count"] == 0


def test_an_auto_bucket_without_a_hidden_size_is_impossible_to_send(client: TestClient) -> None:
    """A measured model always has a shape: a bare params count is refused first."""
    answer = client.post("/v1/measure", json=deepspeed_body(model={"params": 1000}))
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["field"] == "model"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_fsdp2_settings_run_on_the_cpu(tmp_path: Path) -> None:
    """The shipped runner, end to end: reshard_after_forward false is stage 2 alone, and the
    result states the resolution with /v1/memory's field names."""
    body = {
        "model": {"architecture": {**TINY_GPT, "layers": 1, "max_seq_len": 16}},
        "dp": 2,
        "engine": "torch",
        "mode": "simulated",
        "device": "cpu",
        "batch": {"micro_batch_size": 1, "seq_len": 16},
        "steps": 1,
        "warmup_steps": 1,
        "engine_config": {
            "reshard_after_forward": False,
            "mp_policy": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
        },
    }
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: Settings(data_dir=tmp_path)
    with TestClient(app) as client:
        answer = client.post("/v1/measure", json=body)
        assert answer.status_code == 202, answer.text
        location = answer.headers["location"]
        deadline = time.monotonic() + 180
        while (job := client.get(location).json())["status"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        measure_only = ("mode", "device", "steps", "warmup_steps")
        memory = client.post(
            "/v1/memory", json={k: v for k, v in body.items() if k not in measure_only}
        )
    assert job["status"] == "succeeded", job["error"]
    result = job["result"]
    assert [r["stage"] for r in result["runs"]] == [2]
    assert result["precision"] == "mixed_bf16"
    assert memory.status_code == 200, memory.text
    assert result["resolved_config"] == memory.json()["resolved_config"]


def test_a_calibration_reads_what_the_config_decided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A measurement of a Trainer config ("auto" buckets, fp16 from the config, no precision
    sent) calibrates the plan with the precision and the concrete config the run used."""
    from app.jobs.store import JobStatus
    from measure import spec as measure_spec

    monkeypatch.setattr(measure_spec, "deepspeed_available", lambda: True)
    config = {**trainer_config(2), "fp16": {"enabled": True}}
    request = deepspeed_body(dp=2, engine_config=config, device="cuda")
    ms = measure_spec.parse_spec(request)
    assert ms.resolved is not None
    result = {
        "precision": ms.precision.value,
        "optimizer": ms.optimizer.value,
        "environment": {"device_type": "cuda", "device_name": "NVIDIA L4"},
        "runs": [{"stage": 2, "step_time_s": 0.5, "world_size": 2, "mode": "distributed"}],
        "resolved_config": measure_spec.resolved_config_body(ms.engine, ms.resolved),
    }
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: Settings(data_dir=tmp_path)
    with TestClient(app) as client:
        store = client.app.state.jobs.store  # type: ignore[attr-defined]
        job = store.create("job-ds", request, "runner", 60.0)
        store.start(job.id)
        store.finish(job.id, JobStatus.SUCCEEDED, result=json.dumps(result))
        answer = client.post("/v1/calibrations", json={"measurement_id": job.id})
    assert answer.status_code == 201, answer.text
    assert answer.json()["precision"] == "mixed_fp16"
