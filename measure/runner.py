"""``run(spec, progress)``: the measurement behind ``POST /v1/measure`` and ``python -m measure``.

``spec`` holds the request body's fields (model, dp, stages, precision, optimizer, engine, batch,
mode, device, and optionally steps / warmup_steps / seed). The result is JSON-able: one entry in
``runs`` per stage with ``measured``, ``predicted``, ``relative_error``, ``communication`` and
``step_time_s``, plus the environment. Rank 0's figures are reported.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from calculators.conventions import Engine, Stage
from calculators.engines.torch.config import REDUCE_DTYPE, offloads
from calculators.engines.torch.peak import CONVERT_OUTPUTS, TRAINER_LOOP, biased_linear_threads
from calculators.errors import InputError
from calculators.model_states import TrainingSetup
from measure.compare import compare_run
from measure.engines.pytorch import half_dtype, root_reshards_after_forward
from measure.session import runtime_warmup
from measure.spec import (
    MeasureSpec,
    ModelKind,
    check_cpu_cost,
    model_params,
    parse_spec,
    resolved_config_body,
)
from measure.workloads import Workload, build_workload

Progress = Callable[[float, str], None]


def _noop(_fraction: float, _message: str) -> None:
    return None


@dataclass(frozen=True)
class RunSettings:
    """What the run itself decides, beyond the request, that the prediction must know.

    Attributes:
        device_type: ``cuda`` or ``cpu`` (no cuBLAS workspaces on the CPU).
        compute_capability_major: the GPU's (sizes cuBLAS workspaces); ``None`` on the CPU.
        holds_outputs: the loop keeps its last logits and loss between steps.
        fsdp_root_reshards_after_forward: this torch's FSDP2 reshards the root when told to.
        linear_patched: an earlier DeepSpeed stage-3 engine of this process replaced
            ``F.linear`` (no cuBLASLt workspace in later engines).
        tensors: the built module's parameter list (name, shape, FSDP group), where it is not
            the canonical decoder the calculator derives from an architecture.
        reduce_dtype: FSDP2 reduce-scatters in this 16-bit dtype (``None``: fp32).
        convert_outputs: forward wrapped as accelerate wraps it (fp32 outputs).
        trainer_loop: the loop keeps only the loss from forward, as transformers' Trainer does.
    """

    device_type: str
    compute_capability_major: int | None
    holds_outputs: bool
    fsdp_root_reshards_after_forward: bool
    linear_patched: bool = False
    tensors: tuple[tuple[str, tuple[int, ...], str], ...] | None = None
    reduce_dtype: str | None = None
    convert_outputs: bool = False
    trainer_loop: bool = False

    def engine_config(self, engine: Engine, ds_body: dict[str, Any] | None) -> dict[str, Any]:
        """The calculator's ``engine_config`` keys for these facts (its input format)."""
        config: dict[str, Any] = {"holds_outputs": self.holds_outputs}
        if self.trainer_loop:
            config[TRAINER_LOOP] = True
        if engine is Engine.DEEPSPEED:
            config.update(ds_body or {})
            if self.device_type != "cuda" or self.linear_patched:
                config["cublaslt_workspace_bytes"] = 0  # no cuBLASLt, or F.linear replaced
        else:
            config["fsdp_root_reshard_after_forward"] = self.fsdp_root_reshards_after_forward
            if self.reduce_dtype is not None:
                config[REDUCE_DTYPE] = self.reduce_dtype
            if self.convert_outputs:
                config[CONVERT_OUTPUTS] = True
            if self.device_type != "cuda" or self.linear_patched:
                config["cublaslt_workspace_bytes"] = 0  # no cuBLASLt, or F.linear replaced
        if self.compute_capability_major is not None:
            config["compute_capability_major"] = self.compute_capability_major
        if self.device_type != "cuda":
            config["cublas_workspace_bytes"] = 0  # no cuBLAS on the CPU
            if engine is Engine.TORCH:
                config["caching_allocator"] = False  # storages counted as they are asked
        if self.tensors is not None:
            config["tensors"] = [[n, list(shape), g] for n, shape, g in self.tensors]
        return config


