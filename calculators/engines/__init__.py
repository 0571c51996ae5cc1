"""Engine models: how each engine's real allocations and traffic differ from the paper's.

Each model is built from the engine's source code and documented behaviour, never fitted to
measurements: ``paper`` (model states only), ``torch`` (DDP, ZeroRedundancyOptimizer, FSDP2)
and ``deepspeed`` (DeepSpeed 0.19 ZeRO). One folder (or module) per engine holds its memory
profile and its traffic.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from calculators.conventions import Engine, Stage
from calculators.engines import deepspeed, paper, torch
from calculators.estimates import DpEstimates, StageEstimate
from calculators.model_states import TrainingSetup
from calculators.traffic import CommunicationSetup, EngineTraffic


class EngineModel(Protocol):
    """What an engine model offers."""

    @property
    def convention(self) -> str:
        """What the memory figures count."""
        ...

    @property
    def traffic_convention(self) -> str:
        """What the traffic figures count."""
        ...

    def estimate(self, setup: TrainingSetup, stage: Stage) -> StageEstimate:
        """Rank 0's memory under ``stage``."""
        ...

    def estimates(self, setup: TrainingSetup, stages: Sequence[Stage]) -> Iterator[StageEstimate]:
        """``estimate`` for each of ``stages`` in turn, sharing what the stages have in common."""
        ...

    def across_dp(self, setup: TrainingSetup) -> DpEstimates:
        """``estimates`` for ``setup`` and for copies of it under other Nd values (nothing else
        changed), sharing what the Nd values have in common (a sweep asks up to 64 of them)."""
        ...

    def traffic(self, setup: CommunicationSetup, stage: Stage) -> EngineTraffic:
        """The collectives and offload transfers of one optimizer step under ``stage``."""
        ...


MODELS: dict[Engine, EngineModel] = {
    Engine.PAPER: paper.MODEL,
    Engine.TORCH: torch.MODEL,
    Engine.DEEPSPEED: deepspeed.MODEL,
}


def engine_model(engine: Engine) -> EngineModel:
    """The model for ``engine``."""
    return MODELS[engine]
