"""``engine: "deepspeed"`` in the measure runner: refusals (always) and a tiny real run on the CPU
(only where DeepSpeed is importable)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from calculators.conventions import Engine, Precision, Stage  # noqa: E402
from calculators.errors import InputError  # noqa: E402
from measure import spec as measure_spec  # noqa: E402
from measure.compare import predicted_communication  # noqa: E402
from measure.engines.deepspeed_config import deepspeed_config  # noqa: E402
from measure.runner import run, run_settings, training_setup  # noqa: E402
from measure.spec import MeasureSpec, parse_spec  # noqa: E402
from measure.workloads import build_workload  # noqa: E402

TINY_GPT = {"layers": 2, "hidden": 64, "heads": 2, "vocab_size": 128, "max_seq_len": 32}


def _spec(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"architecture": TINY_GPT},
        "dp": 1,
        "stages": [0, 1, 2, 3],
        "precision": "mixed_bf16",
        "optimizer": "adam",
        "engine": "deepspeed",
        "mode": "distributed",
        "device": "cpu",
        "warmup_steps": 2,
        "steps": 1,
        "batch": {"micro_batch_size": 2, "seq_len": 32},
    }
    spec.update(extra)
    return spec


def _setup(ms: MeasureSpec, world: int, stage: Stage) -> Any:
    workload = build_workload(ms)
    settings = run_settings(ms, workload, torch.device("cpu"), stage)
    return training_setup(ms, workload, world, settings, stage)


@pytest.fixture
def with_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse as if DeepSpeed were importable (nothing here imports it)."""
    monkeypatch.setattr(measure_spec, "deepspeed_available", lambda: True)


def _field(spec: dict[str, Any]) -> str:
    with pytest.raises(InputError) as err:
        parse_spec(spec)
    return err.value.field


def test_missing_deepspeed_names_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure_spec, "deepspeed_available", lambda: False)
    assert _field(_spec()) == "engine"
    with pytest.raises(InputError) as err:
        run(_spec())
    assert err.value.field == "engine"


@pytest.mark.usefixtures("with_deepspeed")
def test_simulated_mode_is_refused() -> None:
    assert _field(_spec(mode="simulated")) == "mode"


@pytest.mark.usefixtures("with_deepspeed")
@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"precision": "fp32"}, "precision"),
        ({"precision": "bf16"}, "precision"),
        # a field the request sends that the config contradicts: the request's field first
        ({"engine_config": {"fp16": {"enabled": True}}}, "precision"),
        ({"engine_config": {"train_micro_batch_size_per_gpu": 4}}, "batch.micro_batch_size"),
        ({"stages": [3], "engine_config": {"zero_optimization": {"stage": 2}}}, "stages"),
        (
            {"engine_config": {"zero_optimization": {"reduce_bucket_size": 0}}},
            "engine_config.zero_optimization.reduce_bucket_size",
        ),
        ({"engine_config": {"zero_optimization": []}}, "engine_config.zero_optimization"),
        ({"offload": {"optimizer": "cpu"}}, "offload.optimizer"),  # stage 0 is in the list
        ({"stages": [2], "offload": {"params": "cpu"}}, "offload.params"),
    ],
)
def test_bad_deepspeed_requests_name_the_field(extra: dict[str, Any], field: str) -> None:
    assert _field(_spec(**extra)) == field


def test_torch_engine_still_runs_without_offload() -> None:
    spec = _spec(engine="torch", mode="simulated", offload={"optimizer": "cpu"})
    assert _field(spec) == "offload.optimizer"


@pytest.mark.usefixtures("with_deepspeed")
def test_auto_mode_is_a_real_group() -> None:
    from measure.runner import _resolve_mode

    ms = parse_spec(_spec(mode="auto"))
    assert _resolve_mode(ms, torch.device("cpu")) == "distributed"


