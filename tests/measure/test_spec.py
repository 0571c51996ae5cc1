"""measure.spec: the one reading of a measure request, torch-free, with the schema's bounds."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from app.schemas.measure import MeasureRequest
from calculators.errors import InputError
from measure.spec import CPU_LIMIT_S, check_cpu_cost, cpu_flops, model_params, parse_spec

GPT = {"layers": 2, "hidden": 64, "heads": 2, "vocab_size": 128, "max_seq_len": 32}


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": {"architecture": GPT}, "dp": 4, "device": "cpu", **extra}


def test_spec_imports_no_torch() -> None:
    code = "import sys, measure.spec; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize(
    ("key", "value", "accepted"),
    [
        ("steps", 1, True),
        ("steps", 100, True),
        ("steps", 0, False),
        ("steps", 101, False),
        ("warmup_steps", 20, True),
        ("warmup_steps", 21, False),
    ],
)
def test_step_bounds_are_the_schemas(key: str, value: int, accepted: bool) -> None:
    body = _body(**{key: value})
    schema_ok = True
    try:
        MeasureRequest.model_validate(body)
    except ValueError:
        schema_ok = False
    spec_ok = True
    try:
        parse_spec(body)
    except InputError as err:
        assert err.field == key
        spec_ok = False
    assert (schema_ok, spec_ok) == (accepted, accepted)


def test_cpu_cost_counts_every_step_stage_and_token() -> None:
    spec = parse_spec(
        _body(
            stages=[0, 3],
            steps=3,
            warmup_steps=2,
            batch={"micro_batch_size": 2, "seq_len": 16, "grad_accumulation_steps": 2},
        )
    )
    params = model_params(spec)
    assert params is not None
    # 6 FLOP per parameter and token; (2 warm-up + 1 recorded + 3 timed) steps x 2 micro-batches
    # x 2 stages; a simulated world runs one rank
    assert cpu_flops(spec, params) == 6 * params * (2 * 16) * (6 * 2 * 2)


def test_a_long_cpu_run_is_refused_unless_asked_for() -> None:
    body = _body(model={"preset": "llama2-7b"}, batch={"micro_batch_size": 1, "seq_len": 512})
    spec = parse_spec(body)
    params = model_params(spec)
    assert params is not None
    rate = cpu_flops(spec, params) / (10 * CPU_LIMIT_S)  # a host that needs ten times the limit
    with pytest.raises(InputError) as err:
        check_cpu_cost(spec, params, rate)
    assert err.value.field == "device" and "allow_slow_cpu" in err.value.message
    allowed = parse_spec({**body, "allow_slow_cpu": True})
    assert check_cpu_cost(allowed, params, rate) == pytest.approx(10 * CPU_LIMIT_S)


@pytest.mark.parametrize(("value", "read"), [(None, None), (True, True), (False, False)])
def test_host_probe_is_a_flag_or_left_to_the_device(value: bool | None, read: bool | None) -> None:
    body = _body() if value is None else _body(host_probe=value)
    assert parse_spec(body).host_probe is read
    assert MeasureRequest(**body).host_probe is read
    from measure.__main__ import parse_args

    flag = [] if value is None else ["--host-probe" if value else "--no-host-probe"]
    args = ["--architecture", '{"layers": 2, "hidden": 64, "heads": 2, "vocab_size": 128}']
    assert parse_args([*args, *flag])["host_probe"] is read


def test_trainer_loop_keeps_the_loss_alone() -> None:
    from measure.hf_families import family_config

    hf = {"model": {"hf_config": family_config("llama", "tiny")}, "engine": "torch"}
    spec = parse_spec(_body(**hf, engine_config={"trainer_loop": True}))
    assert spec.plan.hold_outputs is False
    with pytest.raises(InputError) as err:
        parse_spec(_body(**hf, engine_config={"trainer_loop": True}, hold_outputs=True))
    assert err.value.field == "hold_outputs"
    with pytest.raises(InputError) as err:  # measure's own GPT computes no loss from labels
        parse_spec(_body(engine="torch", engine_config={"trainer_loop": True}))
    assert err.value.field == "engine_config.trainer_loop"
