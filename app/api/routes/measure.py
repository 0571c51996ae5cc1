"""POST /v1/measure, GET and DELETE /v1/measure/{id}, GET /v1/measurements."""

from __future__ import annotations

import importlib
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Response, status

from app.api.deps import ApiKeyDep, JobsDep, SettingsDep, check_measure_limits
from app.jobs.runner import QueueFull
from app.jobs.store import JobStatus
from app.schemas.measure import JobAccepted, JobPublic, JobsPublic, MeasureRequest
from measure.spec import CONFIG_DECIDES, parse_spec

router = APIRouter(prefix="/v1", tags=["measure"], dependencies=[ApiKeyDep])

JobId = Annotated[str, Path(min_length=1, max_length=64, description="The id POST answered.")]

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No job with this id."}}


def _not_found(job_id: str) -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_404_NOT_FOUND,
        detail=[{"field": "id", "msg": f"no measure job {job_id[:64]!r}", "type": "not_found"}],
    )


DEFAULT_RUNNER = "measure.runner:run"


def job_body(request: MeasureRequest) -> dict[str, Any]:
    """The body the job runs and stores: the request with defaults filled in, except, with an
    ``engine_config``, the fields the config decides that the request left out (the config
    decides them, ``result.resolved_config`` says how; a field present must agree with it)."""
    body = request.model_dump(mode="json")
    if request.engine_config is None:
        return body
    sent = request.model_dump(mode="json", exclude_unset=True)
    for name in CONFIG_DECIDES:
        part, _, key = name.partition(".")
        if not key:
            if part not in sent:
                del body[part]
            elif isinstance(sent[part], dict):
                body[part] = sent[part]  # offload: only the devices the request names
        elif isinstance(body.get(part), dict) and key not in sent.get(part, {}):
            del body[part][key]
    return body


def check_measurable(body: dict[str, Any], runner: str) -> None:
    """Refuse up front (422) what no child could run, under the rules every rank reads it by
    (``measure.spec.parse_spec``); with the shipped runner, also a long run on this host's CPU
    that the request did not ask for."""
    spec = parse_spec(body)
    if runner in (DEFAULT_RUNNER, DEFAULT_RUNNER.replace(":", ".")):
        # the shipped runner's module imports torch: loaded only where it is the runner
        importlib.import_module("measure.runner").check_cpu_run(spec)


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
    body = job_body(request)
    check_measurable(body, settings.measure_runner)
    check_measure_limits(request, settings)
    try:
        job = jobs.submit(body, settings.measure_runner, settings.job_time_limit_s)
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
