"""PyTorch's own engines (DDP, ZeroRedundancyOptimizer, FSDP2): memory (``memory``, with the
step's peak in ``peak``) and traffic (``traffic``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from calculators.conventions import Stage
from calculators.engines.torch import memory, traffic
from calculators.estimates import DpEstimates, StageEstimate
from calculators.model_states import TrainingSetup
from calculators.traffic import CommunicationSetup, EngineTraffic


@dataclass(frozen=True)
class TorchModel:
    convention: str = memory.CONVENTION
    traffic_convention: str = traffic.TRAFFIC_CONVENTION

    def estimate(self, setup: TrainingSetup, stage: Stage) -> StageEstimate:
        return memory.estimate(setup, stage)

    def estimates(self, setup: TrainingSetup, stages: Sequence[Stage]) -> Iterator[StageEstimate]:
        return (memory.estimate(setup, stage) for stage in stages)

    def across_dp(self, setup: TrainingSetup) -> DpEstimates:  # noqa: ARG002
        # nothing worth sharing across Nd: each Nd is estimated afresh
        return self.estimates

    def traffic(self, setup: CommunicationSetup, stage: Stage) -> EngineTraffic:
        return traffic.traffic(setup, stage)


MODEL = TorchModel()

__all__ = ["MODEL", "TorchModel"]
