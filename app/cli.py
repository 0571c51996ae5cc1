"""The ``zerocalc`` command: memory, capacity, comm, measure and serve from a terminal.

Where the answers come from:

- ``memory``, ``capacity`` and ``comm`` answer in-process by default: the request body goes
  through the service's own ASGI app (validation, routes, error handlers) over
  ``httpx.ASGITransport``, so the figures are byte for byte the API's and no server is needed.
  With ``--url`` (or ``ZEROCALC_URL``) the same body goes to a running service instead.
- ``measure`` always talks to a running service (it needs the job runner and the GPU):
  ``--url``, default ``http://127.0.0.1:8000``. It draws a progress bar while the job runs.
- ``serve`` starts uvicorn with one worker (one CUDA context, one job runner).

Every command prints a table; ``--json`` prints the API's JSON answer instead. Sizes in tables
say GB (10^9 bytes) and GiB (2^30 bytes).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.core.units import GB, GIB, readable

DEFAULT_URL = "http://127.0.0.1:8000"
LOCAL_BASE = "http://zerocalc.local"  # in-process requests never leave this process

cli = typer.Typer(
    name="zerocalc",
    help="Per-device memory and communication of ZeRO training, predicted and measured.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Piped output gets room for 'X GB (Y GiB)' in every column instead of rich's 80 columns.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


class CliError(Exception):
    """A problem the user can fix; printed without a traceback, exit code 2."""


# ---------- parsing sizes and counts (exact integers, units named) ----------

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": GB,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": GIB,
    "tib": 2**40,
}
_COUNT_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def _decimal(text: str, what: str) -> tuple[Decimal, str]:
    m = re.fullmatch(r"\s*([0-9][0-9_,]*(?:\.[0-9]+)?(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if m is None:
        raise CliError(f"{what}: cannot read {text!r}")
    try:
        return Decimal(m.group(1).replace(",", "").replace("_", "")), m.group(2).lower()
    except InvalidOperation:
        raise CliError(f"{what}: cannot read {text!r}") from None


def parse_size(text: str, what: str = "size") -> int:
    """``80GB`` → 80·10^9, ``80GiB`` → 80·2^30, ``1234`` → 1234 bytes; whole bytes only."""
    value, unit = _decimal(text, what)
    if unit not in _SIZE_UNITS:
        raise CliError(f"{what}: unknown unit {unit!r} (use B, GB = 10^9 or GiB = 2^30 bytes)")
    n = value * _SIZE_UNITS[unit]
    if n != n.to_integral_value():
        raise CliError(f"{what}: {text!r} is not a whole number of bytes")
    return int(n)


def parse_count(text: str, what: str = "params") -> int:
    """``7.5B``, ``7.5e9`` and ``7500000000`` are all 7,500,000,000."""
    value, suffix = _decimal(text, what)
    if suffix not in _COUNT_SUFFIXES:
        raise CliError(f"{what}: unknown suffix {suffix!r} (K, M, B or T)")
    n = value * _COUNT_SUFFIXES[suffix]
    if n != n.to_integral_value():
        raise CliError(f"{what}: {text!r} is not a whole number")
    return int(n)


def _scalar(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    if re.fullmatch(r"[0-9]+", text):
        return int(text)
    return text


def parse_arch(text: str) -> dict[str, Any]:
    """``layers=12,hidden=1024,heads=16,vocab_size=32000`` or a path to a JSON file."""
    path = Path(text)
    if "=" not in text and path.is_file():
        return dict(_read_json(text, "--arch"))
    fields: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--arch: expected name=value, got {part!r}")
        fields[key.strip()] = _scalar(value.strip())
    return fields


def _read_json(source: str, what: str) -> Any:
    try:
        raw = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as e:
        raise CliError(f"{what}: {e.strerror}: {source}") from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise CliError(f"{what}: not valid JSON ({e})") from None


def _stages(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise CliError(f"--stages: expected a list like 0,1,2,3, got {text!r}") from None


# ---------- request bodies ----------


def model_spec(
    params: str | None, preset: str | None, arch: str | None, hf_config: str | None
) -> dict[str, Any] | None:
    given = [
        n
        for n, v in (
            ("--params", params),
            ("--preset", preset),
            ("--arch", arch),
            ("--hf-config", hf_config),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise CliError(f"give one model, not {' and '.join(given)}")
    if params is not None:
        return {"params": parse_count(params)}
    if preset is not None:
        return {"preset": preset}
    if arch is not None:
        return {"architecture": parse_arch(arch)}
    if hf_config is not None:
        return {"hf_config": _read_json(hf_config, "--hf-config")}
    return None


def build_body(base: str | None, **fields: Any) -> dict[str, Any]:
    """The request: ``--body`` (a JSON file or ``-``) first, then every option given."""
    body: dict[str, Any] = {}
    if base is not None:
        loaded = _read_json(base, "--body")
        if not isinstance(loaded, dict):
            raise CliError("--body: must be a JSON object")
        body.update(loaded)
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **{k: v for k, v in value.items() if v is not None}}
        elif isinstance(value, dict):
            value = {k: v for k, v in value.items() if v is not None}
            if value:
                body[key] = value
        else:
            body[key] = value
    return body


def batch_fields(
    micro_batch: int | None, seq_len: int | None, checkpointing: str | None, accum: int | None
) -> dict[str, Any] | None:
    given = {
        "micro_batch_size": micro_batch,
        "seq_len": seq_len,
        "activation_checkpointing": checkpointing,
        "grad_accumulation_steps": accum,
    }
    return given if any(v is not None for v in given.values()) else None


# ---------- transport ----------


def remote_client(url: str, api_key: str | None = None) -> httpx.Client:
    """A client for a running service (tests swap this for a mock transport)."""
    headers = {"X-API-Key": api_key} if api_key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30.0)


async def _local(method: str, path: str, body: dict[str, Any]) -> httpx.Response:
    from app.main import app

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=LOCAL_BASE) as client:
        response = await client.request(method, path, json=body)
        await response.aread()
        return response


def call(path: str, body: dict[str, Any], url: str | None) -> dict[str, Any]:
    """POST ``body`` to ``path``: in-process through the ASGI app, or to ``url``."""
    try:
        if url is None:
            response = asyncio.run(_local("POST", path, body))
        else:
            with remote_client(url) as client:
                response = client.post(path, json=body)
    except httpx.TransportError as e:
        raise CliError(f"cannot reach {url}: {e}") from None
    return _answer(response)


def _answer(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.status_code == 404 and not (
        isinstance(data, dict) and "detail" in data and isinstance(data["detail"], list)
    ):
        raise CliError(f"{response.request.url.path}: this service does not offer it (404)")
    if response.status_code >= 400:
        raise CliError(_problem_text(response.status_code, data))
    if not isinstance(data, dict):
        raise CliError(f"{response.request.url.path}: answered something that is not JSON")
    return data


def _problem_text(status: int, data: Any) -> str:
    detail = data.get("detail") if isinstance(data, dict) else None
    if isinstance(detail, list):
        lines = [
            f"{d.get('field') or 'request'}: {d.get('msg', '')}"
            for d in detail
            if isinstance(d, dict)
        ]
        return f"the service refused the request ({status}):\n  " + "\n  ".join(lines)
    return f"the service answered {status}: {detail if detail is not None else data}"


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


# ---------- tables ----------

_MEMORY_ROWS = (
    ("parameters", "parameters"),
    ("gradients", "gradients"),
    ("optimizer_states", "optimizer states"),
    ("model_states", "model states"),
    ("activations", "activations"),
    ("temporary_buffers", "buffers"),
    ("resident", "resident"),
    ("peak", "peak"),
)


def _size(n: int | None) -> str:
    return "—" if n is None else readable(n)


def memory_table(data: dict[str, Any]) -> Table:
    c = data["convention"]
    table = Table(
        title=f"Memory per device · Ψ = {data['params']:,} · Nd = {data['dp']}, "
        f"TP = {data['tp']}, PP = {data['pp']} · K = {c['k']:g}",
        caption=f"{c['description']}\nGB = 10^9 bytes, GiB = 2^30 bytes.",
        caption_justify="left",
    )
    table.add_column("per device")
    for s in data["stages"]:
        table.add_column(f"stage {s['stage']}", justify="right")
    for key, label in _MEMORY_ROWS:
        table.add_row(
            label,
            *(
                s["per_device_readable"].get(key, _size(s["per_device"][key]))
                for s in data["stages"]
            ),
        )
    for where in ("cpu", "nvme"):
        if any(s[where]["total"] for s in data["stages"]):
            table.add_row(
                f"{where.upper()} per rank", *(_size(s[where]["total"]) for s in data["stages"])
            )
    if any(s["fits"] is not None for s in data["stages"]):
        table.add_row(
            "fits device", *("[green]yes[/]" if s["fits"] else "[red]no[/]" for s in data["stages"])
        )
    return table


def capacity_table(data: dict[str, Any]) -> Table:
    title = f"Capacity · {readable(data['device_memory'])} per device, Nd = {data['dp']}"
    table = Table(title=title, caption=data.get("criterion"), min_width=len(title))
    table.add_column("stage")
    table.add_column("largest model (params)", justify="right")
    with_min_dp = any(s.get("min_dp") is not None for s in data["stages"])
    if with_min_dp:
        table.add_column("smallest Nd", justify="right")
    for s in data["stages"]:
        largest = "—" if s["max_params"] is None else f"{s['max_params']:,}"
        row = [str(s["stage"]), largest]
        if with_min_dp:
            row.append("—" if s.get("min_dp") is None else str(s["min_dp"]))
        table.add_row(*row)
    return table


def _topology(data: dict[str, Any]) -> str:
    t, links = data.get("topology"), data.get("links") or {}
    if not isinstance(t, dict):
        return ""
    where = f"{t['nodes']} node(s) × {t['gpus_per_node']} GPUs" + (
        " (assumed)" if t.get("assumed") else ""
    )
    for key, label in (("intra_node", "intra-node"), ("inter_node", "inter-node")):
        link = links.get(key)
        if isinstance(link, dict):
            where += f" · {label} {link['name']} ({link['bandwidth'] / GB:,.0f} GB/s)"
    return where + "\n"


def communication_table(data: dict[str, Any]) -> Table:
    table = Table(
        title="Communication per rank per optimizer step",
        caption=f"{_topology(data)}GB = 10^9 bytes, GiB = 2^30 bytes.",
    )
    for name, justify in (
        ("stage", "left"),
        ("sent per rank", "right"),
        ("ratio to DDP", "right"),
        ("time", "right"),
        ("collectives", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for s in data["stages"]:
        ops = "\n".join(
            f"{c['op']} ({c['phase']}) ×{c['calls']}: {readable(c['sent_bytes_per_rank'])}"
            for c in s.get("collectives", [])
        )
        ratio = s.get("ratio_to_ddp")
        seconds = s.get("time_seconds")
        table.add_row(
            str(s["stage"]),
            _size(s["sent_bytes_per_rank"]),
            "—" if ratio is None else f"{ratio:.3f}×",
            "—" if seconds is None else f"{seconds * 1e3:,.1f} ms",
            ops,
        )
    return table


def _small_size(n: int | None) -> str:
    """Like ``readable``, but below 0.01 GB in MB (10^6) and MiB (2^20) so it never reads 0.00."""
    if n is None or abs(n) >= GB // 100:
        return _size(n)
    return f"{n / 10**6:,.2f} MB ({n / 2**20:,.2f} MiB)"


def _relative(run: dict[str, Any], key: str) -> float | None:
    """The runner's relative_error for one figure; computed here only where it gave none."""
    e = run.get("relative_error")
    if isinstance(e, dict) and isinstance(e.get(key), int | float):
        return float(e[key])
    m, p = (run.get("measured") or {}).get(key), (run.get("predicted") or {}).get(key)
    if isinstance(m, int) and isinstance(p, int) and m:
        return (p - m) / m
    return None


