"""``zerocalc plan``: which ZeRO configuration to run, ranked by predicted tokens/s (POST /v1/plan).

Answers in-process through the service's own app, or from ``--url``, like ``memory`` and
``comm``; ``--json`` prints the API's answer.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.table import Table

from app.core.units import GIB


class PlanInputError(Exception):
    """A bad option; printed without a traceback, exit code 2."""


def _list(text: str | None, what: str, cast: Callable[[str], Any] = str) -> list[Any] | None:
    if text is None:
        return None
    try:
        return [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PlanInputError(f"{what}: expected a comma-separated list, got {text!r}") from None


def _every(n: int) -> str:
    """A checkpointing label's every_n_layers suffix (", every 2 layers"); none for 1."""
    return f", every {n} layers" if n > 1 else ""


def _flag(text: str) -> bool:
    """``true`` or ``false`` (as the JSON body has them)."""
    if text.lower() not in ("true", "false"):
        raise ValueError(text)
    return text.lower() == "true"


def gpu_field(name: str | None, memory: str | None, flops: float | None) -> Any:
    """A preset name, or ``{"memory", "peak_flops"}`` from the two figures."""
    if memory is None and flops is None:
        return name
    if name is not None:
        raise PlanInputError("give --gpu or --gpu-memory with --gpu-flops, not both")
    if memory is None or flops is None:
        raise PlanInputError("a custom GPU needs both --gpu-memory and --gpu-flops")
    from app.cli.request import parse_size

    return {"memory": parse_size(memory, "--gpu-memory"), "peak_flops": flops}


def model_field(preset: str | None, arch: str | None, hf_config: str | None) -> Any:
    """The request's ``model`` from whichever one option names it."""
    from app.cli.request import parse_arch, read_json

    given = [
        (n, v) for n, v in (("--preset", preset), ("--arch", arch), ("--hf-config", hf_config)) if v
    ]
    if len(given) > 1:
        raise PlanInputError(f"give one model, not {' and '.join(n for n, _ in given)}")
    if preset:
        return {"preset": preset}
    if arch:
        return {"architecture": parse_arch(arch)}
    if hf_config:
        return {"hf_config": read_json(hf_config, "--hf-config")}
    return None


def plan_body(base: str | None, **fields: Any) -> dict[str, Any]:
    """``--body`` (a JSON file or ``-``) first, then every option given; ``search`` merged."""
    from app.cli.request import read_json

    body: dict[str, Any] = {}
    if base is not None:
        loaded = read_json(base, "--body")
        if not isinstance(loaded, dict):
            raise PlanInputError("--body: must be a JSON object")
        body.update(loaded)
    for key, value in fields.items():
        if isinstance(value, dict) and key == "search":
            given = {k: v for k, v in value.items() if v is not None}
            if given:
                body[key] = {**(body.get(key) or {}), **given}
        elif value is not None:
            body[key] = value
    return body


def _seconds(x: float) -> str:
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.3f} s"


def _host_optimizer_line(data: dict[str, Any]) -> list[str]:
    """The host optimizer's figure, where a candidate offloads."""
    if all(c["config"]["offload"] == "none" for c in data["candidates"]):
        return []
    a = data["assumptions"]
    threads = a["host_optimizer_threads"]
    on = "" if threads is None else f" on {threads} thread(s) per rank"
    return [
        f"host optimizer {a['host_optimizer_bandwidth'] / 1e9:.3g} GB/s per rank{on}: "
        f"{a['host_optimizer_source']}"
    ]


def plan_table(data: dict[str, Any], top: int) -> Table:
    g = data["gpu"]
    cal = data["calibration"]
    rejected = data["rejected"]
    over = [r for r in rejected if r["over_by"] is not None]
    caption = [
        f"GEMM efficiency {cal['efficiency']:.3f}: {cal['source']}",
        f"host {cal['host_seconds_per_kernel'] * 1e6:.1f} µs per kernel: {cal['host_source']}",
        f"{data['evaluated']} configurations evaluated, {len(data['candidates'])} fit, "
        f"{len(rejected)} rejected"
        + (f" (closest: {min(over, key=lambda r: r['over_by'])['reason']})" if over else ""),
        *_host_optimizer_line(data),
        "step = compute (micro-steps, each max(GPU work, host dispatch), and the optimizer "
        "step) + exposed communication + offload transfer; bound = the slower queue; "
        "GiB = 2^30 bytes.",
    ]
    table = Table(
        title=f"Plan · Ψ = {data['params']:,} · {data['gpus']} × {g['label']} "
        f"({data['nodes']} node{'s' if data['nodes'] > 1 else ''}) · "
        f"{data['global_batch_size']} × {data['seq_len']} tokens per step · {data['engine']}",
        caption="\n".join(caption),
        caption_justify="left",
    )
    for name in (
        "#",
        "stage",
        "micro × accum",
        "checkpointing",
        "offload",
        "tokens/s",
        "step",
        "compute",
        "bound",
        "exposed comm",
        "offload xfer",
        "peak GiB",
        "headroom GiB",
    ):
        table.add_column(name, justify="left" if name in ("checkpointing", "offload") else "right")
    for c in data["candidates"][:top]:
        cfg, st = c["config"], c["step_time"]
        stage = str(cfg["stage"])
        if cfg["shard_group_size"]:
            stage += f" (HSDP {cfg['shard_group_size']})"
        table.add_row(
            str(c["rank"]),
            stage,
            f"{cfg['micro_batch_size']} × {cfg['grad_accumulation_steps']}",
            cfg["activation_checkpointing"]
            + _every(cfg["checkpoint_every_n_layers"])
            + (", inputs on host" if cfg["checkpoint_offload"] else ""),
            cfg["offload"],
            f"{c['tokens_per_second']:,.0f}",
            _seconds(c["step_time_seconds"]),
            _seconds(st["compute"]),
            st["bound"],
            _seconds(st["exposed_communication"]),
            _seconds(st["offload_transfer"]),
            f"{c['per_device']['peak'] / GIB:.2f}",
            f"{c['headroom'] / GIB:.2f}",
        )
    return table


