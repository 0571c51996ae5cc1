"""Engine profiles: how each engine's real allocations differ from the paper's accounting.

Each profile is modelled from the engine's source code and documented behaviour, never fitted
to measurements: ``paper`` (model states only), ``torch`` (DDP, ZeroRedundancyOptimizer, FSDP2)
and ``deepspeed`` (DeepSpeed 0.19 ZeRO).
"""

from __future__ import annotations

from typing import Protocol

from calculators.conventions import Engine, Stage
from calculators.memory import StageEstimate
from calculators.model_states import TrainingSetup


class EngineModel(Protocol):
    """What an engine profile offers."""

    @property
    def convention(self) -> str: ...

    def estimate(self, setup: TrainingSetup, stage: Stage) -> StageEstimate: ...


def engine_model(engine: Engine) -> EngineModel:
    """The profile for ``engine``."""
    # imported here: the profiles import calculators.memory, which asks for them
    from calculators.engines import deepspeed, paper, torch_engines

    models: dict[Engine, EngineModel] = {
        Engine.PAPER: paper.MODEL,
        Engine.TORCH: torch_engines.MODEL,
        Engine.DEEPSPEED: deepspeed.MODEL,
    }
    return models[engine]
