"""``run(spec, progress)``: the measurement behind ``POST /v1/measure`` and ``python -m measure``.

``spec`` holds the request body's fields (model, dp, stages, precision, optimizer, engine, batch,
mode, device, and optionally steps / warmup_steps / seed). The result is JSON-able: one entry in
``runs`` per stage with ``measured``, ``predicted``, ``relative_error``, ``communication`` and
``step_time_s``, plus the environment. Rank 0's figures are reported.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from calculators.architecture import Activation, Architecture, Norm, PositionEmbedding
from calculators.batch import Batch, Checkpointing
from calculators.conventions import Engine, OffloadDevice, Optimizer, Precision, Stage
from calculators.errors import InputError
from calculators.hf_config import architecture_from_hf_config
from calculators.model_states import Offload, TrainingSetup
from calculators.presets import get_preset
from measure import deepspeed_engine
from measure.compare import compare_run
from measure.engines import half_dtype, root_reshards_after_forward
from measure.mlp_presets import mlp_preset
from measure.session import StepPlan, measure_stage, runtime_warmup
from measure.workloads import Workload, gpt_workload, mlp_workload

Progress = Callable[[float, str], None]
MODES = ("simulated", "distributed", "auto")
DEVICES = ("cuda", "cpu", "auto")
DEFAULT_MICRO_BATCH = 1
DEFAULT_SEQ_LEN = 512


def _noop(_fraction: float, _message: str) -> None:
    return None


@dataclass(frozen=True)
class MeasureSpec:
    """A validated request."""

    workload: Workload
    dp: int
    stages: tuple[Stage, ...]
    precision: Precision
    optimizer: Optimizer
    mode: str
    device: str
    plan: StepPlan
    batch: Batch | None
    seed: int = 0
    engine: Engine = Engine.TORCH
    offload: Mapping[str, Any] = field(default_factory=dict)
    engine_config: Mapping[str, Any] = field(default_factory=dict)


def _enum(kind: type[Any], value: Any, name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(str(m.value) for m in kind)
        raise InputError(name, f"{value!r} is not one of {allowed}") from None


def _int(spec: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = spec.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(key, f"must be an integer in {lo}..{hi}")
    return value


def _flag(spec: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = spec.get(key, default)
    if not isinstance(value, bool):
        raise InputError(key, "must be true or false")
    return value


def _architecture(body: Mapping[str, Any]) -> Architecture:
    enums = {"norm": Norm, "position_embedding": PositionEmbedding, "activation": Activation}
    values = dict(body)
    for key, kind in enums.items():
        if key in values and values[key] is not None:
            values[key] = _enum(kind, values[key], f"model.architecture.{key}")
    try:
        return Architecture(**values)
    except TypeError as err:
        raise InputError("model.architecture", str(err)) from None


def resolve_workload(model: Mapping[str, Any], batch: Batch | None) -> Workload:
    """The module a model spec names; plain ``params`` cannot be built."""
    if not isinstance(model, Mapping):
        raise InputError("model", "must be an object")
    if model.get("params") is not None:
        raise InputError(
            "model",
            "a plain parameter count cannot be built and measured: it needs an architecture, "
            "preset or hf_config",
        )
    if model.get("preset") is not None:
        mlp = mlp_preset(str(model["preset"]))
        if mlp is not None:
            return mlp_workload(mlp)
        arch = get_preset(str(model["preset"])).architecture
    elif model.get("architecture") is not None:
        arch = _architecture(model["architecture"])
    elif model.get("hf_config") is not None:
        arch = architecture_from_hf_config(model["hf_config"])
    else:
        raise InputError("model", "give one of architecture, preset or hf_config")
    micro = batch.micro_batch_size if batch else DEFAULT_MICRO_BATCH
    seq = batch.seq_len if batch else min(DEFAULT_SEQ_LEN, arch.max_seq_len or DEFAULT_SEQ_LEN)
    checkpointing = batch.activation_checkpointing.value if batch else "none"
    return gpt_workload(arch, micro, seq, checkpointing)


def parse_spec(spec: Mapping[str, Any]) -> MeasureSpec:
    engine = _enum(Engine, spec.get("engine") or "torch", "engine")
    if engine is Engine.DEEPSPEED:
        if not deepspeed_engine.available():
            raise InputError("engine", "DeepSpeed is not installed on this host; use torch")
        if spec.get("mode") == "simulated":
            raise InputError(
                "mode",
                "DeepSpeed needs a real process group: use distributed (one process "
                "per GPU, or a world of 1) or auto, not simulated",
            )
    elif engine is not Engine.TORCH:
        raise InputError("engine", "measure runs a real engine: torch or deepspeed")
    for key in ("tp", "pp"):
        if spec.get(key) not in (None, 1):
            raise InputError(key, "measure runs data parallelism only (tp = pp = 1)")
    if spec.get("k") is not None:
        raise InputError("k", "measure runs a real optimizer; its states are what they are")
    offload = spec.get("offload") or {}
    if not isinstance(offload, Mapping):
        raise InputError("offload", "must be an object")
    for key in ("optimizer", "params"):
        if offload.get(key) not in (None, "none") and engine is not Engine.DEEPSPEED:
            raise InputError(f"offload.{key}", "the torch engines here run without offload")
    engine_config = spec.get("engine_config") or {}
    if not isinstance(engine_config, Mapping):
        raise InputError("engine_config", "must be an object")
    body = spec.get("batch")
    batch = None
    if body is not None:
        try:
            batch = Batch(
                micro_batch_size=int(body["micro_batch_size"]),
                seq_len=int(body["seq_len"]),
                activation_checkpointing=_enum(
                    Checkpointing,
                    body.get("activation_checkpointing") or "none",
                    "batch.activation_checkpointing",
                ),
                grad_accumulation_steps=int(body.get("grad_accumulation_steps") or 1),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise InputError("batch", f"needs micro_batch_size and seq_len ({err})") from None
    stages_in = spec.get("stages", [0, 1, 2, 3])
    if not isinstance(stages_in, list) or not stages_in:
        raise InputError("stages", "must be a non-empty list of 0..3")
    stages = tuple(_enum(Stage, s, "stages") for s in stages_in)
    mode = spec.get("mode") or "auto"
    if mode not in MODES:
        raise InputError("mode", f"must be one of {', '.join(MODES)}")
    device = spec.get("device") or "auto"
    if device not in DEVICES:
        raise InputError("device", f"must be one of {', '.join(DEVICES)}")
    precision = _enum(Precision, spec.get("precision") or "mixed_bf16", "precision")
    workload = resolve_workload(spec.get("model") or {}, batch)
    if engine is Engine.DEEPSPEED:
        micro = batch.micro_batch_size if batch else DEFAULT_MICRO_BATCH
        for stage in stages:  # every stage's config body is checked before anything runs
            deepspeed_engine.deepspeed_config(
                stage,
                precision,
                micro,
                batch.grad_accumulation_steps if batch else 1,
                offload,
                engine_config,
            )
    return MeasureSpec(
        workload=workload,
        dp=_int(spec, "dp", 1, 1, 1 << 20),
        stages=stages,
        precision=precision,
        optimizer=_enum(Optimizer, spec.get("optimizer") or "adam", "optimizer"),
        mode=mode,
        device=device,
        plan=StepPlan(
            warmup_steps=_int(spec, "warmup_steps", 2, 1, 100),
            steps=_int(spec, "steps", 2, 0, 1000),
            grad_accumulation_steps=batch.grad_accumulation_steps if batch else 1,
            hold_outputs=_flag(spec, "hold_outputs", default=True),
        ),
        batch=batch,
        seed=_int(spec, "seed", 0, 0, 2**31 - 1),
        engine=engine,
        offload=dict(offload),
        engine_config=dict(engine_config),
    )


def ds_config(ms: MeasureSpec, stage: Stage) -> dict[str, Any]:
    """The DeepSpeed config body one stage runs with."""
    micro = ms.batch.micro_batch_size if ms.batch else DEFAULT_MICRO_BATCH
    return deepspeed_engine.deepspeed_config(
        stage, ms.precision, micro, ms.plan.grad_accumulation_steps, ms.offload, ms.engine_config
    )


def training_setup(
    ms: MeasureSpec,
    stage_world: int,
    device: torch.device | None = None,
    stage: Stage | None = None,
) -> TrainingSetup:
    """The calculator's view of the measured run, with the runtime facts of ``device``.

    For DeepSpeed ``engine_config`` is the config body ``stage`` ran with (knobs, offload).
    """
    config: dict[str, Any] = {"holds_outputs": ms.plan.hold_outputs}
    if ms.engine is Engine.DEEPSPEED:
        config.update(ds_config(ms, stage if stage is not None else ms.stages[0]))
        if device is not None and device.type != "cuda":
            config["cublaslt_workspace_bytes"] = 0  # no cuBLASLt on the CPU
        elif deepspeed_engine.linear_patched() and stage is not Stage.PARAMETERS:
            # an earlier stage-3 engine of this process replaced F.linear for good
            config["cublaslt_workspace_bytes"] = 0
    else:
        config["fsdp_root_reshard_after_forward"] = root_reshards_after_forward()
    if device is not None and device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        config["compute_capability_major"] = major
    elif device is not None:
        config["cublas_workspace_bytes"] = 0  # no cuBLAS on the CPU
    if ms.workload.architecture is None:
        config["tensors"] = [[n, list(s), g] for n, s, g in ms.workload.tensors]
    offload = Offload(
        optimizer=OffloadDevice(ms.offload.get("optimizer") or "none"),
        params=OffloadDevice(ms.offload.get("params") or "none"),
    )
    return TrainingSetup(
        params=ms.workload.params,
        dp=stage_world,
        precision=ms.precision,
        optimizer=ms.optimizer,
        engine=ms.engine,
        offload=offload,
        architecture=ms.workload.architecture,
        batch=ms.batch,
        engine_config=config,
    )


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "device_type": device.type,
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["device_total_memory"] = int(torch.cuda.get_device_properties(device).total_memory)
        env["cuda"] = torch.version.cuda
        env["gpus"] = torch.cuda.device_count()
        try:
            env["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - informational only
            pass
    else:
        env["device_name"] = platform.processor() or platform.machine()
    return env


def _device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("device", "no CUDA device is visible")
    return torch.device(name)


def _resolve_mode(ms: MeasureSpec, device: torch.device) -> str:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return "torchrun"
    if ms.mode != "auto":
        return ms.mode
    if ms.engine is Engine.DEEPSPEED:
        return "distributed"  # a real process group, of one rank where one device is asked for
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    return "distributed" if gpus > 1 and ms.dp == gpus else "simulated"


def _stage_runs(
    ms: MeasureSpec, device: torch.device, simulated: bool, progress: Progress, mode: str
) -> list[dict[str, Any]]:
    """Measure every stage on this rank (process group initialised by the caller)."""
    world = dist.get_world_size()
    if ms.engine is Engine.TORCH:
        # not for DeepSpeed: its convention counts the cuBLAS workspaces the first step makes
        runtime_warmup(device, half_dtype(ms.precision))
    runs = []
    for i, stage in enumerate(ms.stages):
        progress(i / len(ms.stages), f"stage {int(stage)}: measuring")
        if ms.engine is Engine.DEEPSPEED:
            measured = deepspeed_engine.measure_stage(
                ms.workload,
                stage,
                ms.optimizer,
                device,
                ms.plan,
                ds_config(ms, stage),
                ms.seed,
            )
        else:
            measured = measure_stage(
                ms.workload,
                stage,
                ms.precision,
                ms.optimizer,
                device,
                simulated,
                ms.plan,
                ms.seed,
            )
        run = {
            "stage": int(stage),
            "engine": ms.engine.value,
            "engine_name": measured["engine_name"],
            "mode": mode,
            "device": device.type,
            "world_size": world,
            "rank": dist.get_rank(),
            "measured": measured["measured"],
            "step_time_s": measured["step_time_s"],
        }
        run.update(compare_run(training_setup(ms, world, device, stage), stage, measured))
        runs.append(run)
    return runs


def _result(ms: MeasureSpec, device: torch.device, runs: list[dict[str, Any]]) -> dict[str, Any]:
    from calculators.engines import engine_model

    env = environment(device)
    if ms.engine is Engine.DEEPSPEED:
        import deepspeed

        env["deepspeed"] = deepspeed.__version__
    return {
        "workload": ms.workload.name,
        "params": ms.workload.params,
        "dp": ms.dp,
        "precision": ms.precision.value,
        "optimizer": ms.optimizer.value,
        "engine": ms.engine.value,
        "convention": engine_model(ms.engine).convention,
        "reported_rank": 0,
        "environment": env,
        "runs": runs,
    }


def _simulated(ms: MeasureSpec, device: torch.device, progress: Progress) -> dict[str, Any]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process")
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    dist.init_process_group("fake", rank=0, world_size=ms.dp, store=FakeStore())
    try:
        runs = _stage_runs(ms, device, True, progress, "simulated")
    finally:
        dist.destroy_process_group()
    return _result(ms, device, runs)


def _rank_main(
    rank: int, spec: dict[str, Any], world: int, port: int, out: str, queue: Any
) -> None:
    """One process of a distributed run (spawned)."""
    ms = parse_spec(spec)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    device_type = _device(ms.device).type
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    init: dict[str, Any] = {"backend": backend, "rank": rank, "world_size": world}
    if backend == "nccl":
        init["device_id"] = device
    if ms.engine is Engine.DEEPSPEED:
        # what deepspeed.init_distributed and the engine read; set before deepspeed is imported
        os.environ.setdefault("DS_ACCELERATOR", device.type)
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group(**init)
    try:

        def progress(fraction: float, message: str) -> None:
            if rank == 0 and queue is not None:
                queue.put((fraction, message))

        runs = _stage_runs(ms, device, False, progress, "distributed")
        if rank == 0:
            Path(out).write_text(json.dumps(_result(ms, device, runs)))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _distributed(
    spec: dict[str, Any], ms: MeasureSpec, device: torch.device, progress: Progress
) -> dict[str, Any]:
    """One process per rank, a fresh set of processes for each stage.

    Fresh processes keep one stage's leftovers out of the next one's baseline:
    ProcessGroupNCCL holds the tensors of DDP's last asynchronous all-reduces (its buckets,
    GBs for a 1B model) for a while after the engine is gone, and frees them in the middle of
    the next stage's run.
    """
    import torch.multiprocessing as mp

    if device.type == "cuda" and ms.dp != torch.cuda.device_count():
        raise InputError(
            "dp",
            f"distributed mode runs one process per GPU: dp must be "
            f"{torch.cuda.device_count()} here (or use mode simulated)",
        )
    ctx = mp.get_context("spawn")
    merged: dict[str, Any] = {}
    for i, stage in enumerate(ms.stages):
        queue = ctx.SimpleQueue()
        one = dict(spec, stages=[int(stage)])
        share = len(ms.stages)

        def forward(fraction: float, message: str, i: int = i, share: int = share) -> None:
            progress((i + fraction) / share, message)

        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "result.json")
            procs = mp.spawn(
                _rank_main,
                args=(one, ms.dp, _free_port(), out, queue),
                nprocs=ms.dp,
                join=False,
            )
            while not procs.join(timeout=0.5):
                while not queue.empty():
                    forward(*queue.get())
            while not queue.empty():
                forward(*queue.get())
            result = dict(json.loads(Path(out).read_text()))
        if not merged:
            merged = result
        else:
            merged["runs"] += result["runs"]
    return merged


def _torchrun(ms: MeasureSpec, device: torch.device, progress: Progress) -> dict[str, Any] | None:
    """Under torchrun (env:// rendezvous): every rank measures, rank 0 returns the result.

    All stages share one process group here. ProcessGroupNCCL may still hold one stage's DDP
    buckets when the next stage reads its baseline (see :func:`_distributed`), so over NCCL
    give one stage per torchrun invocation (``--stages 1``) for clean resident figures.
    """
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://")
    try:
        if dist.get_world_size() != ms.dp:
            raise InputError("dp", f"torchrun started {dist.get_world_size()} ranks, not {ms.dp}")
        runs = _stage_runs(ms, device, False, progress, "distributed")
    finally:
        dist.destroy_process_group()
    return _result(ms, device, runs) if int(os.environ["RANK"]) == 0 else None


def run(spec: dict[str, Any], progress: Progress = _noop) -> dict[str, Any]:
    """Measure the stages ``spec`` asks for and compare each with the calculator.

    Raises:
        InputError: a field cannot be measured (names the field).
    """
    ms = parse_spec(spec)
    device = _device(ms.device)
    mode = _resolve_mode(ms, device)
    start = time.perf_counter()
    progress(0.0, f"{ms.workload.name}: {mode} dp={ms.dp} on {device.type}")
    if mode == "torchrun":
        result = _torchrun(ms, device, progress) or {}
    elif mode == "distributed":
        result = _distributed(dict(spec), ms, device, progress)
    else:
        result = _simulated(ms, device, progress)
    if result:
        result["wall_time_s"] = time.perf_counter() - start
    progress(1.0, "done")
    return result
