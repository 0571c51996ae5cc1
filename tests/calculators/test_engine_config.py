"""The config readers as functions: DeepSpeed's batch arithmetic and the Trainer's "auto" rules."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.config_resolution import Requested
from calculators.conventions import Optimizer, Precision, Stage
from calculators.engines.deepspeed.config import resolve_config
from calculators.errors import InputError
from calculators.model_states import Offload


def asked(dp: int = 8, hidden: int | None = None) -> Requested:
    return Requested(
        stages=tuple(Stage),
        precision=Precision.MIXED_BF16,
        offload=Offload(),
        optimizer=Optimizer.ADAM,
        dp=dp,
        hidden=hidden,
    )


BF16_Z2 = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}

small = st.integers(min_value=1, max_value=64)


@settings(deadline=None)
@given(dp=small, micro=small, steps=small)
def test_two_of_three_batch_keys_give_the_third(dp: int, micro: int, steps: int) -> None:
    """runtime/config.py _set_batch_related_parameters, then _batch_assertion holds."""
    train = dp * micro * steps
    for given_keys in (
        {"train_batch_size": train, "train_micro_batch_size_per_gpu": micro},
        {"train_batch_size": train, "gradient_accumulation_steps": steps},
        {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": steps},
    ):
        d = resolve_config({**BF16_Z2, **given_keys}, asked(dp=dp))
        assert (d.micro_batch, d.grad_accumulation, d.train_batch) == (micro, steps, train)


@settings(deadline=None)
@given(dp=small, micro=small, steps=small, extra=st.integers(min_value=1, max_value=7))
def test_an_inconsistent_global_batch_is_refused(
    dp: int, micro: int, steps: int, extra: int
) -> None:
    config = {
        **BF16_Z2,
        "train_batch_size": dp * micro * steps + extra,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": steps,
    }
    with pytest.raises(InputError) as err:
        resolve_config(config, asked(dp=dp))
    assert err.value.field == "engine_config.train_batch_size"


@settings(deadline=None)
@given(hidden=st.integers(min_value=1, max_value=65536))
def test_hidden_size_autos_follow_the_trainer(hidden: int) -> None:
    zero = {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    }
    d = resolve_config({"bf16": {"enabled": True}, "zero_optimization": zero}, asked(hidden=hidden))
    z = d.config["zero_optimization"]
    assert z["reduce_bucket_size"] == hidden * hidden
    assert z["stage3_prefetch_bucket_size"] == int(0.9 * hidden * hidden)
    assert z["stage3_param_persistence_threshold"] == 10 * hidden
    assert d.stages == (Stage.PARAMETERS,)


def test_the_callers_config_is_left_as_it_was() -> None:
    config = {"bf16": {"enabled": "auto"}, "zero_optimization": {"reduce_bucket_size": "auto"}}
    resolve_config(config, asked(hidden=64))
    assert config == {
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"reduce_bucket_size": "auto"},
    }


@pytest.mark.parametrize(
    "config",
    [
        {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3},
        {"train_batch_size": 24, "gradient_accumulation_steps": 4},
        {"train_micro_batch_size_per_gpu": 5, "gradient_accumulation_steps": 2},
        {"train_batch_size": 24},
        {"train_micro_batch_size_per_gpu": 7},
    ],
)
@pytest.mark.parametrize(
    "zero",
    [
        {"stage": 2, "stage3_prefetch_bucket_size": "auto", "reduce_bucket_size": 1000},
        {"stage": 3, "sub_group_size": "auto", "overlap_comm": "auto"},
        {"stage": 1, "overlap_comm": True, "allgather_bucket_size": 12345},
    ],
)
def test_batch_and_knobs_match_deepspeeds_own_config(
    config: dict[str, int], zero: dict[str, object]
) -> None:
    """DeepSpeed's DeepSpeedConfig (world size 1 outside torch.distributed) reads the same body
    to the same batch and knobs (needs deepspeed installed)."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    body = {"bf16": {"enabled": True}, **config, "zero_optimization": zero}
    ds = DeepSpeedConfig(json.loads(json.dumps(body)))
    ours = resolve_config(body, asked(dp=ds.world_size))
    assert (ours.train_batch, ours.micro_batch, ours.grad_accumulation) == (
        ds.train_batch_size,
        ds.train_micro_batch_size_per_gpu,
        ds.gradient_accumulation_steps,
    )
    got = {v.key.removeprefix("zero_optimization."): v.value for v in ours.values}
    z = ds.zero_config
    assert got["reduce_bucket_size"] == z.reduce_bucket_size
    assert got["allgather_bucket_size"] == z.allgather_bucket_size
    assert got["sub_group_size"] == z.sub_group_size
    assert got["stage3_prefetch_bucket_size"] == z.prefetch_bucket_size
    assert got["stage3_param_persistence_threshold"] == z.param_persistence_threshold
    assert got["overlap_comm"] == z.overlap_comm


def test_granularity_leaves_are_said_to_be_unmodelled() -> None:
    zero = {"stage": 3, "stage3_module_granularity_threshold": 5000}
    d = resolve_config({"bf16": {"enabled": True}, "zero_optimization": zero}, asked())
    assert any("stage3_module_granularity_threshold" in n for n in d.notes)
    plain = resolve_config({"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}, asked())
    assert not any("granularity" in n for n in plain.notes)
