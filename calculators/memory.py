"""Per-device memory estimates for a list of stages under one engine's accounting."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from calculators.conventions import Engine, Stage
from calculators.engines import engine_model
from calculators.errors import InputError
from calculators.estimates import MemoryEstimate, StageEstimate
from calculators.model_states import TrainingSetup


def estimate(setup: TrainingSetup, stages: Iterable[Stage]) -> MemoryEstimate:
    """Estimate each stage with the engine ``setup.engine`` names."""
    model = engine_model(setup.engine)
    paper = engine_model(Engine.PAPER)
    results = []
    for s in stages:
        est = model.estimate(setup, Stage(s))
        theory: int | None = est.model_states
        if setup.engine is not Engine.PAPER:
            try:
                theory = paper.estimate(setup, Stage(s)).model_states
            except InputError:  # a setup the engine runs but the paper's accounting cannot
                theory = None
        results.append(replace(est, theory=theory))
    return MemoryEstimate(setup=setup, stages=tuple(results), convention=model.convention)


__all__ = ["Engine", "MemoryEstimate", "StageEstimate", "estimate"]