def run_settings(
    ms: MeasureSpec, workload: Workload, device: torch.device, stage: Stage
) -> RunSettings:
    """The facts of this process and device for one stage."""
    major = None
    if device.type == "cuda":
        major = torch.cuda.get_device_capability(device)[0]
    return RunSettings(
        device_type=device.type,
        compute_capability_major=major,
        holds_outputs=ms.plan.hold_outputs,
        fsdp_root_reshards_after_forward=(
            ms.engine is Engine.TORCH and root_reshards_after_forward()
        ),
        linear_patched=(
            (ms.engine is Engine.TORCH or stage is not Stage.PARAMETERS)
            and deepspeed_linear_patched()
        ),
        # the built module's own list where it is not the canonical decoder: a Hugging Face
        # model orders its parameters its own way, and ZeroRedundancyOptimizer's partition
        # and FSDP2's groups follow that order
        tensors=None if ms.model.kind is ModelKind.GPT else tuple(workload.tensors),
        # FSDP2 reduces in the 16-bit dtype where the request's engine_config decided so
        reduce_dtype=ms.engine_config.get(REDUCE_DTYPE) if ms.engine is Engine.TORCH else None,
        convert_outputs=ms.engine is Engine.TORCH and ms.engine_config.get(CONVERT_OUTPUTS) is True,
        trainer_loop=ms.engine_config.get(TRAINER_LOOP) is True,
    )


def deepspeed_linear_patched() -> bool:
    from measure.engines import deepspeed as ds_engine

    return ds_engine.linear_patched()


def training_setup(
    ms: MeasureSpec, workload: Workload, stage_world: int, settings: RunSettings, stage: Stage
) -> TrainingSetup:
    """The calculator's view of the measured run."""
    ds_body = ms.ds_config(stage) if ms.engine is Engine.DEEPSPEED else None
    return TrainingSetup(
        params=workload.params,
        dp=stage_world,
        precision=ms.precision,
        optimizer=ms.optimizer,
        engine=ms.engine,
        offload=ms.offload,
        architecture=workload.architecture,
        batch=ms.batch,
        engine_config=settings.engine_config(ms.engine, ds_body),
    )


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "device_type": device.type,
        "cpu_threads": torch.get_num_threads(),
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


def probe_host(ms: MeasureSpec, device: torch.device) -> bool:
    """Whether the run times the host probe (:mod:`measure.host_probe`): as the request says,
    else on a GPU (where it calibrates the planner's host cost) and not on the CPU."""
    return ms.host_probe if ms.host_probe is not None else device.type == "cuda"


def host_probe_off(ms: MeasureSpec) -> str:
    """Why a run's ``host_probe`` is null."""
    if ms.host_probe is False:
        return "host_probe is null: the request turned the host probe off"
    return (
        "host_probe is null: the host probe runs on a GPU by default (host_probe: true asks"
        " for it on the CPU)"
    )


def _measure_stage(
    ms: MeasureSpec,
    workload: Workload,
    stage: Stage,
    device: torch.device,
    simulated: bool,
    progress: Progress,
) -> dict[str, Any]:
    probe = probe_host(ms, device)
    seq = None if ms.model.kind is ModelKind.MLP else ms.seq_len
    if ms.engine is Engine.DEEPSPEED:
        from measure.engines import deepspeed as ds_engine

        return ds_engine.measure_stage(
            workload,
            stage,
            ms.optimizer,
            device,
            ms.plan,
            ms.ds_config(stage),
            ms.seed,
            progress,
            probe_host=probe,
            probe_seq_len=seq,
        )
    from measure.engines import pytorch

    return pytorch.measure_stage(
        workload, stage, ms, device, simulated, progress, probe_host=probe, probe_seq_len=seq
    )


def warmup_threads(ms: MeasureSpec, workload: Workload) -> int:
    """The threads whose cuBLASLt workspace the torch warm-up makes before the baseline: those
    where the model's own biased linears make one."""
    return biased_linear_threads(workload.architecture, ms.batch)


