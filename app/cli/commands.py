"""The commands: each declares its options and hands them, by name, to one builder and printer.

The option lists stay per command (typer reads them from each signature; a shared options
object would need a callback and a context to thread through, and ``--help`` would no longer
list a command's options beside it). What each option means in the request lives once, in
``app.cli.request.FIELDS``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any

import httpx
import typer
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from app.cli import transport
from app.cli.printer import err, show
from app.cli.request import CliError, build_request

cli = typer.Typer(
    name="zerocalc",
    help="Per-device memory and communication of ZeRO training, predicted and measured.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# ---------- options (the same flag means the same field in every command) ----------

Json = Annotated[bool, typer.Option("--json", help="Print the API's JSON answer.")]
Url = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="ZEROCALC_URL",
        help="A running service; without it the answer is computed in-process by the same app.",
    ),
]
Body = Annotated[
    str | None,
    typer.Option(
        "--body", help="A JSON request body (file, or - for stdin); options given override it."
    ),
]
Params = Annotated[
    str | None,
    typer.Option("--params", "-p", help="Ψ: 7.5B, 7.5e9, 7500000000 or 7,500,000,000."),
]
Preset = Annotated[str | None, typer.Option("--preset", help="A model from GET /v1/presets.")]
Arch = Annotated[
    str | None,
    typer.Option(
        "--arch",
        help="Architecture as name=value,... (layers=12,hidden=1024,heads=16,"
        "vocab_size=32000) or a JSON file.",
    ),
]
HfConfig = Annotated[
    str | None,
    typer.Option("--hf-config", help="A Hugging Face config.json (file, or - for stdin)."),
]
Dp = Annotated[int | None, typer.Option("--dp", "-n", help="Data-parallel degree Nd.")]
Tp = Annotated[int | None, typer.Option("--tp", help="Tensor-parallel degree.")]
Pp = Annotated[int | None, typer.Option("--pp", help="Pipeline-parallel degree.")]
Stages = Annotated[str | None, typer.Option("--stages", "-s", help="ZeRO stages, e.g. 1,2,3.")]
Precision = Annotated[
    str | None, typer.Option("--precision", help="mixed_fp16, mixed_bf16, fp32 or bf16.")
]
Optimizer = Annotated[
    str | None,
    typer.Option("--optimizer", help="adam, adamw, sgd, sgd_momentum, adafactor, adam_8bit."),
]
OptimizerStateBytes = Annotated[
    float | None,
    typer.Option("--k", help="K: optimizer-state bytes per parameter (overrides --optimizer's)."),
]
Gradients = Annotated[str | None, typer.Option("--gradients", help="paper or fp32_grads.")]
OffloadOpt = Annotated[str | None, typer.Option("--offload-optimizer", help="none, cpu or nvme.")]
OffloadParams = Annotated[str | None, typer.Option("--offload-params", help="none, cpu or nvme.")]
Engine = Annotated[str | None, typer.Option("--engine", "-e", help="paper, deepspeed or torch.")]
EngineConfig = Annotated[
    str | None,
    typer.Option(
        "--engine-config",
        help="The engine's config JSON (a DeepSpeed ds_config.json with --engine deepspeed), "
        "file or - for stdin.",
    ),
]
MicroBatch = Annotated[int | None, typer.Option("--micro-batch", help="Sequences per micro-batch.")]
SeqLen = Annotated[int | None, typer.Option("--seq-len", help="Tokens per sequence.")]
Checkpointing = Annotated[
    str | None,
    typer.Option("--checkpointing", help="Activation checkpointing: none, full or selective."),
]
GradAccum = Annotated[
    int | None, typer.Option("--grad-accum", help="Micro-batches per optimizer step.")
]
Padded = Annotated[
    bool | None,
    typer.Option(
        "--padded/--unpadded",
        help="The batch's attention_mask has padding (transformers models: a (batch, 1, seq, "
        "seq) mask and expanded key/value in every layer).",
    ),
]
CheckpointOffload = Annotated[
    bool | None,
    typer.Option(
        "--checkpoint-offload/--no-checkpoint-offload",
        help="transformers' gradient checkpointing with offload=True: each checkpointed layer's "
        "input in pinned host memory (needs --checkpointing full).",
    ),
]
EveryNLayers = Annotated[
    int | None,
    typer.Option(
        "--checkpoint-every-n-layers",
        help="transformers' every_n_layers: checkpoint decoder layers 0, n, 2n, ... only "
        "(needs --checkpointing full; engine torch).",
    ),
]
DeviceMemory = Annotated[
    str | None,
    typer.Option(
        "--device-memory", "-m", help="Bytes per device: 80GB (10^9), 80GiB (2^30) or bytes."
    ),
]


def _run(action: Callable[[], None]) -> None:
    """Run a command's work; a ``CliError`` becomes one red line on stderr and exit code 2."""
    try:
        action()
    except CliError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def ask(path: str, body: str | None, url: str | None, as_json: bool, **options: Any) -> None:
    """Build the request from the options, ask ``path`` and print the answer."""
    _run(lambda: show(path, transport.post(path, build_request(body, options), url), as_json))


