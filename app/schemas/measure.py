"""POST /v1/measure, GET /v1/measure/{id}, GET /v1/measurements: requests and jobs."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, Field, StrictBool, StrictInt

from app.jobs.store import Job, JobStatus
from app.schemas.memory import TrainingIn
from app.schemas.model import BatchIn, ModelSpec
from calculators.conventions import Engine, Precision
from calculators.traffic import GradSync
from measure.spec import STEPS, WARMUP_STEPS


class Mode(StrEnum):
    """How the data-parallel world of ``dp`` ranks is made."""

    SIMULATED = "simulated"
    """One device; the other ranks are simulated by PyTorch's fake process group."""
    DISTRIBUTED = "distributed"
    """One process per local GPU over NCCL (gloo on CPU)."""
    AUTO = "auto"
    """distributed when the host has dp devices, else simulated."""


class Device(StrEnum):
    CUDA = "cuda"
    CPU = "cpu"
    AUTO = "auto"


class MeasureRequest(TrainingIn):
    """Train the model for a few steps under each requested stage and compare with the
    prediction; the model must be buildable (architecture, preset or hf_config)."""

    model: ModelSpec = Field(description="The model: architecture, preset or hf_config.")
    batch: BatchIn | None = Field(None, description="Micro-batch; null = the runner's default.")
    engine: Engine = Field(Engine.TORCH, description="The engine that runs: torch or deepspeed.")
    mode: Mode = Field(Mode.AUTO, description="simulated, distributed or auto.")
    device: Device = Field(Device.AUTO, description="cuda, cpu or auto.")
    precision: Precision = Field(
        Precision.MIXED_BF16, description="Training precision (bf16 needs no loss scaling)."
    )
    steps: Annotated[StrictInt, Field(ge=STEPS[0], le=STEPS[1])] = Field(
        2, description="Measured training steps per stage."
    )
    warmup_steps: Annotated[StrictInt, Field(ge=WARMUP_STEPS[0], le=WARMUP_STEPS[1])] = Field(
        2, description="Steps run first, so lazily created optimizer states are counted."
    )
    seed: Annotated[StrictInt, Field(ge=0, le=2**31 - 1)] = Field(
        0, description="Seed of the weights and the synthetic batch."
    )
    allow_slow_cpu: StrictBool = Field(
        False,
        description="Run on the CPU even when the run's arithmetic alone is estimated at more "
        "than a minute there (otherwise such a request is refused with a 422).",
    )
    hold_outputs: StrictBool = Field(
        True,
        description="Keep the last logits and loss referenced between steps, as a training "
        "loop that rebinds them does (the torch engine's prediction assumes the same).",
    )
    host_probe: StrictBool | None = Field(
        None,
        description="Also time the training micro-step (forward + backward) at one sequence of "
        "32 tokens after the timed steps: the host's dispatch time, from which "
        "POST /v1/calibrations sets the host cost per kernel. null = on a GPU, off on the CPU.",
    )
    grad_sync: GradSync = Field(
        GradSync.PER_MICRO_STEP,
        description="Under gradient accumulation, when DDP (engine torch, stages 0 and 1) "
        "reduces gradients: per_micro_step after every micro-batch's backward; per_step runs "
        "the other micro-steps under no_sync, as accelerate and the Trainer do. FSDP2 (stages "
        "2 and 3) reduces on every micro-step and DeepSpeed as its config says, so per_step is "
        "refused with those.",
    )


def _utc(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


class Progress(BaseModel):
    fraction: float = Field(ge=0, le=1, description="Share of the job done, 0 to 1.")
    message: str = Field(description="What the job is doing now.")


class JobPublic(BaseModel):
    """A measure job and, once it succeeded, its result."""

    id: str
    status: JobStatus
    progress: Progress
    error: str | None = Field(description="Why the job failed (null unless failed).")
    result: dict[str, Any] | None = Field(
        description="The runner's answer (``runs[]``) once succeeded."
    )
    request: dict[str, Any] = Field(
        description="The request, defaults filled in; with engine_config, the fields the config "
        "decides are as sent (result.resolved_config gives the values the run used)."
    )
    time_limit_s: float = Field(description="Wall-clock limit the job runs under.")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def from_job(cls, job: Job) -> JobPublic:
        return cls(
            id=job.id,
            status=job.status,
            progress=Progress(fraction=job.progress, message=job.message),
            error=job.error,
            result=job.result,
            request=job.request,
            time_limit_s=job.time_limit_s,
            created_at=datetime.fromtimestamp(job.created_at, UTC),
            started_at=_utc(job.started_at),
            finished_at=_utc(job.finished_at),
        )


class JobAccepted(BaseModel):
    """202: the job is queued; poll the Location."""

    id: str
    status: JobStatus


class JobsPublic(BaseModel):
    """Stored jobs, newest first."""

    data: list[JobPublic]
    count: int = Field(description="Jobs stored in all (matching the status filter).")
    limit: int
    offset: int