@pytest.mark.usefixtures("with_deepspeed")
def test_config_body_follows_the_request() -> None:
    knobs = {"zero_optimization": {"reduce_bucket_size": 50_000_000}, "wall_clock_breakdown": False}
    ms = parse_spec(
        _spec(
            stages=[2, 3],
            offload={"optimizer": "cpu"},
            engine_config=knobs,
            batch={"micro_batch_size": 2, "seq_len": 32, "grad_accumulation_steps": 2},
        )
    )
    setup = _setup(ms, 1, Stage.PARAMETERS)
    cfg = setup.engine_config
    assert setup.engine is Engine.DEEPSPEED
    assert cfg["bf16"] == {"enabled": True}
    assert cfg["zero_optimization"] == {
        "reduce_bucket_size": 50_000_000,
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
    }
    assert cfg["zero_force_ds_cpu_optimizer"] is False
    assert cfg["zero_allow_untested_optimizer"] is True
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (2, 2)
    assert cfg["wall_clock_breakdown"] is False
    assert cfg["cublaslt_workspace_bytes"] == 0  # the CPU has no cuBLASLt
    assert setup.offload.optimizer.value == "cpu"


def test_deepspeed_config_for_fp16() -> None:
    cfg = deepspeed_config(Stage.OPTIMIZER, Precision.MIXED_FP16, 4, 1, {}, None)
    assert cfg["fp16"] == {"enabled": True} and "bf16" not in cfg
    assert cfg["zero_optimization"] == {"stage": 1}


@pytest.mark.usefixtures("with_deepspeed")
def test_communication_follows_the_engine() -> None:
    ms = parse_spec(_spec(dp=4, stages=[2]))
    pred = predicted_communication(_setup(ms, 4, Stage.GRADIENTS), Stage.GRADIENTS)
    assert pred["source"] == "calculators.communication (engine deepspeed)"
    assert pred["sent_bytes_per_rank"] > 0


@pytest.mark.skipif(not measure_spec.deepspeed_available(), reason="DeepSpeed is not installed")
def test_tiny_deepspeed_run_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/validate_deepspeed.py ``--only tiny`` through the runner: gloo, a world of 1."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("DS_BUILD_OPS", "0")
    result = run(_spec(host_probe=True))
    assert result["engine"] == "deepspeed"
    assert result["convention"].startswith("deepspeed:")
    assert result["environment"]["deepspeed"]
    assert [r["stage"] for r in result["runs"]] == [0, 1, 2, 3]
    for r in result["runs"]:
        assert (r["engine"], r["mode"], r["world_size"]) == ("deepspeed", "distributed", 1)
        assert r["engine_name"].startswith("DeepSpeed ")
        meas, pred = r["measured"]["model_state_resident"], r["predicted"]["model_state_resident"]
        assert abs(pred - meas) <= 0.02 * meas, (r["stage"], pred, meas)
        assert r["communication"]["predicted_by"] == (
            "calculators.communication (engine deepspeed)"
        )
        assert r["communication"]["measured_sent_bytes_per_rank"] == 0  # one rank sends nothing
        probe = r["host_probe"]
        assert probe["seconds"] > 0 and (probe["micro_batch_size"], probe["seq_len"]) == (1, 32)
        assert probe["same_ops_as_training"] is True


@pytest.mark.parametrize(("installed", "field"), [(True, "mode"), (False, "engine")])
def test_api_refuses_deepspeed_without_a_real_group(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, installed: bool, field: str
) -> None:
    import importlib.util

    from fastapi.testclient import TestClient

    from app.core.config import Settings, get_settings
    from app.main import create_app

    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        if name == "deepspeed":
            return real("json") if installed else None  # any spec stands for "importable"
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: Settings(data_dir=tmp_path)
    body = {
        "model": {"architecture": TINY_GPT},
        "dp": 1,
        "engine": "deepspeed",
        "mode": "simulated",
        "device": "cpu",
    }
    with TestClient(app) as client:
        answer = client.post("/v1/measure", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["field"] == field