# ---------- commands ----------


@cli.command()
def memory(
    params: Params = None,
    preset: Preset = None,
    arch: Arch = None,
    hf_config: HfConfig = None,
    dp: Dp = None,
    tp: Tp = None,
    pp: Pp = None,
    stages: Stages = None,
    precision: Precision = None,
    optimizer: Optimizer = None,
    optimizer_state_bytes: OptimizerStateBytes = None,
    gradients: Gradients = None,
    offload_optimizer: OffloadOpt = None,
    offload_params: OffloadParams = None,
    engine: Engine = None,
    engine_config: EngineConfig = None,
    micro_batch: MicroBatch = None,
    padded: Padded = None,
    seq_len: SeqLen = None,
    checkpointing: Checkpointing = None,
    checkpoint_offload: CheckpointOffload = None,
    checkpoint_every_n_layers: EveryNLayers = None,
    grad_accum: GradAccum = None,
    device_memory: DeviceMemory = None,
    body: Body = None,
    url: Url = None,
    as_json: Json = False,
) -> None:
    """Per-device memory of one model under each ZeRO stage (POST /v1/memory)."""
    ask("/v1/memory", **locals())


@cli.command()
def capacity(
    device_memory: DeviceMemory = None,
    dp: Dp = None,
    stages: Stages = None,
    precision: Precision = None,
    optimizer: Optimizer = None,
    optimizer_state_bytes: OptimizerStateBytes = None,
    gradients: Gradients = None,
    offload_optimizer: OffloadOpt = None,
    offload_params: OffloadParams = None,
    engine: Engine = None,
    engine_config: EngineConfig = None,
    params: Params = None,
    preset: Preset = None,
    arch: Arch = None,
    hf_config: HfConfig = None,
    max_dp: Annotated[int | None, typer.Option("--max-dp", help="Largest Nd to search.")] = None,
    body: Body = None,
    url: Url = None,
    as_json: Json = False,
) -> None:
    """Largest model per stage for a device; with a model, the smallest Nd (POST /v1/capacity)."""
    ask("/v1/capacity", **locals())


@cli.command()
def comm(
    params: Params = None,
    preset: Preset = None,
    arch: Arch = None,
    hf_config: HfConfig = None,
    dp: Dp = None,
    tp: Tp = None,
    pp: Pp = None,
    stages: Stages = None,
    precision: Precision = None,
    engine: Engine = None,
    engine_config: EngineConfig = None,
    grad_accumulation_steps: GradAccum = None,
    recomputation: Checkpointing = None,
    offload_optimizer: OffloadOpt = None,
    offload_params: OffloadParams = None,
    nodes: Annotated[int | None, typer.Option("--nodes", help="Nodes.")] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", help="GPUs per node.")
    ] = None,
    interconnect: Annotated[
        str | None,
        typer.Option(
            "--interconnect", help="Link inside a node: a name from GET /v1/interconnects."
        ),
    ] = None,
    inter_node: Annotated[
        str | None,
        typer.Option(
            "--inter-node-interconnect",
            help="Link between nodes: a name from GET /v1/interconnects.",
        ),
    ] = None,
    body: Body = None,
    url: Url = None,
    as_json: Json = False,
) -> None:
    """Bytes each rank sends per step, and the time (POST /v1/communication)."""
    ask("/v1/communication", **locals())