def _sent(side: Any) -> int | None:
    if isinstance(side, int):
        return side
    if isinstance(side, dict) and isinstance(side.get("sent_bytes_per_rank"), int):
        return int(side["sent_bytes_per_rank"])
    return None


def _communication(comm: dict[str, Any]) -> tuple[int, int, float | None] | None:
    """(measured, predicted, relative error) of the bytes each rank sent."""
    m = comm.get("measured_sent_bytes_per_rank", _sent(comm.get("measured")))
    p = comm.get("predicted_sent_bytes_per_rank", _sent(comm.get("predicted")))
    if not isinstance(m, int) or not isinstance(p, int):
        return None
    e = comm.get("relative_error")
    return m, p, float(e) if isinstance(e, int | float) else ((p - m) / m if m else None)


def _percent(e: float | None) -> str:
    return "—" if e is None else f"{e:+.2%}"


def measure_table(job: dict[str, Any]) -> Table:
    table = Table(
        title=f"Measured vs predicted · job {job['id']}",
        caption="relative error = (predicted − measured) / measured; GB = 10^9 "
        "bytes, GiB = 2^30 bytes (MB = 10^6, MiB = 2^20).",
        caption_justify="left",
    )
    for name in ("stage", "figure", "measured", "predicted", "relative error"):
        table.add_column(name, justify="left" if name in ("stage", "figure") else "right")
    for run in (job.get("result") or {}).get("runs", []):
        measured, predicted = run.get("measured") or {}, run.get("predicted") or {}
        keys = [
            k
            for k in ("resident", "peak")
            if isinstance(measured.get(k), int) or isinstance(predicted.get(k), int)
        ]
        keys += [
            k
            for k, v in measured.items()
            if k not in keys and isinstance(v, int) and isinstance(predicted.get(k), int)
        ]
        for key in keys:
            table.add_row(
                str(run["stage"]),
                key.replace("_", " "),
                _small_size(measured.get(key)),
                _small_size(predicted.get(key)),
                _percent(_relative(run, key)),
            )
        comm = _communication(run.get("communication") or {})
        if comm is not None:
            table.add_row(
                str(run["stage"]),
                "sent bytes per rank",
                _small_size(comm[0]),
                _small_size(comm[1]),
                _percent(comm[2]),
            )
    return table