def plan(
    preset: Annotated[
        str | None, typer.Option("--preset", help="A model from /v1/presets.")
    ] = None,
    arch: Annotated[
        str | None,
        typer.Option("--arch", help="layers=..,hidden=..,heads=..,vocab_size=.. or a JSON file."),
    ] = None,
    hf_config: Annotated[
        str | None, typer.Option("--hf-config", help="A Hugging Face config.json (or -).")
    ] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="A GPU preset (GET /v1/gpus): h100-sxm, ...")
    ] = None,
    gpu_memory: Annotated[
        str | None, typer.Option("--gpu-memory", help="Custom GPU memory: 48GiB, 80GB, bytes.")
    ] = None,
    gpu_flops: Annotated[
        float | None, typer.Option("--gpu-flops", help="Custom GPU dense peak FLOP/s.")
    ] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", "-n", help="GPUs in all.")] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", help="GPUs per node.")
    ] = None,
    interconnect: Annotated[
        str | None, typer.Option("--interconnect", help="Link inside a node (preset name).")
    ] = None,
    inter_node: Annotated[
        str | None,
        typer.Option("--inter-node-interconnect", help="Link between nodes (preset name)."),
    ] = None,
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", help="Sequences per optimizer step.")
    ] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="Tokens per sequence.")] = None,
    engine: Annotated[str | None, typer.Option("--engine", help="torch or deepspeed.")] = None,
    precision: Annotated[str | None, typer.Option("--precision", help="mixed_bf16, ...")] = None,
    stages: Annotated[str | None, typer.Option("--stages", help="Stages to try: 0,1,2,3.")] = None,
    micro_batch: Annotated[
        str | None, typer.Option("--micro-batch", help="Micro-batches to try: 1,2,4.")
    ] = None,
    checkpointing: Annotated[
        str | None, typer.Option("--checkpointing", help="To try: none,selective,full.")
    ] = None,
    offload: Annotated[
        str | None, typer.Option("--offload", help="To try: none,optimizer,optimizer_and_params.")
    ] = None,
    checkpoint_offload: Annotated[
        str | None,
        typer.Option(
            "--checkpoint-offload",
            help="Full checkpointing's layer inputs to try on the host: false,true (a "
            "transformers model).",
        ),
    ] = None,
    checkpoint_every_n_layers: Annotated[
        str | None,
        typer.Option(
            "--checkpoint-every-n-layers",
            help="Full checkpointing's layer intervals to try: 1,2,4 (1 every layer; a "
            "transformers model under engine torch).",
        ),
    ] = None,
    no_hsdp: Annotated[bool, typer.Option("--no-hsdp", help="Do not try HSDP / MiCS.")] = False,
    efficiency: Annotated[
        float | None, typer.Option("--efficiency", help="Fraction of peak; default calibrated.")
    ] = None,
    host_optimizer_threads: Annotated[
        str | None,
        typer.Option(
            "--host-optimizer-threads",
            help="CPU offload (FSDP2 or DeepSpeed): one or all threads per rank; default as "
            "launchers set.",
        ),
    ] = None,
    top: Annotated[int, typer.Option("--top", help="Rows to show.")] = 15,
    body: Annotated[
        str | None, typer.Option("--body", help="A JSON request body (file or -) to start from.")
    ] = None,
    url: Annotated[
        str | None,
        typer.Option("--url", envvar="ZEROCALC_URL", help="A running service; default in-process."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the API's JSON answer.")] = False,
) -> None:
    """Which ZeRO configuration to run, ranked by predicted tokens/s (POST /v1/plan)."""
    from app.cli import transport
    from app.cli.printer import err, out
    from app.cli.request import CliError

    try:
        search = {
            "stages": _list(stages, "--stages", int),
            "micro_batch_size": _list(micro_batch, "--micro-batch", int),
            "activation_checkpointing": _list(checkpointing, "--checkpointing"),
            "offload": _list(offload, "--offload"),
            "hsdp": False if no_hsdp else None,
            "checkpoint_offload": _list(checkpoint_offload, "--checkpoint-offload", _flag),
            "checkpoint_every_n_layers": _list(
                checkpoint_every_n_layers, "--checkpoint-every-n-layers", int
            ),
        }
        request = plan_body(
            body,
            model=model_field(preset, arch, hf_config),
            gpu=gpu_field(gpu, gpu_memory, gpu_flops),
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            interconnect=interconnect,
            inter_node_interconnect=inter_node,
            global_batch_size=global_batch,
            seq_len=seq_len,
            engine=engine,
            precision=precision,
            search=search,
            efficiency=efficiency,
            host_optimizer_threads=host_optimizer_threads,
        )
        data = transport.post("/v1/plan", request, url)
    except (CliError, PlanInputError) as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        out.print(plan_table(data, top))
