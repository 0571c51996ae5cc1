"""The one printer: a table per answer, or the API's JSON as it came.

Sizes in tables say GB (10^9 bytes) and GiB (2^30 bytes); below 0.01 GB, MB and MiB.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from app.core.units import GB, readable

# Piped output gets room for 'X GB (Y GiB)' in every column instead of rich's 80 columns.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


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


def _found(stage: dict[str, Any]) -> str:
    """The model a capacity stage found, by name when the service names it."""
    model = stage.get("model")
    if isinstance(model, dict) and isinstance(model.get("name"), str):
        return str(model["name"])
    return "—"


def capacity_table(data: dict[str, Any]) -> Table:
    title = f"Capacity · {readable(data['device_memory'])} per device, Nd = {data['dp']}"
    stages = data["stages"]
    notes = [f"stage {s['stage']}: {n}" for s in stages for n in s.get("notes") or []]
    caption = "\n".join(filter(None, [data.get("criterion"), *notes]))
    table = Table(title=title, caption=caption, caption_justify="left", min_width=len(title))
    table.add_column("stage")
    table.add_column("largest model (params)", justify="right")
    named = any(s.get("model") for s in stages)
    if named:
        table.add_column("model found")
    with_min_dp = any(s.get("min_dp") is not None for s in stages)
    if with_min_dp:
        table.add_column("smallest Nd", justify="right")
    for s in stages:
        row = [str(s["stage"]), "—" if s["max_params"] is None else f"{s['max_params']:,}"]
        if named:
            row.append(_found(s))
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
            key
            for key in ("resident", "peak")
            if isinstance(measured.get(key), int) or isinstance(predicted.get(key), int)
        ]
        keys += [
            key
            for key, value in measured.items()
            if key not in keys and isinstance(value, int) and isinstance(predicted.get(key), int)
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


TABLES: dict[str, Callable[[dict[str, Any]], Table]] = {
    "/v1/memory": memory_table,
    "/v1/capacity": capacity_table,
    "/v1/communication": communication_table,
    "/v1/measure": measure_table,
}


def show(path: str, data: dict[str, Any], as_json: bool) -> None:
    """Print the answer of ``path``: its table, or with ``--json`` the JSON itself."""
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        out.print(TABLES[path](data))