FINAL = ("succeeded", "failed", "cancelled")


def _fraction(progress: Any) -> float:
    if isinstance(progress, int | float):
        return float(progress)
    if isinstance(progress, dict) and isinstance(progress.get("fraction"), int | float):
        return float(progress["fraction"])
    return 0.0


def wait_for_job(client: httpx.Client, job_id: str, interval: float) -> dict[str, Any]:
    """Poll GET /v1/measure/{id} until the job ends, drawing a progress bar on stderr."""
    with Progress(
        TextColumn("[bold]{task.fields[status]}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=err,
    ) as bar:
        task = bar.add_task("", total=1.0, status="queued")
        while True:
            job = transport.answer(client.get(f"/v1/measure/{job_id}"))
            progress = job.get("progress")
            message = progress.get("message", "") if isinstance(progress, dict) else ""
            bar.update(
                task, completed=_fraction(progress), status=job["status"], description=message
            )
            if job["status"] in FINAL:
                if job["status"] == "succeeded":
                    bar.update(task, completed=1.0)
                return job
            time.sleep(interval)


def run_job(
    url: str, api_key: str | None, interval: float, body: str | None, as_json: bool, **options: Any
) -> None:
    """POST /v1/measure, follow the job, print its comparison; a job that fails exits 2."""
    request = build_request(body, options)
    try:
        with transport.remote_client(url, api_key) as client:
            accepted = transport.answer(client.post("/v1/measure", json=request))
            job = wait_for_job(client, str(accepted["id"]), interval)
    except httpx.TransportError as e:
        raise CliError(f"cannot reach {url}: {e} (start one with: zerocalc serve)") from None
    if as_json or job["status"] == "succeeded":
        show("/v1/measure", job, as_json)
    if job["status"] != "succeeded":
        raise CliError(f"job {job['id']} {job['status']}: {job.get('error') or ''}".rstrip())


@cli.command()
def measure(
    arch: Arch = None,
    preset: Preset = None,
    hf_config: HfConfig = None,
    dp: Dp = None,
    stages: Stages = None,
    precision: Precision = None,
    optimizer: Optimizer = None,
    engine: Engine = None,
    engine_config: EngineConfig = None,
    micro_batch: MicroBatch = None,
    padded: Padded = None,
    seq_len: SeqLen = None,
    checkpointing: Checkpointing = None,
    checkpoint_offload: CheckpointOffload = None,
    checkpoint_every_n_layers: EveryNLayers = None,
    grad_accum: GradAccum = None,
    mode: Annotated[
        str | None,
        typer.Option(
            "--mode", help="simulated (one device), distributed (one process per GPU) or auto."
        ),
    ] = None,
    device: Annotated[str | None, typer.Option("--device", help="cuda, cpu or auto.")] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Measured steps per stage.")] = None,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between polls.")] = 1.0,
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="ZEROCALC_API_KEY", help="Sent as X-API-Key.")
    ] = None,
    body: Body = None,
    url: Annotated[
        str, typer.Option("--url", envvar="ZEROCALC_URL", help="The running service that measures.")
    ] = transport.DEFAULT_URL,
    as_json: Json = False,
) -> None:
    """Measure real runs on the service's device and compare with the prediction."""
    options = locals()
    _run(lambda: run_job(**options))


@cli.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to bind.")] = 8000,
) -> None:
    """Start the service (uvicorn, one worker: one CUDA context, one job runner)."""
    import uvicorn

    uvicorn.run("app.main:app", host=host, port=port, workers=1)


from app.cli_plan import plan as plan_command  # noqa: E402 (a command of its own module)

cli.command("plan")(plan_command)


def main() -> None:
    """Console-script entry point (``zerocalc``)."""
    cli()