# ---------- options shared by the commands ----------

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
Params = Annotated[str | None, typer.Option("--params", "-p", help="Ψ: 7.5e9, 7.5B, 7500000000.")]
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
K = Annotated[float | None, typer.Option("--k", help="Optimizer-state bytes per parameter.")]
Gradients = Annotated[str | None, typer.Option("--gradients", help="paper or fp32_grads.")]
OffloadOpt = Annotated[str | None, typer.Option("--offload-optimizer", help="none, cpu or nvme.")]
OffloadParams = Annotated[str | None, typer.Option("--offload-params", help="none, cpu or nvme.")]
Engine = Annotated[str | None, typer.Option("--engine", "-e", help="paper, deepspeed or torch.")]
MicroBatch = Annotated[int | None, typer.Option("--micro-batch", help="Sequences per micro-batch.")]
SeqLen = Annotated[int | None, typer.Option("--seq-len", help="Tokens per sequence.")]
Checkpointing = Annotated[
    str | None,
    typer.Option("--checkpointing", help="Activation checkpointing: none, full or selective."),
]
GradAccum = Annotated[
    int | None, typer.Option("--grad-accum", help="Micro-batches per optimizer step.")
]
DeviceMemory = Annotated[
    str | None,
    typer.Option(
        "--device-memory", "-m", help="Bytes per device: 80GB (10^9), 80GiB (2^30) or bytes."
    ),
]


