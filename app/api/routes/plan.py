"""POST /v1/plan, GET /v1/gpus, POST and GET /v1/calibrations."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
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
from calculators.plan import Efficiency, HostThreads, Learned, plan

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
# the stored calibrations that set each figure
SETS_GPU = (Learned.GPU.value, Learned.BOTH.value)
SETS_HOST = (Learned.HOST.value, Learned.BOTH.value)


@router.post("/plan", response_model=PlanResponse)
def plan_route(
    request: Annotated[PlanRequest, Body(openapi_examples=PLAN_EXAMPLES)], store: StoreDep
) -> PlanResponse:
    """Every ZeRO configuration of the search that fits, ranked by predicted tokens/s."""
    gpu = plan_gpu(request.gpu)
    efficiency = efficiency_for(request, gpu, store)
    setup = plan_setup(request, gpu, efficiency)
    host = host_optimizer_for(request, gpu, store, setup.host_optimizer_threads[0])
    if host is not None:
        setup = replace(
            setup, host_optimizer_bandwidth=host[0], host_optimizer_given_source=host[1]
        )
    return plan_response(plan(setup))


def host_optimizer_for(
    request: PlanRequest, gpu: Gpu, store: JobStore, threads: HostThreads
) -> tuple[float, str] | None:
    """The host optimizer bandwidth the request gives, else the newest calibration of this GPU,
    precision and engine that timed an offloaded run's host optimizer step on as many threads
    per rank as the plan's (``threads``; the optimizers differ by engine: torch's own, DeepSpeed's
    CPU Adam), else None: the engine's stated figure."""
    if request.host_optimizer_bandwidth is not None:
        return request.host_optimizer_bandwidth, "given by the request"
    found = store.calibrations(gpu=gpu.name, precision=request.precision.value)
    chosen = next(
        (
            c
            for c in found
            if c.engine == request.engine.value
            and c.detail.get("host_optimizer_bandwidth")
            and _threads_stepped(c.detail) is threads
        ),
        None,
    )
    if chosen is None:
        return None
    return float(chosen.detail["host_optimizer_bandwidth"]), (
        f"{_source(chosen)}, its host optimizer step timed on {threads.value} thread(s) per rank"
    )


def _threads_stepped(detail: Mapping[str, Any]) -> HostThreads:
    """The threads a stored calibration's run stepped its host optimizer on (one where the
    calibration does not say: the runs of several ranks per node that measure spawns)."""
    return HostThreads(detail.get("host_optimizer_threads") or HostThreads.ONE)


def efficiency_for(request: PlanRequest, gpu: Gpu, store: JobStore) -> Efficiency:
    """The request's GEMM efficiency and host cost per kernel, else for each the newest
    calibration of this GPU and precision that sets it (the same engine's first), else the
    stated defaults."""
    found = store.calibrations(gpu=gpu.name, precision=request.precision.value)
    # same engine first, newest first within each
    found.sort(key=lambda c: c.engine != request.engine.value)
    out = Efficiency()
    if request.efficiency is not None:
        out = replace(out, value=request.efficiency, source="given by the request")
    else:
        chosen = next((c for c in found if c.detail.get("figure") in SETS_GPU), None)
        if chosen is not None:
            out = replace(
                out, value=chosen.efficiency, source=_source(chosen), calibration_id=chosen.id
            )
    if request.host_seconds_per_kernel is not None:
        return replace(
            out,
            host_seconds_per_kernel=request.host_seconds_per_kernel,
            host_source="given by the request",
        )
    chosen = next((c for c in found if c.detail.get("figure") in SETS_HOST), None)
    if chosen is not None:
        out = replace(
            out,
            host_seconds_per_kernel=float(chosen.detail["host_seconds_per_kernel"]),
            host_source=_source(chosen),
            host_calibration_id=chosen.id,
        )
    return out


