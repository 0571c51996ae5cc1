"""What the memory engines return: one stage's estimate, and a setup's estimates."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from calculators.conventions import Stage
from calculators.model_states import Placement, TrainingSetup


@dataclass(frozen=True)
class StageEstimate:
    """What one rank holds under one stage.

    Attributes:
        stage: the ZeRO stage.
        device: model states on the device (parameters, gradients, optimizer states).
        cpu: model states (and pinned buffers, in ``cpu_buffers``) in host memory.
        nvme: model states on NVMe.
        activations: activation bytes at the peak, when a batch and architecture are known.
        temporary_buffers: engine buffers (buckets, gathered parameters) at the peak.
        resident: bytes allocated on the device between optimizer steps.
        peak: the highest bytes allocated during a step, when it can be estimated.
        components: named engine-specific parts of ``resident``/``peak`` (bytes).
        cpu_buffers: host bytes beyond model states (pinned staging buffers).
        cpu_activations: pinned host bytes holding the checkpointed layers' inputs
            (``batch.checkpoint_offload``) at the end of forward.
        notes: what the figure assumes, in short sentences.
        theory: the ZeRO paper's model states for the same setup (the first rung of the
            theory → allocated → reserved → device breakdown).
    """

    stage: Stage
    device: Placement
    cpu: Placement
    nvme: Placement
    resident: int
    activations: int | None = None
    temporary_buffers: int | None = None
    peak: int | None = None
    components: Mapping[str, int] = field(default_factory=dict)
    cpu_buffers: int = 0
    notes: tuple[str, ...] = ()
    cpu_activations: int = 0
    theory: int | None = None

    @property
    def model_states(self) -> int:
        return self.device.total

    def fits(self, device_memory: int) -> bool:
        """Whether the binding figure (peak if known, else resident) fits ``device_memory``."""
        needed = self.peak if self.peak is not None else self.resident
        return needed <= device_memory


def stage_estimate(
    stage: Stage,
    device: Placement,
    cpu: Placement,
    nvme: Placement,
    resident: int,
    activations: int | None,
    peak: int | None,
    notes: tuple[str, ...],
    theory: int | None,
    temporary_buffers: int | None = None,
    components: Mapping[str, int] | None = None,
    cpu_buffers: int = 0,
    cpu_activations: int = 0,
) -> StageEstimate:
    """``StageEstimate(...)``, its fields set at once: the frozen dataclass's ``__init__`` sets
    each through ``object.__setattr__``, a fifth of the paper question's answer (and a sweep
    builds one per stage and Nd). ``components`` None is a fresh empty mapping, as the
    constructor's default. Equal to the constructor's (tests/calculators/test_estimates.py)."""
    est = object.__new__(StageEstimate)
    est.__dict__.update(
        stage=stage,
        device=device,
        cpu=cpu,
        nvme=nvme,
        resident=resident,
        activations=activations,
        temporary_buffers=temporary_buffers,
        peak=peak,
        components={} if components is None else components,
        cpu_buffers=cpu_buffers,
        notes=notes,
        theory=theory,
        cpu_activations=cpu_activations,
    )
    return est


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimates for several stages of one setup."""

    setup: TrainingSetup
    stages: tuple[StageEstimate, ...]
    convention: str


DpEstimates = Callable[[TrainingSetup, Sequence[Stage]], Iterator[StageEstimate]]
"""(setup, stages) -> the stages' estimates, for setups that differ only in Nd (``across_dp``)."""
