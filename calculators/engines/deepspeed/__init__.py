"""DeepSpeed 0.19.8 ZeRO: memory (``memory``, ``layouts``, ``allocator``) and traffic
(``traffic``) from one reading of its config (``config``), its buckets (``buckets``) and its
stage-3 parameter coordinator (``stage3``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from calculators.conventions import Stage
from calculators.engines.deepspeed import memory, traffic
from calculators.engines.deepspeed.config import Knobs, param_list, parse_config
from calculators.engines.deepspeed.stage3 import stage3_trace
from calculators.estimates import DpEstimates, StageEstimate
from calculators.model_states import TrainingSetup
from calculators.traffic import CommunicationSetup, EngineTraffic


@dataclass(frozen=True)
class DeepSpeedModel:
    convention: str = memory.CONVENTION
    traffic_convention: str = traffic.TRAFFIC_CONVENTION

    def estimate(self, setup: TrainingSetup, stage: Stage) -> StageEstimate:
        return memory.estimate(setup, stage)

    def estimates(self, setup: TrainingSetup, stages: Sequence[Stage]) -> Iterator[StageEstimate]:
        shared = memory.Shared(setup)  # the config read and the workload worked out once
        return (memory.estimate(setup, stage, shared) for stage in stages)

    def across_dp(self, setup: TrainingSetup) -> DpEstimates:
        # the config, the parameter sizes, the workload and stage 0 do not depend on Nd
        shared = memory.Shared(setup)

        def at(at_dp: TrainingSetup, stages: Sequence[Stage]) -> Iterator[StageEstimate]:
            return (memory.estimate(at_dp, stage, shared) for stage in stages)

        return at

    def traffic(self, setup: CommunicationSetup, stage: Stage) -> EngineTraffic:
        return traffic.traffic(setup, stage)


MODEL = DeepSpeedModel()

__all__ = ["MODEL", "DeepSpeedModel", "Knobs", "param_list", "parse_config", "stage3_trace"]
