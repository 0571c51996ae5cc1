"""The ZeRO paper's accounting (arXiv 1910.02054 §3.1, §5): model states only."""

from __future__ import annotations

from dataclasses import dataclass

from calculators.activations import Regime, activations
from calculators.conventions import Precision, Stage
from calculators.memory import StageEstimate
from calculators.model_states import TrainingSetup, model_state_memory


@dataclass(frozen=True)
class PaperModel:
    convention: str = (
        "paper: ZeRO (arXiv 1910.02054) §5 model states, 2Ψ + 2Ψ + KΨ partitioned over Nd; "
        "with an architecture and a batch, peak adds the activations a 16-bit forward keeps "
        "for backward (Korthikanti et al. 2022 §4, SDPA attention); no buffers or allocator "
        "overhead"
    )

    def estimate(self, setup: TrainingSetup, stage: Stage) -> StageEstimate:
        states = model_state_memory(setup, stage)
        resident = states.device.total
        notes = ["temporary_buffers is null: the paper counts no engine buffers"]
        acts = peak = None
        if setup.architecture is not None and setup.batch is not None:
            # everything autograd holds when forward and the loss are done, the paper's 16-bit
            # activations (34·s·b·h per layer for ffn = 4h) on the first pipeline stage
            regime = Regime.FP32 if setup.precision is Precision.FP32 else Regime.HALF
            acts = activations(
                setup.architecture, setup.batch, regime, tp=setup.tp, pp=setup.pp
            ).end_of_forward
            peak = resident + acts
            notes.append(f"activations in {regime.value} regime; peak = model states + activations")
        else:
            notes.append(
                "activations and peak are null: they need "
                + ("a batch" if setup.architecture is not None else "an architecture and a batch")
            )
        return StageEstimate(
            stage=stage,
            device=states.device,
            cpu=states.cpu,
            nvme=states.nvme,
            resident=resident,
            activations=acts,
            peak=peak,
            notes=tuple(notes),
        )


MODEL = PaperModel()
