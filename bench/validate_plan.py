"""Check /v1/plan's predicted step times against measured ones on this host's GPUs.

On a GPU host (one process per visible GPU, through the same path ``POST /v1/measure`` takes)::

    NCCL_NVLS_ENABLE=0 python3 bench/validate_plan.py --out bench/results

The planner enumerates its candidates for a 1B-class GPT (``--preset`` or ``--hf-config`` for
another model) at Nd = the number of visible GPUs; each candidate that fits is measured with
``measure.runner.run(mode="distributed")`` (fresh processes per run, ``--steps`` timed steps
after the runner's warm-up). The compute efficiency is then calibrated on one run (the planner's
first choice, as ``POST /v1/calibrations`` would) and every prediction is redone with it.

Written: ``plan_validation_nd<N>.json`` and ``.md`` with, per candidate, the predicted step time
(stated default efficiency and calibrated) and the measured one; the median |error| after
calibration over the runs not used to calibrate; and whether the planner's first choice is within
5 % of the measured fastest.

Quick check on a CPU (gloo, tiny model; the figures mean nothing, the pipeline runs)::

    python3 bench/validate_plan.py --device cpu --gpus 2 --tiny --gpu l4 --max-runs 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.architecture import Architecture, count_params  # noqa: E402
from calculators.batch import Checkpointing  # noqa: E402
from calculators.communication import GradSync, Network  # noqa: E402
from calculators.conventions import Engine, Precision, Stage  # noqa: E402
from calculators.gpus import Gpu, get_gpu, gpu_for_device_name  # noqa: E402
from calculators.hf_config import architecture_from_hf_config  # noqa: E402
from calculators.interconnects import get_interconnect  # noqa: E402
from calculators.plan import (  # noqa: E402
    Config,
    Efficiency,
    OffloadChoice,
    PlanSetup,
    Search,
    calibrate,
    plan,
    predict,
)
from calculators.presets import get_preset  # noqa: E402

# A 1B-class GPT (GPT-2 style, as measure.workloads builds it): 16 × 12·2048² + embeddings
# = 1.03 B parameters.
GPT_1B = Architecture(
    layers=16, hidden=2048, heads=16, vocab_size=50304, ffn_hidden=8192, max_seq_len=1024
)
TINY = Architecture(layers=2, hidden=64, heads=2, vocab_size=128, max_seq_len=64)
WITHIN = 0.05  # the first choice counts as right within 5 % of the measured fastest


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gpus", type=int, default=None, help="Nd (default: visible GPUs)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--gpu", default=None, help="GPU preset (default: from the device name)")
    model = ap.add_mutually_exclusive_group()
    model.add_argument("--preset", default=None, help="a bundled model instead of the 1B GPT")
    model.add_argument("--hf-config", default=None, help="a config.json instead of the 1B GPT")
    model.add_argument("--tiny", action="store_true", help="a 2-layer GPT (CPU checks)")
    ap.add_argument("--engine", default="torch", choices=("torch", "deepspeed"))
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--per-gpu-batch", type=int, default=8, help="sequences per GPU per step")
    ap.add_argument("--micro", type=_ints, default=(2, 8), help="micro-batch sizes to try")
    ap.add_argument("--stages", type=_ints, default=(0, 1, 2, 3))
    ap.add_argument("--checkpointing", default="none", help="comma list: none,selective,full")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run")
    ap.add_argument("--max-runs", type=int, default=8, help="measure at most this many")
    ap.add_argument("--out", default="bench/results")
    return ap.parse_args(argv)


def architecture(args: argparse.Namespace) -> tuple[Architecture, dict[str, Any]]:
    """The model and the ``model`` body the measure runner builds it from."""
    if args.tiny:
        return TINY, {"architecture": _arch_body(TINY)}
    if args.preset:
        return get_preset(args.preset).architecture, {"preset": args.preset}
    if args.hf_config:
        body = json.loads(Path(args.hf_config).read_text())
        return architecture_from_hf_config(body), {"hf_config": body}
    return GPT_1B, {"architecture": _arch_body(GPT_1B)}


def _arch_body(arch: Architecture) -> dict[str, Any]:
    return {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(arch).items()}


def visible_gpus(device: str) -> tuple[int, str]:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.device_count(), torch.cuda.get_device_name(0)
    return 0, "cpu"


def measure(spec: dict[str, Any]) -> float:
    from measure.runner import run

    result = run(spec)
    seconds = result["runs"][0]["step_time_s"]
    if not isinstance(seconds, int | float) or seconds <= 0:
        raise RuntimeError(f"no step time in the result: {result['runs'][0]}")
    return float(seconds)


def spec_for(args: argparse.Namespace, model: dict[str, Any], nd: int, c: Config) -> dict[str, Any]:
    offload = {
        OffloadChoice.NONE: {},
        OffloadChoice.OPTIMIZER: {"optimizer": "cpu"},
        OffloadChoice.OPTIMIZER_AND_PARAMS: {"optimizer": "cpu", "params": "cpu"},
    }[c.offload]
    return {
        "model": model,
        "dp": nd,
        "stages": [int(c.stage)],
        "precision": "mixed_bf16",
        "engine": args.engine,
        "batch": {
            "micro_batch_size": c.micro_batch_size,
            "seq_len": args.seq_len,
            "activation_checkpointing": c.activation_checkpointing.value,
            "grad_accumulation_steps": c.grad_accumulation_steps,
        },
        "offload": offload,
        "mode": "distributed",
        "device": args.device,
        "steps": args.steps,
        "warmup_steps": 2,
    }


def config_label(c: Config) -> str:
    parts = [f"stage {int(c.stage)}", f"micro {c.micro_batch_size} × {c.grad_accumulation_steps}"]
    if c.activation_checkpointing is not Checkpointing.NONE:
        parts.append(f"ckpt {c.activation_checkpointing.value}")
    if c.offload is not OffloadChoice.NONE:
        parts.append(f"offload {c.offload.value}")
    return ", ".join(parts)


def plan_setup(args: argparse.Namespace, arch: Architecture, gpu: Gpu, nd: int) -> PlanSetup:
    """The planner's view of the runs: ``args.per_gpu_batch`` sequences per GPU per step."""
    engine = Engine(args.engine)
    return PlanSetup(
        architecture=arch,
        params=count_params(arch),
        gpu=gpu,
        gpus=nd,
        gpus_per_node=nd,
        network=Network(
            intra=get_interconnect(gpu.intra_node_link, "gpu"),
            host=get_interconnect(gpu.host_link, "gpu"),
        ),
        global_batch_size=args.per_gpu_batch * nd,
        seq_len=args.seq_len,
        engine=engine,
        precision=Precision.MIXED_BF16,
        search=Search(
            stages=tuple(Stage(s) for s in args.stages),
            micro_batch_sizes=args.micro,
            activation_checkpointing=tuple(
                Checkpointing(x) for x in args.checkpointing.split(",") if x
            ),
            offload=(OffloadChoice.NONE,),
            hsdp=False,
        ),
        # measure's loop calls backward on every micro-batch without no_sync
        grad_sync=GradSync.PER_MICRO_STEP,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    count, device_name = visible_gpus(args.device)
    nd = args.gpus or count
    if nd < 1:
        print("no GPU visible: give --device cpu --gpus N --gpu PRESET for a CPU check")
        return 2
    if args.device == "cuda" and nd != count:
        print(f"distributed mode runs one process per GPU: --gpus must be {count} here")
        return 2
    gpu: Gpu | None = get_gpu(args.gpu) if args.gpu else gpu_for_device_name(device_name)
    if gpu is None:
        print(f"no GPU preset matches {device_name!r}: give --gpu")
        return 2
    arch, model = architecture(args)
    engine = Engine(args.engine)
    setup = plan_setup(args, arch, gpu, nd)
    planned = plan(setup)
    print(
        f"{count_params(arch):,} params, Nd = {nd} × {gpu.name}: {planned.evaluated} "
        f"configurations, {len(planned.candidates)} fit, {len(planned.rejected)} rejected"
    )
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for cand in planned.candidates[: args.max_runs]:
        c = cand.config
        t0 = time.perf_counter()
        seconds = measure(spec_for(args, model, nd, c))
        rows.append({"config": c, "measured": seconds, "predicted_default": cand.step.total})
        print(
            f"  {config_label(c):40s} predicted {cand.step.total:8.4f} s  measured "
            f"{seconds:8.4f} s  ({time.perf_counter() - t0:.0f} s wall, "
            f"{time.perf_counter() - start:.0f} s so far)"
        )
    if not rows:
        print("nothing fits: no run to compare")
        return 1

    # calibrate on the planner's first choice, as POST /v1/calibrations would
    first = rows[0]
    cal = calibrate(setup, first["config"], first["measured"])
    calibrated = replace(
        setup,
        efficiency=Efficiency(cal.efficiency, f"calibrated on {config_label(first['config'])}"),
    )
    for row in rows:
        row["predicted_calibrated"] = predict(calibrated, row["config"])[1].total
        for key in ("default", "calibrated"):
            row[f"error_{key}"] = row[f"predicted_{key}"] / row["measured"] - 1
    others = rows[1:] or rows
    median_default = statistics.median(abs(r["error_default"]) for r in rows)
    median_calibrated = statistics.median(abs(r["error_calibrated"]) for r in others)
    replanned = sorted(rows, key=lambda r: r["predicted_calibrated"])[0]
    fastest = min(rows, key=lambda r: r["measured"])
    within = replanned["measured"] <= fastest["measured"] * (1 + WITHIN)

    report = {
        "model": count_params(arch),
        "model_body": model,
        "nd": nd,
        "gpu": gpu.name,
        "device_name": device_name,
        "engine": engine.value,
        "seq_len": args.seq_len,
        "per_gpu_batch": args.per_gpu_batch,
        "steps": args.steps,
        "evaluated": planned.evaluated,
        "efficiency_default": setup.efficiency.value,
        "efficiency_calibrated": cal.efficiency,
        "calibrated_on": config_label(first["config"]),
        "median_abs_error_default": median_default,
        "median_abs_error_calibrated": median_calibrated,
        "first_choice": config_label(replanned["config"]),
        "measured_fastest": config_label(fastest["config"]),
        "first_choice_within_5_percent": within,
        "wall_seconds": time.perf_counter() - start,
        "runs": [
            {**{k: v for k, v in r.items() if k != "config"}, "config": config_label(r["config"])}
            | {"config_fields": {k: str(v) for k, v in asdict(r["config"]).items()}}
            for r in rows
        ],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"plan_validation_nd{nd}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


def markdown(r: dict[str, Any]) -> str:
    lines = [
        f"### Plan vs measured: {r['model']:,} parameters, Nd = {r['nd']} × {r['device_name']} "
        f"({r['engine']}, {r['per_gpu_batch']} × {r['seq_len']} tokens per GPU)",
        "",
        f"Efficiency: default {r['efficiency_default']:.3f}, calibrated "
        f"{r['efficiency_calibrated']:.3f} on {r['calibrated_on']}.",
        "",
        "| configuration | measured (s) | predicted, default (s) | error | predicted, "
        "calibrated (s) | error |",
        "|---|---|---|---|---|---|",
    ]
    for run in r["runs"]:
        lines.append(
            f"| {run['config']} | {run['measured']:.4f} | {run['predicted_default']:.4f} | "
            f"{run['error_default']:+.1%} | {run['predicted_calibrated']:.4f} | "
            f"{run['error_calibrated']:+.1%} |"
        )
    lines += [
        "",
        f"Median |error|: {r['median_abs_error_default']:.1%} with the stated default, "
        f"{r['median_abs_error_calibrated']:.1%} after calibration (runs not calibrated on).",
        f"First choice after calibration: {r['first_choice']}; measured fastest: "
        f"{r['measured_fastest']}; within 5 %: "
        + ("yes." if r["first_choice_within_5_percent"] else "no."),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