def _stage_runs(
    ms: MeasureSpec, device: torch.device, simulated: bool, progress: Progress, mode: str
) -> list[dict[str, Any]]:
    """Measure every stage on this rank (process group initialised by the caller)."""
    world = dist.get_world_size()
    workload = build_workload(ms)
    if ms.engine is Engine.TORCH:
        # not for DeepSpeed: its convention counts the cuBLAS workspaces the first step makes
        runtime_warmup(device, half_dtype(ms.precision), warmup_threads(ms, workload))
    runs = []
    share = len(ms.stages)
    for i, stage in enumerate(ms.stages):

        def within(fraction: float, message: str, i: int = i, stage: Stage = stage) -> None:
            progress((i + fraction) / share, f"stage {int(stage)}: {message}")

        settings = run_settings(ms, workload, device, stage)  # before: a stage-3 run patches
        measured = _measure_stage(ms, workload, stage, device, simulated, within)
        run: dict[str, Any] = {
            "stage": int(stage),
            "engine": ms.engine.value,
            "engine_name": measured["engine_name"],
            "mode": mode,
            "device": device.type,
            "world_size": world,
            "rank": dist.get_rank(),
            "measured": measured["measured"],
            "step_time_s": measured["step_time_s"],
            # the micro-step at one short sequence: the host's dispatch (calibrates the planner)
            "host_probe": measured.get("host_probe"),
        }
        if "host_optimizer_step_s" in measured:  # CPU offload: the optimizer steps on the host
            run["host_optimizer_step_s"] = measured["host_optimizer_step_s"]
        run.update(
            compare_run(
                training_setup(ms, workload, world, settings, stage),
                stage,
                measured,
                ms.grad_sync,
            )
        )
        notes = list(measured.get("notes", []))
        if run["host_probe"] is None:
            notes.append(host_probe_off(ms))
        if ms.model.prediction_note:
            notes.append(ms.model.prediction_note)
        run["notes"] = notes
        runs.append(run)
    return runs


def _result(
    ms: MeasureSpec, device: torch.device, runs: list[dict[str, Any]], mode: str
) -> dict[str, Any]:
    from calculators.engines import engine_model

    env = environment(device)
    workload = build_workload(ms)
    if ms.engine is Engine.TORCH and device.type == "cuda":
        env["warmup_linear_bias"] = warmup_threads(ms, workload) > 0
    if ms.engine is Engine.DEEPSPEED:
        import deepspeed

        env["deepspeed"] = deepspeed.__version__
    if ms.model.kind is ModelKind.HF:
        import transformers

        env["transformers"] = transformers.__version__
    result: dict[str, Any] = {
        "workload": workload.name,
        "params": workload.params,
        "dp": ms.dp,
        "precision": ms.precision.value,
        "optimizer": ms.optimizer.value,
        "engine": ms.engine.value,
        "convention": engine_model(ms.engine).convention,
        "reported_rank": 0,
        "environment": env,
        "runs": runs,
    }
    if ms.resolved is not None:
        result["resolved_config"] = resolved_config_body(ms.engine, ms.resolved)
    if device.type == "cpu":
        from measure.engines.pytorch import CPU_PHASES_NOTE

        result["cpu_mode"] = CPU_PHASES_NOTE
    if mode == "simulated":
        result["simulated_world"] = (
            f"one process plays rank 0 of {ms.dp} through PyTorch's fake process group: "
            "collectives move no data and take no time, so step times leave communication out; "
            "memory and the bytes each collective would send are rank 0's"
        )
    return result


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
    return _result(ms, device, runs, "simulated")


