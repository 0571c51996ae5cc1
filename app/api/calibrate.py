"""A stored measurement in, a calibration out: the GEMM efficiency and host cost per kernel the
measured step implies (both from one run where it carries the host probe)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from app.api.convert import resolve_model
from app.jobs.store import Job, JobStatus
from app.schemas.model import ModelSpec
from calculators.batch import Checkpointing
from calculators.communication import GradSync, Network
from calculators.conventions import Engine, Optimizer, Precision, Stage
from calculators.errors import InputError
from calculators.gpus import Gpu, gpu_for_device_name
from calculators.interconnects import get_interconnect
from calculators.plan import (
    Calibration,
    Config,
    HostProbe,
    Learned,
    OffloadChoice,
    PlanSetup,
    calibrate,
    recorded_threads,
)

FIELD = "measurement_id"
# measure.runner's defaults when a request gives no batch
DEFAULT_MICRO_BATCH = 1
DEFAULT_SEQ_LEN = 512


@dataclass(frozen=True)
class MeasuredRun:
    """What a calibration is computed from."""

    gpu: Gpu
    device_name: str
    precision: Precision
    engine: Engine
    stage: Stage
    measured_seconds: float
    calibration: Calibration
    probe: HostProbe | None = None


def _offload(body: Any) -> OffloadChoice:
    body = body if isinstance(body, dict) else {}
    optimizer, params = body.get("optimizer") or "none", body.get("params") or "none"
    if "nvme" in (optimizer, params):
        raise InputError(FIELD, "the measurement offloads to NVMe: the planner models CPU only")
    if params == "cpu":
        return OffloadChoice.OPTIMIZER_AND_PARAMS
    return OffloadChoice.OPTIMIZER if optimizer == "cpu" else OffloadChoice.NONE


def _engine_config(req: dict[str, Any], decided: dict[str, Any]) -> dict[str, Any] | None:
    """The config the measured run used: a DeepSpeed config as the run resolved it (every
    "auto" replaced; its ``resolved_config.values``), else the request's."""
    values = decided.get("values")
    if decided.get("engine") != Engine.DEEPSPEED.value or not isinstance(values, list):
        config: dict[str, Any] | None = req.get("engine_config")
        return config
    out: dict[str, Any] = {}
    for item in values:
        if not isinstance(item, dict) or item.get("value") is None:
            continue
        *parents, leaf = str(item["key"]).split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = item["value"]
    return out


def _threads_run(result: dict[str, Any]) -> dict[str, Any]:
    """The host threads each rank of a measured run stepped on (its ``environment.cpu_threads``),
    as :class:`PlanSetup` fields; nothing where the result does not say (the plan's rule)."""
    threads = (result.get("environment") or {}).get("cpu_threads")
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        return {}
    host_threads, source = recorded_threads(threads)
    return {"host_threads": host_threads, "host_threads_source": source}


def host_probe(run: dict[str, Any]) -> HostProbe | None:
    """The run's host probe (``measure.host_probe``), if it timed one."""
    found = run.get("host_probe")
    if not isinstance(found, dict):
        return None
    seconds, micro, seq = (found.get(k) for k in ("seconds", "micro_batch_size", "seq_len"))
    if not isinstance(seconds, int | float) or seconds <= 0:
        raise InputError(FIELD, "the run's host probe has no time")
    if not isinstance(micro, int) or not isinstance(seq, int) or micro < 1 or seq < 1:
        raise InputError(FIELD, "the run's host probe does not say its batch")
    return HostProbe(float(seconds), micro, seq)


def measured_run(job: Job, stage: int | None, figure: Learned | None = None) -> MeasuredRun:
    """The calibration a succeeded measure job implies for one of its runs (``figure``: the
    figure it sets; None = both where the run timed the host probe, else the queue the model
    finds binding in that run)."""
    if job.status is not JobStatus.SUCCEEDED or not job.result:
        raise InputError(FIELD, f"the job is {job.status.value}; only a succeeded one calibrates")
    result, req = job.result, job.request
    env = result.get("environment") or {}
    if env.get("device_type") != "cuda":
        raise InputError(FIELD, "the job ran on the CPU: a calibration needs a GPU measurement")
    device_name = str(env.get("device_name") or "")
    gpu = gpu_for_device_name(device_name)
    if gpu is None:
        raise InputError(FIELD, f"no GPU preset matches the measured device {device_name!r}")
    runs = [r for r in result.get("runs") or [] if stage is None or r.get("stage") == stage]
    if not runs:
        raise InputError("stage", f"the job has no run of stage {stage}")
    run = runs[0]
    seconds = run.get("step_time_s")
    if not isinstance(seconds, int | float) or seconds <= 0:
        raise InputError(FIELD, "the run has no step time (measured with steps = 0?)")
    try:
        params, arch = resolve_model(ModelSpec(**req.get("model") or {}))
    except ValidationError:
        arch = None
    if arch is None:
        raise InputError(FIELD, "the measured model is not a decoder the planner can count")
    batch = req.get("batch") or {}
    # what an engine_config decided, where the request left it to the config
    decided = result.get("resolved_config") or {}
    micro = int(
        batch.get("micro_batch_size") or decided.get("micro_batch_size") or DEFAULT_MICRO_BATCH
    )
    seq = int(batch.get("seq_len") or min(DEFAULT_SEQ_LEN, arch.max_seq_len or DEFAULT_SEQ_LEN))
    ga = int(
        batch.get("grad_accumulation_steps") or decided.get("gradient_accumulation_steps") or 1
    )
    ckpt = Checkpointing(batch.get("activation_checkpointing") or "none")
    world = int(run.get("world_size") or req.get("dp") or 1)
    engine = Engine(req.get("engine") or "torch")
    precision = Precision(result.get("precision") or req.get("precision") or "mixed_bf16")
    setup = PlanSetup(
        architecture=arch,
        params=params,
        gpu=gpu,
        gpus=world,
        gpus_per_node=world,  # measure's distributed mode runs on one host
        network=Network(
            intra=get_interconnect(gpu.intra_node_link, "gpu"),
            host=get_interconnect(gpu.host_link, "gpu"),
        ),
        global_batch_size=micro * ga * world,
        seq_len=seq,
        engine=engine,
        engine_config=_engine_config(req, decided),
        precision=precision,
        optimizer=Optimizer(result.get("optimizer") or req.get("optimizer") or "adam"),
        # as the run reduced: measure's loop reduces every micro-step unless asked otherwise
        grad_sync=GradSync(req.get("grad_sync") or GradSync.PER_MICRO_STEP),
        **_threads_run(result),
    )
    config = Config(
        Stage(run["stage"]), micro, ga, ckpt, _offload(decided.get("offload") or req.get("offload"))
    )
    probe = host_probe(run)
    if figure is Learned.BOTH and probe is None:
        raise InputError(
            "figure",
            "both figures from one run need its host probe, and this run has none (measure "
            "again with host_probe: true, or calibrate gpu and host from two runs)",
        )
    timed = run.get("host_optimizer_step_s")  # measure times it under CPU offload (both engines)
    if timed is not None and (not isinstance(timed, int | float) or timed <= 0):
        raise InputError(FIELD, "the run's host optimizer step has no time")
    cal = calibrate(
        setup,
        config,
        float(seconds),
        communicated=run.get("mode") != "simulated",
        learn=figure,
        probe=probe,
        host_optimizer_seconds=None if timed is None else float(timed),
    )
    return MeasuredRun(
        gpu, device_name, precision, engine, config.stage, float(seconds), cal, probe
    )
