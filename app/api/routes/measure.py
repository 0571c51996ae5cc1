"""POST /v1/measure, GET and DELETE /v1/measure/{id}, GET /v1/measurements."""

from __future__ import annotations

import importlib.util
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Response, status

from app.api.convert import resolve_model
from app.api.deps import ApiKeyDep, JobsDep, SettingsDep
from app.jobs.runner import QueueFull
from app.jobs.store import JobStatus
from app.schemas.measure import JobAccepted, JobPublic, JobsPublic, MeasureRequest
from calculators.conventions import Engine
from calculators.errors import InputError
from measure.mlp_presets import mlp_preset

router = APIRouter(prefix="/v1", tags=["measure"], dependencies=[ApiKeyDep])

JobId = Annotated[str, Path(min_length=1, max_length=64, description="The id POST answered.")]

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No job with this id."}}


def _not_found(job_id: str) -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_404_NOT_FOUND,
        detail=[{"field": "id", "msg": f"no measure job {job_id[:64]!r}", "type": "not_found"}],
    )


def check_measurable(req: MeasureRequest) -> None:
    # engine_config and model.hf_config are already bounded JSON (app.schemas.common.JsonObject)
    """Refuse up front (422) what no child could run; the runner checks the rest."""
    if req.model.params is not None:
        raise InputError(
            "model",
            "a measurement builds and trains the model: give architecture, preset or "
            "hf_config, not params",
        )
    # the MLP presets (mlp, mlp-{L}x{h}) are measure's own; every other model resolves as
    # /v1/memory's do
    if req.model.preset is None or mlp_preset(req.model.preset) is None:
        resolve_model(req.model)  # unknown presets and bad hf_config bodies are 422s here
    if req.engine is Engine.PAPER:
        raise InputError("engine", "a measurement runs a real engine: torch or deepspeed")
    if req.engine is Engine.DEEPSPEED and importlib.util.find_spec("deepspeed") is None:
        raise InputError("engine", "DeepSpeed is not installed on this host; use torch")
    if req.engine is Engine.DEEPSPEED and req.mode.value == "simulated":
        raise InputError("mode", "DeepSpeed needs a real process group: use distributed or auto")
    for field in ("tp", "pp"):
        if getattr(req, field) != 1:
            raise InputError(field, "measure runs data parallelism alone: must be 1")


@router.post(
    "/measure",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobAccepted,
    responses={
        401: {"description": "An API key is configured and X-API-Key is missing or wrong."},
        429: {"description": "The queue is full; retry after Retry-After seconds."},
    },
)
def submit_measure(
    request: MeasureRequest, settings: SettingsDep, jobs: JobsDep, response: Response
) -> JobAccepted:
    """Queue a measurement of the real ZeRO engines; poll the Location it answers."""
    check_measurable(request)
    try:
        job = jobs.submit(
            request.model_dump(mode="json"), settings.measure_runner, settings.job_time_limit_s
        )
    except QueueFull as full:
        raise HTTPException(
            status_code=status.HTTP_429_TOO_MANY_REQUESTS,
            detail=[{"field": "", "msg": str(full), "type": "queue_full"}],
            headers={"Retry-After": str(full.retry_after_s)},
        ) from None
    response.headers["Location"] = f"/v1/measure/{job.id}"
    return JobAccepted(id=job.id, status=job.status)


@router.get("/measure/{job_id}", response_model=JobPublic, responses=_NOT_FOUND)
def get_measure(job_id: JobId, jobs: JobsDep) -> JobPublic:
    """A job's status, progress and, once succeeded, its result."""
    job = jobs.store.get(job_id)
    if job is None:
        raise _not_found(job_id)
    return JobPublic.from_job(job)


@router.delete("/measure/{job_id}", response_model=JobPublic, responses=_NOT_FOUND)
def cancel_measure(job_id: JobId, jobs: JobsDep) -> JobPublic:
    """Cancel a queued or running job (its child is killed); a finished job is left as it is."""
    job = jobs.cancel(job_id)
    if job is None:
        raise _not_found(job_id)
    return JobPublic.from_job(job)


@router.get("/measurements", response_model=JobsPublic)
def list_measurements(
    jobs: JobsDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Jobs per page.")] = 20,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="Jobs to skip.")] = 0,
    status_: Annotated[
        JobStatus | None, Query(alias="status", description="Only jobs in this state.")
    ] = None,
) -> JobsPublic:
    """Stored measure jobs with their results, newest first."""
    return JobsPublic(
        data=[JobPublic.from_job(job) for job in jobs.store.page(limit, offset, status_)],
        count=jobs.store.count(status_),
        limit=limit,
        offset=offset,
    )
