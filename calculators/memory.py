"""Per-device memory estimates for a list of stages under one engine's accounting."""

from __future__ import annotations

from collections.abc import Iterable

from calculators.conventions import Engine, Stage
from calculators.engines import engine_model
from calculators.errors import InputError
from calculators.estimates import MemoryEstimate, StageEstimate
from calculators.model_states import TrainingSetup, model_state_memory


def estimate(setup: TrainingSetup, stages: Iterable[Stage]) -> MemoryEstimate:
    """Estimate each stage with the engine ``setup.engine`` names."""
    model = engine_model(setup.engine)
    asked = [s if type(s) is Stage else Stage(s) for s in stages]
    if setup.engine is Engine.PAPER:  # the paper's model states are their own theory
        return MemoryEstimate(
            setup=setup, stages=tuple(model.estimates(setup, asked)), convention=model.convention
        )
    results = []
    for est in model.estimates(setup, asked):
        stage = est.stage
        theory: int | None
        try:
            theory = model_state_memory(setup, stage).device.total
        except InputError:  # a setup the engine runs but the paper's accounting cannot
            theory = None
        results.append(with_theory(est, theory))
    return MemoryEstimate(setup=setup, stages=tuple(results), convention=model.convention)


def with_theory(est: StageEstimate, theory: int | None) -> StageEstimate:
    """``est`` with ``theory`` set: ``dataclasses.replace`` without re-running ``__init__``
    over every field (a shallow copy: the fields are immutable)."""
    if est.theory == theory:
        return est
    copy = object.__new__(StageEstimate)
    copy.__dict__.update(est.__dict__)
    object.__setattr__(copy, "theory", theory)
    return copy


__all__ = ["Engine", "MemoryEstimate", "StageEstimate", "estimate"]
