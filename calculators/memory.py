"""Per-device memory estimates for a list of stages under one engine's accounting."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from calculators.conventions import Engine, Stage
from calculators.engines import engine_model
from calculators.errors import InputError
from calculators.estimates import MemoryEstimate, StageEstimate
from calculators.model_states import TrainingSetup, model_state_total


def estimate(setup: TrainingSetup, stages: Iterable[Stage]) -> MemoryEstimate:
    """Estimate each stage with the engine ``setup.engine`` names."""
    model = engine_model(setup.engine)
    return _with_theories(setup, model.estimates(setup, _stages(stages)), model.convention)


def across_dp(
    setup: TrainingSetup, stages: Iterable[Stage], theory: bool = True
) -> Callable[[int], MemoryEstimate]:
    """``estimate`` of ``setup`` under any Nd (its other fields unchanged): what the engine
    works out that does not depend on Nd is worked out once for every Nd asked.

    ``theory`` False leaves each stage's ``theory`` as the engine gives it (the paper's model
    states for the paper engine, None for the others), for answers that do not carry it."""
    model = engine_model(setup.engine)
    at = model.across_dp(setup)
    asked = _stages(stages)
    convention = model.convention

    def at_dp(dp: int) -> MemoryEstimate:
        at_setup = setup if dp == setup.dp else with_dp(setup, dp)
        if not theory:
            return MemoryEstimate(
                setup=at_setup, stages=tuple(at(at_setup, asked)), convention=convention
            )
        return _with_theories(at_setup, at(at_setup, asked), convention)

    return at_dp


def _stages(stages: Iterable[Stage]) -> list[Stage]:
    return [s if type(s) is Stage else Stage(s) for s in stages]


def _with_theories(
    setup: TrainingSetup, estimates: Iterable[StageEstimate], convention: str
) -> MemoryEstimate:
    """The engine's estimates with the ZeRO paper's model states beside them."""
    if setup.engine is Engine.PAPER:  # the paper's model states are their own theory
        return MemoryEstimate(setup=setup, stages=tuple(estimates), convention=convention)
    results = []
    for est in estimates:
        theory: int | None
        try:
            theory = model_state_total(setup, est.stage)
        except InputError:  # a setup the engine runs but the paper's accounting cannot
            theory = None
        results.append(with_theory(est, theory))
    return MemoryEstimate(setup=setup, stages=tuple(results), convention=convention)


def with_dp(setup: TrainingSetup, dp: int) -> TrainingSetup:
    """``dataclasses.replace(setup, dp=dp)`` without re-running ``__init__`` over every field
    (a shallow copy: the fields are immutable); ``dp`` checked as ``__post_init__`` does."""
    if dp < 1:
        raise InputError("dp", "must be at least 1")
    copy = object.__new__(TrainingSetup)
    copy.__dict__.update(setup.__dict__)
    copy.__dict__["dp"] = dp
    return copy


def with_theory(est: StageEstimate, theory: int | None) -> StageEstimate:
    """``est`` with ``theory`` set: ``dataclasses.replace`` without re-running ``__init__``
    over every field (a shallow copy: the fields are immutable)."""
    if est.theory == theory:
        return est
    copy = object.__new__(StageEstimate)
    copy.__dict__.update(est.__dict__)
    object.__setattr__(copy, "theory", theory)
    return copy


__all__ = ["Engine", "MemoryEstimate", "StageEstimate", "across_dp", "estimate"]
