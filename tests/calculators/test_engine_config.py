"""The config readers as functions: DeepSpeed's batch arithmetic and the Trainer's "auto" rules."""

from __future__ import annotations

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