def _run(fn: Any) -> Any:
    try:
        return fn()
    except CliError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _size_option(text: str | None, what: str) -> int | None:
    return None if text is None else parse_size(text, what)


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
    k: K = None,
    gradients: Gradients = None,
    offload_optimizer: OffloadOpt = None,
    offload_params: OffloadParams = None,
    engine: Engine = None,
    micro_batch: MicroBatch = None,
    seq_len: SeqLen = None,
    checkpointing: Checkpointing = None,
    grad_accum: GradAccum = None,
    device_memory: DeviceMemory = None,
    body: Body = None,
    url: Url = None,
    as_json: Json = False,
) -> None:
    """Per-device memory of one model under each ZeRO stage (POST /v1/memory)."""

    def go() -> None:
        request = build_body(
            body,
            model=model_spec(params, preset, arch, hf_config),
            dp=dp,
            tp=tp,
            pp=pp,
            stages=_stages(stages),
            precision=precision,
            optimizer=optimizer,
            k=k,
            gradients=gradients,
            offload={"optimizer": offload_optimizer, "params": offload_params},
            engine=engine,
            batch=batch_fields(micro_batch, seq_len, checkpointing, grad_accum),
            device_memory=_size_option(device_memory, "--device-memory"),
        )
        data = call("/v1/memory", request, url)
        if as_json:
            emit_json(data)
        else:
            out.print(memory_table(data))

    _run(go)


