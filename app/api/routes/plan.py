"""POST /v1/plan, GET /v1/gpus, POST and GET /v1/calibrations."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Request, status
from pydantic import BaseModel

from app.api.calibrate import measured_run
from app.api.convert import plan_gpu, plan_setup
from app.api.deps import ApiKeyDep, JobsDep, SettingsDep
from app.api.examples import CALIBRATION_EXAMPLES, PLAN_EXAMPLES
from app.api.presenters import plan_response
from app.jobs.store import Calibration, JobStore
from app.schemas.plan import (
    CalibrationPublic,
    CalibrationRequest,
    CalibrationsPublic,
    PlanRequest,
    PlanResponse,
)
from calculators.gpus import PRESETS, Gpu, get_gpu
from calculators.plan import Efficiency, plan

router = APIRouter(prefix="/v1", tags=["plan"])


def calibration_store(request: Request, settings: SettingsDep) -> Iterator[JobStore]:
    """The running service's store; without the lifespan (the CLI answering in-process), the
    same SQLite file opened for this request."""
    jobs = getattr(request.app.state, "jobs", None)
    if jobs is not None:
        yield jobs.store
        return
    store = JobStore(settings.db_path)
    try:
        yield store
    finally:
        store.close()


StoreDep = Annotated[JobStore, Depends(calibration_store)]


@router.post("/plan", response_model=PlanResponse)
def plan_route(
    request: Annotated[PlanRequest, Body(openapi_examples=PLAN_EXAMPLES)], store: StoreDep
) -> PlanResponse:
    """Every ZeRO configuration of the search that fits, ranked by predicted tokens/s."""
    gpu = plan_gpu(request.gpu)
    efficiency = efficiency_for(request, gpu, store)
    return plan_response(plan(plan_setup(request, gpu, efficiency)))


def efficiency_for(request: PlanRequest, gpu: Gpu, store: JobStore) -> Efficiency:
    """The request's efficiency, else the newest calibration of this GPU and precision (the same
    engine's first), else the stated default."""
    if request.efficiency is not None:
        return Efficiency(request.efficiency, "given by the request")
    found = store.calibrations(gpu=gpu.name, precision=request.precision.value)
    same_engine = [c for c in found if c.engine == request.engine.value]
    if not found:
        return Efficiency()
    chosen = (same_engine or found)[0]
    d = chosen.detail
    if d.get("measurement_id") is None:
        how = f"given: {d.get('source')}"
    else:
        how = (
            f"stage {d.get('stage')} measured at {d.get('measured_step_time_seconds', 0):.4g} s "
            f"per step (measurement {d.get('measurement_id')})"
        )
    return Efficiency(
        chosen.efficiency,
        f"calibration {chosen.id}: {d.get('device_name')}, engine {chosen.engine}, {how}",
        chosen.id,
    )


class GpuPublic(BaseModel):
    name: str
    label: str
    memory: int
    peak_flops_16bit: float
    peak_flops_fp32: float
    memory_bandwidth: int
    host_link: str
    intra_node_link: str
    device_names: list[str]
    source: str


@router.get("/gpus", response_model=list[GpuPublic])
def gpus() -> list[GpuPublic]:
    """GPU presets: memory (bytes), dense peak FLOP/s, memory bandwidth, links, datasheet."""
    return [
        GpuPublic(
            name=g.name,
            label=g.label,
            memory=g.memory,
            peak_flops_16bit=g.peak_flops_16bit,
            peak_flops_fp32=g.peak_flops_fp32,
            memory_bandwidth=g.memory_bandwidth,
            host_link=g.host_link,
            intra_node_link=g.intra_node_link,
            device_names=list(g.device_names),
            source=g.source,
        )
        for g in PRESETS.values()
    ]


def _public(c: Calibration) -> CalibrationPublic:
    d: dict[str, Any] = c.detail
    measured = d.get("measurement_id") is not None
    return CalibrationPublic(
        id=c.id,
        gpu=c.gpu,
        device_name=d["device_name"],
        precision=c.precision,
        engine=c.engine,
        efficiency=c.efficiency,
        measurement_id=d.get("measurement_id"),
        stage=d.get("stage"),
        measured_step_time_seconds=d.get("measured_step_time_seconds"),
        predicted_other_seconds=d.get("predicted_other_seconds"),
        note=(
            f"measured step of job {d['measurement_id']} less the predicted non-compute time"
            if measured
            else f"given by the request, not measured by this service: {d.get('source')}"
        ),
        created_at=c.created_at,
    )


@router.post(
    "/calibrations",
    status_code=status.HTTP_201_CREATED,
    response_model=CalibrationPublic,
    dependencies=[ApiKeyDep],
    responses={404: {"description": "No measure job with this id."}},
)
def add_calibration(
    request: Annotated[CalibrationRequest, Body(openapi_examples=CALIBRATION_EXAMPLES)],
    jobs: JobsDep,
) -> CalibrationPublic:
    """Store the compute efficiency a GPU reached (from a succeeded measurement, or given);
    /v1/plan uses the newest for that GPU and precision."""
    if request.measurement_id is None:
        assert request.gpu is not None and request.efficiency is not None  # one_source
        gpu = get_gpu(request.gpu)
        detail: dict[str, Any] = {"device_name": gpu.label, "source": request.source}
        stored = jobs.store.add_calibration(
            uuid.uuid4().hex,
            gpu.name,
            request.precision.value,
            request.engine.value,
            request.efficiency,
            detail,
        )
        return _public(stored)
    job = jobs.store.get(request.measurement_id)
    if job is None:
        raise HTTPException(
            status_code=status.HTTP_404_NOT_FOUND,
            detail=[
                {
                    "field": "measurement_id",
                    "msg": f"no measure job {request.measurement_id!r}",
                    "type": "not_found",
                }
            ],
        )
    run = measured_run(job, request.stage)
    detail = {
        "device_name": run.device_name,
        "measurement_id": job.id,
        "stage": int(run.stage),
        "measured_step_time_seconds": run.measured_seconds,
        "predicted_other_seconds": run.calibration.other_seconds,
    }
    stored = jobs.store.add_calibration(
        uuid.uuid4().hex,
        run.gpu.name,
        run.precision.value,
        run.engine.value,
        run.calibration.efficiency,
        detail,
    )
    return _public(stored)


@router.get("/calibrations", response_model=CalibrationsPublic)
def list_calibrations(store: StoreDep) -> CalibrationsPublic:
    """Stored calibrations, newest first."""
    found = store.calibrations()
    return CalibrationsPublic(data=[_public(c) for c in found], count=len(found))