def _rank_main(rank: int, ms: MeasureSpec, world: int, port: int, out: str, queue: Any) -> None:
    """One process of a distributed run (spawned); ``ms`` is the spec the parent checked."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    if world > 1 and "OMP_NUM_THREADS" not in os.environ:
        # one host thread per rank, as torchrun and accelerate launch set it: the ranks share
        # the host, and FSDP2's CPU offload steps the optimizer there
        torch.set_num_threads(1)
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
            Path(out).write_text(json.dumps(_result(ms, device, runs, "distributed")))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _distributed(ms: MeasureSpec, device: torch.device, progress: Progress) -> dict[str, Any]:
    """One process per rank, a fresh set of processes for each stage.

    Fresh processes keep one stage's leftovers out of the next one's baseline:
    ProcessGroupNCCL holds the tensors of DDP's last asynchronous all-reduces (its buckets,
    GBs for a 1B model) for a while after the engine is gone, and frees them in the middle of
    the next stage's run.
    """
    import dataclasses

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import spawn

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
        one = dataclasses.replace(ms, stages=(stage,))
        share = len(ms.stages)

        def forward(fraction: float, message: str, i: int = i, share: int = share) -> None:
            progress((i + fraction) / share, message)

        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "result.json")
            procs = spawn(
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
    init: dict[str, Any] = {"backend": "nccl" if device.type == "cuda" else "gloo"}
    if device.type == "cuda":
        init["device_id"] = device
    if ms.engine is Engine.DEEPSPEED:
        os.environ.setdefault("DS_ACCELERATOR", device.type)
    dist.init_process_group(init_method="env://", **init)
    try:
        if dist.get_world_size() != ms.dp:
            raise InputError("dp", f"torchrun started {dist.get_world_size()} ranks, not {ms.dp}")
        runs = _stage_runs(ms, device, False, progress, "distributed")
    finally:
        dist.destroy_process_group()
    return _result(ms, device, runs, "distributed") if int(os.environ["RANK"]) == 0 else None


@functools.lru_cache(maxsize=1)
def cpu_flops_per_s() -> float:
    """This host's fp32 matrix-multiply rate, measured on a 512 x 512 product (~0.1 s)."""
    a = torch.randn(512, 512)
    a @ a  # first call pays for thread-pool start-up
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.05 or n < 3:
        a @ a
        n += 1
    return 2 * 512**3 * n / (time.perf_counter() - t0)


def check_cpu_run(ms: MeasureSpec) -> float | None:
    """Seconds of arithmetic the run needs if it runs on this host's CPU (``None`` on a GPU).

    Raises:
        InputError: a long CPU run without ``allow_slow_cpu``, or FSDP2's CPU offload asked of
            the CPU.
    """
    if _device(ms.device).type != "cpu":
        return None
    if ms.engine is Engine.TORCH and offloads(ms.offload):
        raise InputError(
            "offload.params",
            "FSDP2's CPUOffloadPolicy moves the shards from a CUDA device to pinned host "
            "memory: it is measured on a GPU only",
        )
    params = model_params(ms)
    if params is None:
        params = build_workload(ms).params  # the Hugging Face model, counted on the meta device
    return check_cpu_cost(ms, params, cpu_flops_per_s())


def run(spec: dict[str, Any], progress: Progress = _noop) -> dict[str, Any]:
    """Measure the stages ``spec`` asks for and compare each with the calculator.

    Raises:
        InputError: a field cannot be measured (names the field).
    """
    ms = parse_spec(spec)
    device = _device(ms.device)
    if device.type == "cpu" and ms.batch is not None and ms.batch.checkpoint_offload:
        raise InputError(
            "batch.checkpoint_offload",
            "needs a CUDA device: transformers' offload pins its host copies (save_on_cpu "
            "with pin_memory), which a host without an accelerator cannot",
        )
    mode = _resolve_mode(ms, device)
    progress(0.0, f"checking the request: {mode} dp={ms.dp} on {device.type}")
    cpu_seconds = check_cpu_run(ms) if mode != "torchrun" or device.type == "cpu" else None
    start = time.perf_counter()
    if mode == "torchrun":
        result = _torchrun(ms, device, progress) or {}
    elif mode == "distributed":
        result = _distributed(ms, device, progress)
    else:
        result = _simulated(ms, device, progress)
    if result:
        result["wall_time_s"] = time.perf_counter() - start
        if cpu_seconds is not None:
            result["cpu_arithmetic_estimate_s"] = cpu_seconds
    progress(1.0, "done")
    return result