@cli.command()
def capacity(
    device_memory: DeviceMemory = None,
    dp: Dp = None,
    stages: Stages = None,
    precision: Precision = None,
    optimizer: Optimizer = None,
    k: K = None,
    gradients: Gradients = None,
    offload_optimizer: OffloadOpt = None,
    offload_params: OffloadParams = None,
    engine: Engine = None,
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

    def go() -> None:
        request = build_body(
            body,
            device_memory=_size_option(device_memory, "--device-memory"),
            dp=dp,
            stages=_stages(stages),
            precision=precision,
            optimizer=optimizer,
            k=k,
            gradients=gradients,
            offload={"optimizer": offload_optimizer, "params": offload_params},
            engine=engine,
            model=model_spec(params, preset, arch, hf_config),
            max_dp=max_dp,
        )
        data = call("/v1/capacity", request, url)
        if as_json:
            emit_json(data)
        else:
            out.print(capacity_table(data))

    _run(go)


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
    grad_accum: GradAccum = None,
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

    def go() -> None:
        request = build_body(
            body,
            model=model_spec(params, preset, arch, hf_config),
            dp=dp,
            tp=tp,
            pp=pp,
            stages=_stages(stages),
            precision=precision,
            engine=engine,
            offload={"optimizer": offload_optimizer, "params": offload_params},
            grad_accumulation_steps=grad_accum,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            interconnect=interconnect,
            inter_node_interconnect=inter_node,
        )
        data = call("/v1/communication", request, url)
        if as_json:
            emit_json(data)
        else:
            out.print(communication_table(data))

    _run(go)


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
            job = _answer(client.get(f"/v1/measure/{job_id}"))
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
    micro_batch: MicroBatch = None,
    seq_len: SeqLen = None,
    checkpointing: Checkpointing = None,
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
    ] = DEFAULT_URL,
    as_json: Json = False,
) -> None:
    """Measure real runs on the service's device and compare with the prediction."""

    def go() -> None:
        request = build_body(
            body,
            model=model_spec(None, preset, arch, hf_config),
            dp=dp,
            stages=_stages(stages),
            precision=precision,
            optimizer=optimizer,
            engine=engine,
            batch=batch_fields(micro_batch, seq_len, checkpointing, grad_accum),
            mode=mode,
            device=device,
            steps=steps,
        )
        try:
            with remote_client(url, api_key) as client:
                accepted = _answer(client.post("/v1/measure", json=request))
                job = wait_for_job(client, str(accepted["id"]), interval)
        except httpx.TransportError as e:
            raise CliError(f"cannot reach {url}: {e} (start one with: zerocalc serve)") from None
        if as_json:
            emit_json(job)
        elif job["status"] == "succeeded":
            out.print(measure_table(job))
        if job["status"] != "succeeded":
            raise CliError(f"job {job['id']} {job['status']}: {job.get('error') or ''}".rstrip())

    _run(go)


@cli.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to bind.")] = 8000,
) -> None:
    """Start the service (uvicorn, one worker: one CUDA context, one job runner)."""
    import uvicorn

    uvicorn.run("app.main:app", host=host, port=port, workers=1)


from app.cli_plan import plan as plan_command  # noqa: E402 (it uses the helpers above)

cli.command("plan")(plan_command)


def main() -> None:
    """Console-script entry point (``zerocalc``)."""
    cli()


if __name__ == "__main__":
    main()