def _source(chosen: Calibration) -> str:
    d = chosen.detail
    if d.get("measurement_id") is None:
        how = f"given: {d.get('source')}"
    else:
        how = (
            f"stage {d.get('stage')} measured at {d.get('measured_step_time_seconds', 0):.4g} s "
            f"per step (measurement {d.get('measurement_id')})"
        )
    return f"calibration {chosen.id}: {d.get('device_name')}, engine {chosen.engine}, {how}"


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
    figure = d.get("figure")
    if figure is None:
        note = (
            "stored by an earlier step-time model (a whole-step efficiency); /v1/plan does not "
            "use it: calibrate again from the measurement"
        )
    elif not measured:
        note = f"given by the request, not measured by this service: {d.get('source')}"
    elif figure == Learned.BOTH.value:
        note = (
            f"job {d['measurement_id']}: the host probe (the micro-step at "
            f"{d.get('host_probe_micro_batch_size')} × {d.get('host_probe_seq_len')} tokens) "
            "over the kernels and hook steps the model counts sets the host cost per kernel; "
            "the measured step less the predicted optimizer step, communication and offload, "
            "per micro-step, with that host cost, sets the GEMM efficiency"
        )
    elif figure == Learned.HOST_OPTIMIZER.value:
        note = (
            f"job {d['measurement_id']}: an offloaded run; its timed host optimizer step sets "
            "the host optimizer bandwidth, and nothing else (its step also holds FSDP2's copies "
            "to and from the host, which the model under-predicts): efficiency is the stated "
            "figure, not one this run reached, and /v1/plan does not use it"
        )
    elif figure == Learned.HOST.value:
        note = (
            f"measured step of job {d['measurement_id']} less the predicted optimizer step, "
            "communication and offload, per micro-step: host-bound, so it sets the host cost "
            "per kernel"
        )
    else:
        note = (
            f"measured step of job {d['measurement_id']} less the predicted optimizer step, "
            "communication and offload, per micro-step: GPU-bound, so it sets the GEMM "
            "efficiency (attention and memory-bound kernels at their stated figures)"
        )
    if figure == Learned.HOST.value and d.get("host_probe_seconds") is not None:
        note = (
            f"job {d['measurement_id']}: the host probe over the kernels and hook steps the "
            "model counts sets the host cost per kernel"
        )
    host = d.get("host_seconds_per_kernel")
    if host is None and figure == Learned.HOST_OPTIMIZER.value:
        note += "; host_seconds_per_kernel is null: the run timed no host probe"
    elif host is None and figure is not None:
        note += "; host_seconds_per_kernel is null: a given efficiency says nothing of the host"
    probe_s = d.get("host_probe_seconds")
    if probe_s is None:
        if not measured:
            why = "not measured by this service"
        elif d.get("host_probe_used") is False:
            why = "the run's host probe was not used (figure gpu asked for the step alone)"
        else:
            why = "the measured run timed no host probe"
        note += f"; host_probe_seconds is null: {why}"
    host_optimizer = d.get("host_optimizer_bandwidth")
    if host_optimizer is None:
        why = (
            "not measured by this service"
            if not measured
            else "the run did not offload its optimizer to the CPU, or did not time its step"
        )
        note += f"; host_optimizer_bandwidth is null: {why}"
    threads = None
    if host_optimizer is None:
        note += "; host_optimizer_threads is null: no host optimizer step was timed"
    else:
        threads = _threads_stepped(d)
    return CalibrationPublic(
        id=c.id,
        gpu=c.gpu,
        device_name=d["device_name"],
        precision=c.precision,
        engine=c.engine,
        efficiency=c.efficiency,
        host_seconds_per_kernel=host,
        figure=None if figure is None else Learned(figure),
        measurement_id=d.get("measurement_id"),
        stage=d.get("stage"),
        measured_step_time_seconds=d.get("measured_step_time_seconds"),
        predicted_other_seconds=d.get("predicted_other_seconds"),
        host_probe_seconds=probe_s,
        host_optimizer_bandwidth=host_optimizer,
        host_optimizer_threads=threads,
        notes=list(d.get("notes") or []),
        note=note,
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
    """Store the GEMM efficiency and host cost per kernel a GPU's run implies (from a succeeded
    measurement, both at once where it timed the host probe; or a given efficiency); /v1/plan
    uses the newest of each for that GPU and precision."""
    if request.measurement_id is None:
        assert request.gpu is not None and request.efficiency is not None  # one_source
        gpu = get_gpu(request.gpu)
        detail: dict[str, Any] = {
            "device_name": gpu.label,
            "source": request.source,
            "figure": Learned.GPU.value,
        }
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
    run = measured_run(job, request.stage, request.figure)
    detail = {
        "device_name": run.device_name,
        "measurement_id": job.id,
        "stage": int(run.stage),
        "measured_step_time_seconds": run.measured_seconds,
        "predicted_other_seconds": run.calibration.other_seconds,
        "figure": run.calibration.learned.value,
        "host_seconds_per_kernel": None
        if run.calibration.learned is Learned.HOST_OPTIMIZER
        else run.calibration.host_seconds_per_kernel,
        "notes": list(run.calibration.notes),
    }
    if run.calibration.host_optimizer_bandwidth is not None:
        detail["host_optimizer_bandwidth"] = run.calibration.host_optimizer_bandwidth
        if run.calibration.host_optimizer_threads is not None:
            detail["host_optimizer_threads"] = run.calibration.host_optimizer_threads.value
    if run.probe is not None:
        used = run.calibration.probe_dispatches is not None
        detail["host_probe_used"] = used
        if used:
            detail.update(
                host_probe_seconds=run.probe.seconds,
                host_probe_micro_batch_size=run.probe.micro_batch_size,
                host_probe_seq_len=run.probe.seq_len,
                host_probe_dispatches=run.calibration.probe_dispatches,
            )
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
