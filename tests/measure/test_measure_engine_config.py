"""A measurement reads ``engine_config`` as ``/v1/memory`` does: a transformers Trainer DeepSpeed
config full of "auto", FSDP2 settings; the engine gets a concrete config, the result says how.

Spec-level (no torch): the route, ``python -m measure`` and every rank read a request through
``measure.spec.parse_spec``; DeepSpeed itself is not imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.api.presenters import resolved_config
from app.schemas.memory import ResolvedConfig
from calculators.batch import Checkpointing
from calculators.conventions import Engine, OffloadDevice, Optimizer, Precision, Stage
from calculators.errors import InputError
from measure import spec as measure_spec
from measure.__main__ import parse_args
from measure.spec import parse_spec, resolved_config_body

HIDDEN = 64
TINY_GPT = {"layers": 2, "hidden": HIDDEN, "heads": 2, "vocab_size": 128, "max_seq_len": 32}


CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "ds_configs"


def trainer_config(stage: int) -> dict[str, Any]:
    """A ds_config.json as the transformers DeepSpeed docs write them, "auto" wherever the
    Trainer fills a value (the files the GPU round runs: bench/gpu/trainer_config_round.sh)."""
    config: dict[str, Any] = json.loads((CONFIGS / f"trainer_auto_zero{stage}.json").read_text())
    return config


def test_the_example_configs_are_full_of_auto() -> None:
    for stage in (2, 3):
        config = trainer_config(stage)
        assert config["zero_optimization"]["stage"] == stage
        assert len(autos(config)) >= 12


def body(**extra: Any) -> dict[str, Any]:
    """A request as a user sends it: only what they set."""
    out: dict[str, Any] = {
        "model": {"architecture": TINY_GPT},
        "dp": 2,
        "engine": "deepspeed",
        "mode": "distributed",
        "device": "cpu",
        "batch": {"micro_batch_size": 2, "seq_len": 32},
    }
    out.update(extra)
    return out


@pytest.fixture(autouse=True)
def with_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse as if DeepSpeed were importable (nothing here imports it)."""
    monkeypatch.setattr(measure_spec, "deepspeed_available", lambda: True)


def autos(node: Any) -> list[Any]:
    if isinstance(node, dict):
        return [v for x in node.values() for v in autos(x)]
    return [node] if node == "auto" else []


