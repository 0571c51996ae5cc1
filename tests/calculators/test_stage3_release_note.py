"""DeepSpeed stage 3 says when its figure may read low: models above
``stage3_max_reuse_distance`` whose simulated coordinator releases parameters after forward (the
measured runs at DeepSpeed's defaults kept every one gathered)."""

from __future__ import annotations

from typing import Any

from calculators.architecture import count_params
from calculators.batch import Batch
from calculators.conventions import Engine, Precision, Stage
from calculators.engines.deepspeed import MODEL
from calculators.hf_config import architecture_from_hf_config
from calculators.model_states import TrainingSetup
from measure.hf_families import family_config

NOTE = "may read low"


def _notes(family: str, zero: dict[str, Any]) -> list[str]:
    arch = architecture_from_hf_config(family_config(family, "medium"))
    setup = TrainingSetup(
        params=count_params(arch),
        dp=2,
        precision=Precision.MIXED_BF16,
        engine=Engine.DEEPSPEED,
        architecture=arch,
        batch=Batch(2, 1024),
        engine_config={"zero_optimization": {"stage": 3, **zero}},
    )
    return [n for n in MODEL.estimate(setup, Stage.PARAMETERS).notes if NOTE in n]


def test_large_moe_at_defaults_is_flagged() -> None:
    (note,) = _notes("mixtral", {})
    assert "releases 40 parameters" in note


def test_model_within_the_reuse_distance_is_not_flagged() -> None:
    assert _notes("llama", {}) == []


def test_lowered_knobs_are_not_flagged() -> None:
    assert _notes("mixtral", {"stage3_max_reuse_distance": 100_000_000}) == []


def test_knobs_above_the_model_keep_everything_gathered() -> None:
    assert (
        _notes(
            "mixtral", {"stage3_max_reuse_distance": 10**12, "stage3_max_live_parameters": 10**12}
        )
        == []
    )
