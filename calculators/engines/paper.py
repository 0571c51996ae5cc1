"""The ZeRO paper's accounting (arXiv 1910.02054 §3.1, §5): model states only."""

from __future__ import annotations

from dataclasses import dataclass

from calculators.conventions import Stage
from calculators.memory import StageEstimate
from calculators.model_states import TrainingSetup, model_state_memory


@dataclass(frozen=True)
class PaperModel:
    convention: str = (
        "paper: ZeRO (arXiv 1910.02054) §5 model states, 2Ψ + 2Ψ + KΨ partitioned over Nd; "
        "no activations, buffers or allocator overhead"
    )

    def estimate(self, setup: TrainingSetup, stage: Stage) -> StageEstimate:
        states = model_state_memory(setup, stage)
        return StageEstimate(
            stage=stage,
            device=states.device,
            cpu=states.cpu,
            nvme=states.nvme,
            resident=states.device.total,
        )


MODEL = PaperModel()