def refused(request: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(InputError) as err:
        parse_spec(request)
    return err.value.fields


@pytest.mark.parametrize("stage", [2, 3])
def test_a_trainer_config_runs_concrete(stage: int) -> None:
    ms = parse_spec(body(engine_config=trainer_config(stage)))
    assert ms.stages == (Stage(stage),)
    assert (ms.precision, ms.optimizer) == (Precision.MIXED_BF16, Optimizer.ADAMW)
    cfg = ms.ds_config(Stage(stage))
    assert autos(cfg) == []
    zero = cfg["zero_optimization"]
    assert zero["stage"] == stage
    assert zero["reduce_bucket_size"] == HIDDEN * HIDDEN  # the Trainer: hidden_size²
    if stage == 3:
        assert zero["stage3_prefetch_bucket_size"] == int(0.9 * HIDDEN * HIDDEN)
        assert zero["stage3_param_persistence_threshold"] == 10 * HIDDEN
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (2, 1)
    assert "train_batch_size" not in cfg  # DeepSpeed derives it from the world it runs on
    assert cfg["bf16"] == {"enabled": True}
    assert cfg["fp16"]["enabled"] is False and cfg["fp16"]["initial_scale_power"] == 16
    # the client torch optimizer runs; no learning-rate schedule
    assert "optimizer" not in cfg and "scheduler" not in cfg
    assert zero["offload_optimizer"] == {"device": "none", "pin_memory": True}


def test_the_resolution_is_stated_as_v1_memory_states_it() -> None:
    ms = parse_spec(body(engine_config=trainer_config(3)))
    assert ms.resolved is not None
    stated = resolved_config_body(Engine.DEEPSPEED, ms.resolved)
    memory = resolved_config(Engine.DEEPSPEED, ms.resolved)
    assert memory is not None
    assert ResolvedConfig.model_validate(stated) == memory
    assert stated == memory.model_dump(mode="json", by_alias=True)
    by_key = {v["key"]: v for v in stated["values"]}
    assert by_key["zero_optimization.reduce_bucket_size"]["value"] == HIDDEN * HIDDEN
    assert by_key["train_batch_size"]["value"] == 2 * 2 * 1  # dp × micro-batch × accumulation
    assert stated["train_batch_size"] == 4
    assert any("optimizer section is left out of the measured run" in n for n in stated["notes"])


@pytest.mark.parametrize(
    ("section", "precision"), [("bf16", Precision.MIXED_BF16), ("fp16", Precision.MIXED_FP16)]
)
def test_the_config_decides_what_the_request_leaves_out(section: str, precision: Precision) -> None:
    """bf16 or fp16 and stage 3 alone: no precision sent, no offload sent."""
    config = {section: {"enabled": True}, "zero_optimization": {"stage": 3}}
    ms = parse_spec(body(engine_config=config))
    assert (ms.stages, ms.precision) == ((Stage.PARAMETERS,), precision)
    assert ms.ds_config(Stage.PARAMETERS)[section] == {"enabled": True}


def test_an_auto_section_follows_the_other_sections_explicit_precision() -> None:
    """fp16 on in the config, bf16 "auto", no precision sent: as the Trainer leaves args.bf16
    off, bf16 stays off (the request's default precision does not turn it on)."""
    ms = parse_spec(body(engine_config={**trainer_config(2), "fp16": {"enabled": True}}))
    assert ms.precision is Precision.MIXED_FP16
    cfg = ms.ds_config(Stage.GRADIENTS)
    assert (cfg["fp16"]["enabled"], cfg["bf16"]["enabled"]) == (True, False)
    assert refused(
        body(precision="mixed_bf16", engine_config={"fp16": {"enabled": True}, "bf16": {}})
    ) == ("precision", "engine_config.fp16.enabled")


def test_a_config_batch_replaces_the_default_one() -> None:
    config = {
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1},
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
    }
    request = body(engine_config=config)
    del request["batch"]
    ms = parse_spec(request)
    assert ms.batch is not None
    assert (ms.batch.micro_batch_size, ms.batch.grad_accumulation_steps) == (4, 2)
    assert ms.batch.seq_len == TINY_GPT["max_seq_len"]  # the run's default, within the table
    assert ms.plan.grad_accumulation_steps == 2
    cfg = ms.ds_config(Stage.OPTIMIZER)
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (4, 2)


def test_the_config_accumulation_replaces_the_batch_default() -> None:
    config = {"bf16": {"enabled": True}, "gradient_accumulation_steps": 3}
    ms = parse_spec(body(engine_config=config, stages=[2]))
    assert ms.batch is not None and ms.batch.grad_accumulation_steps == 3
    assert ms.plan.grad_accumulation_steps == 3


def test_config_offload_trims_the_stages_and_keeps_its_section() -> None:
    config = {"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": False}}}
    ms = parse_spec(body(engine_config=config))
    assert ms.stages == (Stage.OPTIMIZER, Stage.GRADIENTS, Stage.PARAMETERS)
    assert ms.offload.optimizer is OffloadDevice.CPU
    zero = ms.ds_config(Stage.GRADIENTS)["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": False}


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            {"precision": "mixed_fp16", "engine_config": {"bf16": {"enabled": True}}},
            ("precision", "engine_config.bf16.enabled"),
        ),
        (
            {"engine_config": {"train_micro_batch_size_per_gpu": 8}},
            ("batch.micro_batch_size", "engine_config.train_micro_batch_size_per_gpu"),
        ),
        (
            {"stages": [1, 2], "engine_config": {"zero_optimization": {"stage": 3}}},
            ("stages", "engine_config.zero_optimization.stage"),
        ),
        (
            {
                "offload": {"optimizer": "none"},
                "engine_config": {
                    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}
                },
            },
            ("offload.optimizer", "engine_config.zero_optimization.offload_optimizer.device"),
        ),
        (
            {"optimizer": "adam", "engine_config": {"optimizer": {"type": "AdamW"}}},
            ("optimizer", "engine_config.optimizer.type"),
        ),
    ],
)
def test_an_explicit_contradiction_names_both_fields(
    extra: dict[str, Any], named: tuple[str, ...]
) -> None:
    assert refused(body(**extra)) == named


