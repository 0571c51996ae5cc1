"""Hugging Face families on the real engines: measured vs predicted, raw JSON and a markdown table.

Every family of :mod:`measure.hf_families` (small configs of the same shape) × engines torch
(stages 0-3: DDP, ZeroRedundancyOptimizer, FSDP2) and deepspeed (stages 0-3, bf16) × with and
without transformers' gradient checkpointing, built by transformers and trained with
``model(input_ids=x, labels=x).loss``.

Over a real process group, one process per GPU, every case in one process group::

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 4 -m measure.validate_hf --out bench/results

A simulated world (PyTorch's fake process group, one GPU, torch engines only)::

    python -m measure.validate_hf --simulated 8,64 --out bench/results

Each run writes ``hf_<world>.json`` (every result as ``/v1/measure`` returns it, plus each
rank's step time, bytes sent and peak) after every case, and ``hf_<world>.md`` at the end.
``--size tiny --device cpu`` checks the script itself on the CPU (gloo under torchrun).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from measure.hf_families import FAMILIES, SIZES, family_config

MIB = 2**20
ENGINES = ("torch", "deepspeed")


def _hf_config(family: str, a: argparse.Namespace) -> dict[str, Any]:
    cfg = family_config(family, a.size)
    if a.attn_implementation != "sdpa":
        cfg["attn_implementation"] = a.attn_implementation
    return cfg


def _body(
    family: str, engine: str, checkpointing: str, a: argparse.Namespace, dp: int, mode: str
) -> dict[str, Any]:
    return {
        "model": {"hf_config": _hf_config(family, a)},
        "dp": dp,
        "stages": a.stages,
        "precision": "mixed_bf16",
        "optimizer": "adamw",
        "engine": engine,
        "mode": mode,
        "device": a.device,
        "batch": {
            "micro_batch_size": a.micro_batch_size,
            "seq_len": a.seq_len,
            "activation_checkpointing": checkpointing,
            "padded": a.padded,
            "checkpoint_offload": a.checkpoint_offload and checkpointing == "full",
            "checkpoint_every_n_layers": a.every_n_layers if checkpointing == "full" else 1,
        },
        "warmup_steps": a.warmup_steps,
        "steps": a.steps,
        "allow_slow_cpu": True,
        **({"engine_config": a.engine_config} if a.engine_config else {}),
    }


def _cases(a: argparse.Namespace, engines: tuple[str, ...]) -> list[tuple[str, str, str]]:
    # torch first: a DeepSpeed stage-3 engine replaces F.linear for the rest of the process
    return [
        (family, engine, ckpt)
        for engine in engines
        for family in a.families
        for ckpt in a.checkpointing
    ]


def _rank_figures(run: dict[str, Any], rank: int) -> dict[str, Any]:
    m = run["measured"]
    return {
        "rank": rank,
        "step_time_s": run["step_time_s"],
        "sent_bytes": run["communication"]["measured_sent_bytes_per_rank"],
        "resident": m["resident"],
        "peak": m["peak"],
    }


def _distributed(a: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    """Under torchrun: every case in one process group; rank 0 keeps the results."""
    import torch
    import torch.distributed as dist

    from measure.runner import _result, _stage_runs
    from measure.spec import parse_spec

    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = a.device == "cuda"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    os.environ.setdefault("DS_ACCELERATOR", device.type)  # before deepspeed is imported
    init: dict[str, Any] = {"backend": "nccl" if cuda else "gloo"}
    if cuda:
        init["device_id"] = device
    dist.init_process_group(init_method="env://", **init)
    rank, world = dist.get_rank(), dist.get_world_size()
    label = f"nccl_nd{world}" if cuda else f"gloo_nd{world}"
    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    try:
        for family, engine, ckpt in _cases(a, tuple(a.engines)):
            # rank 0's clock decides for every rank, so all of them stop at the same case
            go = torch.tensor([float(time.perf_counter() - start < a.budget_s)], device=device)
            dist.broadcast(go, 0)
            if not go.item():
                if rank == 0:
                    sys.stderr.write(f"budget spent: skipping {family} {engine} ckpt={ckpt}\n")
                continue
            ms = parse_spec(_body(family, engine, ckpt, a, world, "distributed"))
            t0 = time.perf_counter()
            runs = _stage_runs(
                ms, device, False, _logger(rank, family, engine, ckpt), "distributed"
            )
            for r in runs:
                every: list[Any] = [None] * world
                dist.all_gather_object(every, _rank_figures(r, rank))
                r["per_rank"] = every
            if rank == 0:
                result = _result(ms, device, runs, "distributed")
                result["wall_time_s"] = time.perf_counter() - t0
                results.append(_case(family, engine, ckpt, result))
                _write(a, label, results)
    finally:
        dist.destroy_process_group()
    return label, results if rank == 0 else []


def _simulated(a: argparse.Namespace, nd: int) -> list[dict[str, Any]]:
    from measure.runner import run

    results: list[dict[str, Any]] = []
    label = f"simulated_nd{nd}"
    for family, engine, ckpt in _cases(a, ("torch",)):  # DeepSpeed needs a real group
        if time.perf_counter() - a.start > a.budget_s:
            sys.stderr.write(f"budget spent: skipping {family} {engine} ckpt={ckpt} Nd {nd}\n")
            continue
        result = run(
            _body(family, engine, ckpt, a, nd, "simulated"), _logger(0, family, engine, ckpt)
        )
        for r in result["runs"]:
            r["per_rank"] = [_rank_figures(r, 0)]
        results.append(_case(family, engine, ckpt, result))
        _write(a, label, results)
    return results


def _case(family: str, engine: str, ckpt: str, result: dict[str, Any]) -> dict[str, Any]:
    return {"family": family, "engine": engine, "checkpointing": ckpt, "result": result}


def _logger(rank: int, family: str, engine: str, ckpt: str) -> Any:
    def log(fraction: float, message: str) -> None:
        if rank == 0:
            sys.stderr.write(f"[{family} {engine} ckpt={ckpt} {fraction:4.0%}] {message}\n")

    return log


def _stem(a: argparse.Namespace, label: str) -> str:
    """``hf_<world>``, with the engines where a run leaves some out (so runs never collide)."""
    engines = ["torch"] if label.startswith("simulated") else a.engines
    suffix = (
        ""
        if set(engines) == set(ENGINES) or label.startswith("simulated")
        else "_" + "_".join(engines)
    )
    size = "" if a.size == "small" else f"_{a.size}"
    stages = "" if a.stages == [0, 1, 2, 3] else "_stage" + "".join(map(str, a.stages))
    padded = "_padded" if a.padded else ""
    attention = "" if a.attn_implementation == "sdpa" else f"_{a.attn_implementation}"
    offload = "_offload" if a.checkpoint_offload else ""
    every = f"_every{a.every_n_layers}" if a.every_n_layers > 1 else ""
    return f"hf_{label}{suffix}{size}{stages}{padded}{attention}{offload}{every}"


def _write(a: argparse.Namespace, label: str, results: list[dict[str, Any]]) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = {"world": label, "size": a.size, "cases": results}
    if a.engine_config:
        body["engine_config"] = a.engine_config
    if a.attn_implementation != "sdpa":
        body["attn_implementation"] = a.attn_implementation
    (out / f"{_stem(a, label)}.json").write_text(json.dumps(body, indent=1))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f}"


def _mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / MIB:,.1f}"


HEADER = (
    "| family | engine | stage | ckpt | Nd | resident MiB meas / pred | err % | peak MiB meas / "
    "pred | err % | sent/rank MiB meas / pred | err % | step s rank 0 / slowest | "
    "peak moment (predicted) |\n|" + "---|" * 13
)


def table(label: str, cases: list[dict[str, Any]]) -> str:
    """The markdown table of one world's results, with a summary per family."""
    lines = [f"### {label}", "", HEADER]
    errs: dict[str, dict[str, list[float]]] = {}
    for case in cases:
        for r in case["result"]["runs"]:
            m, p, e, c = r["measured"], r["predicted"], r["relative_error"], r["communication"]
            times = [x["step_time_s"] for x in r.get("per_rank", []) if x["step_time_s"]]
            moment = next((n for n in p["notes"] if n.startswith("peak at ")), "")
            lines.append(
                f"| {case['family']} | {case['engine']} | {r['stage']} | {case['checkpointing']} "
                f"| {r['world_size']} | {_mib(m['resident'])} / {_mib(p['resident'])} "
                f"| {_pct(e['resident'])} | {_mib(m['peak'])} / {_mib(p['peak'])} "
                f"| {_pct(e['peak'])} | {_mib(c['measured_sent_bytes_per_rank'])} / "
                f"{_mib(c['predicted_sent_bytes_per_rank'])} | {_pct(c['relative_error'])} "
                f"| {r['step_time_s'] or 0:.3f} / {max(times, default=0):.3f} "
                f"| {moment.split(';')[0][8:]} |"
            )
            fam = errs.setdefault(case["family"], {"resident": [], "peak": []})
            for key in ("resident", "peak"):
                if e[key] is not None:
                    fam[key].append(e[key])
    lines += [
        "",
        "| family | runs | resident median / max abs err % | peak median / max abs "
        "err % | most negative peak err % |",
        "|---|---:|---|---|---:|",
    ]
    for family, fam in errs.items():

        def summary(values: list[float]) -> str:
            if not values:
                return "n/a"
            absolute = [abs(x) for x in values]
            return f"{100 * statistics.median(absolute):.2f} / {100 * max(absolute):.2f}"

        lowest = f"{100 * min(fam['peak']):+.2f}" if fam["peak"] else "n/a"
        lines.append(
            f"| {family} | {len(fam['resident'])} | {summary(fam['resident'])} "
            f"| {summary(fam['peak'])} | {lowest} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m measure.validate_hf", description=__doc__)
    ap.add_argument("--simulated", help="comma-separated Nd of simulated worlds (e.g. 8,64)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--checkpointing", default="none,full")
    ap.add_argument("--stages", default="0,1,2,3", help="comma-separated ZeRO stages")
    ap.add_argument(
        "--engine-config",
        type=json.loads,
        default=None,
        help="JSON object every run's request carries as engine_config (DeepSpeed knobs; FSDP2 "
        "settings under engine torch)",
    )
    ap.add_argument("--size", default="small", choices=sorted(SIZES))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument(
        "--padded",
        action="store_true",
        help="train on padded batches: an attention_mask with zeros (the last sequence padded "
        "from its middle)",
    )
    ap.add_argument(
        "--checkpoint-offload",
        action="store_true",
        help="the checkpointed cases offload their layers' inputs to pinned host memory "
        "(transformers' gradient_checkpointing_enable(offload=True))",
    )
    ap.add_argument(
        "--every-n-layers",
        type=int,
        default=1,
        help="the checkpointed cases checkpoint decoder layers 0, n, 2n, ... only "
        "(transformers' gradient_checkpointing_enable(every_n_layers=n))",
    )
    ap.add_argument(
        "--attn-implementation",
        default="sdpa",
        choices=["sdpa", "eager"],
        help="the attention transformers builds (the config body's attn_implementation)",
    )
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument(
        "--budget-s", type=float, default=1e9, help="start no case after this many seconds"
    )
    a = ap.parse_args(argv)
    a.start = time.perf_counter()
    a.families = [f for f in a.families.split(",") if f]
    a.engines = [e for e in a.engines.split(",") if e]
    a.checkpointing = [c for c in a.checkpointing.split(",") if c]
    a.stages = [int(s) for s in a.stages.split(",") if s]
    worlds: list[tuple[str, list[dict[str, Any]]]] = []
    if a.simulated:
        for nd in (int(x) for x in a.simulated.split(",")):
            worlds.append((f"simulated_nd{nd}", _simulated(a, nd)))
    else:
        label, results = _distributed(a)
        if results:
            worlds.append((label, results))
    for label, results in worlds:
        text = table(label, results)
        sys.stdout.write(text + "\n\n")
        (Path(a.out) / f"{_stem(a, label)}.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