def test_an_auto_mlp_bucket_reads_its_width() -> None:
    config = {"bf16": {"enabled": True}, "zero_optimization": {"reduce_bucket_size": "auto"}}
    request = body(model={"preset": "mlp-4x256"}, engine_config=config, stages=[2])
    del request["batch"]
    ms = parse_spec(request)
    assert ms.ds_config(Stage.GRADIENTS)["zero_optimization"]["reduce_bucket_size"] == 256 * 256


def test_no_engine_config_keeps_the_request_alone() -> None:
    ms = parse_spec(body(stages=[1]))
    assert ms.resolved is None
    assert ms.ds_config(Stage.OPTIMIZER)["zero_optimization"] == {"stage": 1}


# --- the torch engine: FSDP2 settings ----------------------------------------------------------


def torch_body(**extra: Any) -> dict[str, Any]:
    return body(engine="torch", mode="simulated", **extra)


def test_fsdp2_settings_decide_stage_and_precision() -> None:
    config = {
        "reshard_after_forward": False,
        "mp_policy": {"param_dtype": "float16", "reduce_dtype": "float32"},
    }
    ms = parse_spec(torch_body(engine_config=config))
    assert (ms.stages, ms.precision) == ((Stage.GRADIENTS,), Precision.MIXED_FP16)
    assert ms.resolved is not None
    stated = resolved_config_body(Engine.TORCH, ms.resolved)
    assert ResolvedConfig.model_validate(stated).stage == 2


def test_accelerate_checkpointing_turns_on_full_recomputation() -> None:
    config = {"fsdp_version": 2, "fsdp_activation_checkpointing": True}
    request = torch_body(engine_config=config)
    del request["batch"]
    ms = parse_spec(request)
    assert ms.batch is not None and ms.checkpointing is Checkpointing.FULL
    assert ms.stages == tuple(Stage)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            {"stages": [1, 3], "engine_config": {"offload_policy": {"pin_memory": True}}},
            ("stages", "engine_config.offload_policy"),
        ),
        ({"stages": [3], "offload": {"optimizer": "cpu"}}, ("offload.optimizer",)),
        ({"stages": [2], "offload": {"params": "nvme"}}, ("offload",)),
        ({"engine_config": {"holds_outputs": False}}, ("engine_config.holds_outputs",)),
        (
            {
                "precision": "mixed_bf16",
                "engine_config": {"mp_policy": {"param_dtype": "float16", "reduce_dtype": "fp32"}},
            },
            ("precision", "engine_config.mp_policy.param_dtype"),
        ),
        (
            {"stages": [3], "engine_config": {"reshard_after_forward": False}},
            ("stages", "engine_config.reshard_after_forward"),
        ),
    ],
)
def test_fsdp2_refusals_name_the_fields(extra: dict[str, Any], named: tuple[str, ...]) -> None:
    assert refused(torch_body(**extra)) == named


# --- python -m measure ---------------------------------------------------------------------------


def test_the_cli_sends_only_the_flags_given(tmp_path: Path) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(trainer_config(2)))
    args = ["--architecture", json.dumps(TINY_GPT), "--engine", "deepspeed", "--dp", "2"]
    args += ["--engine-config", str(path), "--micro-batch-size", "2", "--seq-len", "32"]
    request = parse_args(args)
    for key in ("stages", "precision", "optimizer", "offload"):
        assert key not in request
    assert request["batch"] == {"micro_batch_size": 2, "seq_len": 32}
    assert request["engine_config"] == trainer_config(2)
    ms = parse_spec(request)
    assert (ms.stages, ms.optimizer) == ((Stage.GRADIENTS,), Optimizer.ADAMW)
    # "auto" precision follows the flag, as the Trainer's args.fp16 fills it
    fp16 = parse_spec(parse_args([*args, "--precision", "mixed_fp16"]))
    assert fp16.ds_config(Stage.GRADIENTS)["fp16"]["enabled"] is True
