"""Check /v1/plan's predicted step times against measured ones on this host's GPUs.

On a GPU host (one process per visible GPU, through the same path ``POST /v1/measure`` takes)::

    NCCL_NVLS_ENABLE=0 python3 bench/validate_plan.py --out bench/results

The planner enumerates its candidates for a 1B-class GPT (``--preset`` or ``--hf-config`` for
another model) at Nd = the number of visible GPUs; each candidate that fits is measured with
``measure.runner.run(mode="distributed")`` (fresh processes per run, ``--steps`` timed steps
after the runner's warm-up). The compute efficiency is then calibrated on one run (the planner's
first choice, as ``POST /v1/calibrations`` would) and every prediction is redone with it.

``--calibration probe``: every run also times the measure runner's host probe (the training
micro-step at one 32-token sequence, ``measure.host_probe``), and the report adds a column
calibrated on the first choice alone with its probe (the probe sets the host cost per kernel,
the step the GEMM efficiency: both figures from one run), plus each run's own probe's host cost.

Written: ``plan_validation_nd<N>.json`` and ``.md`` with, per candidate, the predicted step time
(stated default efficiency and calibrated) and the measured one; the median |error| after
calibration over the runs not used to calibrate; and whether the planner's first choice is within
5 % of the measured fastest.

Quick check on a CPU (gloo, tiny model; the figures mean nothing, the pipeline runs)::

    python3 bench/validate_plan.py --device cpu --gpus 2 --tiny --seq-len 32 --gpu l4 --max-runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.architecture import Architecture, count_params  # noqa: E402
from calculators.batch import Checkpointing  # noqa: E402
from calculators.communication import GradSync, Network  # noqa: E402
from calculators.conventions import Engine, Precision, Stage  # noqa: E402
from calculators.errors import InputError  # noqa: E402
from calculators.gpus import Gpu, get_gpu, gpu_for_device_name  # noqa: E402
from calculators.hf_config import architecture_from_hf_config  # noqa: E402
from calculators.interconnects import get_interconnect  # noqa: E402
from calculators.plan import (  # noqa: E402
    Calibration,
    Config,
    HostProbe,
    Learned,
    OffloadChoice,
    PlanSetup,
    Search,
    calibrate,
    plan,
    predict,
    recorded_threads,
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
    ap.add_argument(
        "--offload",
        default="none",
        help="comma list: none,optimizer,optimizer_and_params (torch: FSDP2's CPU offload, "
        "stages 2-3)",
    )
    ap.add_argument(
        "--checkpoint-offload",
        default="false",
        help="comma list: false,true (true: full checkpointing's layer inputs in host memory, "
        "transformers' offload=True; a transformers model)",
    )
    ap.add_argument(
        "--every-n-layers",
        type=_ints,
        default=(1,),
        help="comma list of full checkpointing's layer intervals: 1,2,4 (n: layers 0, n, 2n, ... "
        "checkpointed, transformers' every_n_layers; a transformers model, engine torch)",
    )
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run")
    ap.add_argument("--max-runs", type=int, default=8, help="measure at most this many")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument(
        "--calibration",
        default="runs",
        choices=("runs", "probe"),
        help="runs: calibrate on one and on two measured runs; probe: also time each run's "
        "host probe and calibrate both figures on the first choice alone",
    )
    ap.add_argument(
        "--grad-sync",
        default="per_micro_step",
        choices=("per_micro_step", "per_step"),
        help="under accumulation DDP (stages 0-1) reduces every micro-step, or once per step "
        "with no_sync on the others (FSDP2 reduces every micro-step either way)",
    )
    ap.add_argument(
        "--report",
        nargs="+",
        default=None,
        metavar="JSON",
        help="no GPU: re-predict the measured step times in these plan_validation / "
        "plan_profile JSON files with the current model and write plan_model_check.md",
    )
    ap.add_argument(
        "--host-optimizer-bandwidth",
        type=float,
        default=None,
        metavar="BYTES_PER_S",
        help="with --report: predict at this host optimizer bandwidth per rank instead of the "
        "stated one (e.g. 37.5e9, DeepSpeed's figure before its runs were measured)",
    )
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


def measure(
    spec: dict[str, Any],
) -> tuple[float, dict[str, Any] | None, float | None, int | None]:
    """The run's step seconds, its host probe (None when the spec turned it off), its timed
    host optimizer step (None without CPU offload) and the torch threads each rank ran on."""
    from measure.runner import run

    result = run(spec)
    seconds = result["runs"][0]["step_time_s"]
    if not isinstance(seconds, int | float) or seconds <= 0:
        raise RuntimeError(f"no step time in the result: {result['runs'][0]}")
    probe = result["runs"][0].get("host_probe")
    host_step = result["runs"][0].get("host_optimizer_step_s")
    threads = (result.get("environment") or {}).get("cpu_threads")
    return (
        float(seconds),
        probe if isinstance(probe, dict) else None,
        float(host_step) if isinstance(host_step, int | float) else None,
        threads if isinstance(threads, int) else None,
    )


def host_probe(found: Any) -> HostProbe | None:
    """The planner's view of a run's ``host_probe`` entry."""
    if not isinstance(found, dict) or not isinstance(found.get("seconds"), int | float):
        return None
    return HostProbe(float(found["seconds"]), int(found["micro_batch_size"]), int(found["seq_len"]))


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
            **({"checkpoint_offload": True} if c.checkpoint_offload else {}),
            **(
                {"checkpoint_every_n_layers": c.checkpoint_every_n_layers}
                if c.checkpoint_every_n_layers > 1
                else {}
            ),
        },
        "offload": offload,
        "mode": "distributed",
        "device": args.device,
        "steps": args.steps,
        "warmup_steps": 2,
        # bench/profile_plan.py hands its own arguments, without --calibration
        "host_probe": getattr(args, "calibration", "runs") == "probe",
        # per_step is DDP's no_sync: FSDP2 stages reduce every micro-step, as the planner has it
        **({"grad_sync": "per_step"} if ddp_no_sync(args, c) else {}),
    }


def ddp_no_sync(args: argparse.Namespace, c: Config) -> bool:
    """Whether the run of ``c`` defers DDP's reduction to the last micro-step."""
    return (
        getattr(args, "grad_sync", "per_micro_step") == "per_step"
        and args.engine == "torch"
        and c.stage < Stage.GRADIENTS
    )


def config_label(c: Config) -> str:
    parts = [f"stage {int(c.stage)}", f"micro {c.micro_batch_size} × {c.grad_accumulation_steps}"]
    if c.activation_checkpointing is not Checkpointing.NONE:
        parts.append(f"ckpt {c.activation_checkpointing.value}")
    if c.checkpoint_every_n_layers > 1:
        parts.append(f"every {c.checkpoint_every_n_layers} layers")
    if c.checkpoint_offload:
        parts.append("inputs on host")
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
            offload=tuple(
                OffloadChoice(x) for x in getattr(args, "offload", "none").split(",") if x
            ),
            hsdp=False,
            checkpoint_offload=tuple(
                x.strip().lower() == "true"
                for x in getattr(args, "checkpoint_offload", "false").split(",")
                if x.strip()
            ),
            checkpoint_every_n_layers=tuple(getattr(args, "every_n_layers", (1,))),
        ),
        # as the runs reduce: measure's loop reduces every micro-step unless --grad-sync per_step
        grad_sync=GradSync(getattr(args, "grad_sync", "per_micro_step")),
    )


def _field(fields: dict[str, Any], key: str) -> str:
    return str(fields[key]).split(".")[-1].lower()


def _timed_by_config(body: dict[str, Any]) -> Iterator[tuple[Config, dict[str, Any]]]:
    """Each timed run of a plan_validation JSON with its configuration."""
    for (c, _), run in zip(measured_runs(body), _timed(body), strict=True):
        yield c, run


def measured_probes(body: dict[str, Any]) -> dict[Config, HostProbe]:
    """The host probes of a plan_validation JSON's runs, by configuration."""
    found = {}
    for c, run in _timed_by_config(body):
        probe = host_probe(run.get("host_probe"))
        if probe is not None:
            found[c] = probe
    return found


def measured_host_steps(body: dict[str, Any]) -> dict[Config, float]:
    """The timed host optimizer steps of a plan_validation JSON's offloaded runs."""
    found = {}
    for c, run in _timed_by_config(body):
        seconds = run.get("host_optimizer_step_s")
        if isinstance(seconds, int | float) and seconds > 0:
            found[c] = float(seconds)
    return found


def _timed(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        r
        for r in body["runs"]
        if isinstance(r.get("measured", r.get("step_s")), int | float)
        and r.get("measured", r.get("step_s")) > 0
    ]


def measured_runs(body: dict[str, Any]) -> list[tuple[Config, float]]:
    """(configuration, measured step seconds) of a plan_validation or plan_profile JSON."""
    out = []
    for run in body["runs"]:
        seconds = run.get("measured", run.get("step_s"))
        if not isinstance(seconds, int | float) or seconds <= 0:
            continue  # a run that failed (out of memory) has no step time
        f = run["config_fields"]
        shard = f.get("shard_group_size")
        config = Config(
            stage=Stage(int(f["stage"])),
            micro_batch_size=int(f["micro_batch_size"]),
            grad_accumulation_steps=int(f["grad_accumulation_steps"]),
            activation_checkpointing=Checkpointing(_field(f, "activation_checkpointing")),
            offload=OffloadChoice(_field(f, "offload")) if "offload" in f else OffloadChoice.NONE,
            shard_group_size=None if shard in (None, "None") else int(shard),
            checkpoint_offload=str(f.get("checkpoint_offload", False)) == "True",
            checkpoint_every_n_layers=int(f.get("checkpoint_every_n_layers", 1)),
        )
        out.append((config, float(seconds)))
    return out


def committed_setup(
    body: dict[str, Any], runs: list[tuple[Config, float]]
) -> tuple[argparse.Namespace, PlanSetup]:
    """The options and planner setup a plan_validation JSON's runs were measured under.

    Raises:
        ValueError: the runs have different per-GPU batches.
    """
    configs = [c for c, _ in runs]
    nd = int(body["nd"])
    batch = {c.micro_batch_size * c.grad_accumulation_steps for c in configs}
    if len(batch) != 1:
        raise ValueError(f"runs of different per-GPU batches {sorted(batch)}")
    case = parse(
        [
            "--gpus", str(nd),
            "--seq-len", str(body["seq_len"]),
            "--per-gpu-batch", str(batch.pop()),
            "--micro", ",".join(str(c.micro_batch_size) for c in configs),
            "--stages", ",".join(str(int(c.stage)) for c in configs),
            "--engine", body.get("engine", "torch"),
            "--checkpointing",
            ",".join(sorted({c.activation_checkpointing.value for c in configs})),
            "--grad-sync", body.get("grad_sync", "per_micro_step"),
            "--offload", ",".join(sorted({c.offload.value for c in configs})),
            "--checkpoint-offload",
            ",".join(sorted({str(c.checkpoint_offload).lower() for c in configs})),
            "--every-n-layers",
            ",".join(str(n) for n in sorted({c.checkpoint_every_n_layers for c in configs})),
        ]
    )  # fmt: skip
    arch = architecture_from_body(body["model_body"])
    return case, with_recorded_threads(plan_setup(case, arch, get_gpu(body["gpu"]), nd), body)


def with_recorded_threads(setup: PlanSetup, body: dict[str, Any]) -> PlanSetup:
    """``setup`` with the host threads its offloaded runs' ranks recorded (``cpu_threads``),
    where they agree; else as the planner derives them."""
    recorded = {r["cpu_threads"] for r in body["runs"] if isinstance(r.get("cpu_threads"), int)}
    if len(recorded) != 1:
        return setup
    threads, source = recorded_threads(recorded.pop())
    return replace(setup, host_threads=threads, host_threads_source=source)


def report_files(args: argparse.Namespace) -> int:
    """Re-predict committed measurements with the current model (no GPU needed)."""
    sections, bodies = [], []
    for name in args.report:
        body = json.loads(Path(name).read_text())
        runs = measured_runs(body)
        if not runs:
            print(f"{name}: no measured run")
            continue
        try:
            case, setup = committed_setup(body, runs)
        except ValueError as err:
            print(f"{name}: {err}")
            return 2
        if args.host_optimizer_bandwidth is not None:
            setup = replace(
                setup,
                host_optimizer_bandwidth=args.host_optimizer_bandwidth,
                host_optimizer_given_source="given by --host-optimizer-bandwidth",
            )
        env = body.get("environment") or {}
        result = {
            "source": name,
            "model": setup.params,
            "nd": setup.gpus,
            "gpu": setup.gpu.name,
            "device_name": body.get("device_name") or env.get("device_name") or setup.gpu.label,
            "engine": case.engine,
            "seq_len": case.seq_len,
            "per_gpu_batch": case.per_gpu_batch,
            **evaluate(setup, runs, measured_probes(body), measured_host_steps(body)),
        }
        bodies.append(result)
        sections.append(f"From `{name}`:\n\n" + markdown(result))
    text = "\n".join(sections)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_model_check.md").write_text(text)
    (out / "plan_model_check.json").write_text(json.dumps(bodies, indent=2) + "\n")
    print(text)
    return 0


def architecture_from_body(body: dict[str, Any]) -> Architecture:
    """The architecture of a stored ``model`` body, read as ``POST /v1/measure`` reads it."""
    from app.api.convert import resolve_model
    from app.schemas.model import ModelSpec

    if "architecture" in body:  # the measure runner's body carries the unset modelling field
        fields = {k: v for k, v in body["architecture"].items() if v is not None}
        body = {**body, "architecture": fields}
    _, arch = resolve_model(ModelSpec(**body))
    if arch is None:
        raise ValueError("the stored model has no architecture to re-predict")
    return arch


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.report:
        return report_files(args)
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
    probes: dict[Config, HostProbe] = {}
    header = {
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
        "calibration": args.calibration,
        "grad_sync": args.grad_sync,
    }
    report: dict[str, Any] = {}
    for cand in planned.candidates[: args.max_runs]:
        c = cand.config
        t0 = time.perf_counter()
        seconds, probe, host_step, threads = measure(spec_for(args, model, nd, c))
        rows.append({"config": c, "measured": seconds, "predicted_default": cand.step.total})
        if host_step is not None:
            rows[-1]["host_optimizer_step_s"] = host_step
            rows[-1]["cpu_threads"] = threads
        found = host_probe(probe)
        if found is not None:
            probes[c] = found
            rows[-1]["host_probe"] = probe
        print(
            f"  {config_label(c):40s} predicted {cand.step.total:8.4f} s  measured "
            f"{seconds:8.4f} s"
            + ("" if found is None else f"  probe {found.seconds * 1e3:.1f} ms")
            + f"  ({time.perf_counter() - t0:.0f} s wall, "
            f"{time.perf_counter() - start:.0f} s so far)",
            flush=True,
        )
        # written after every run: a time limit that cuts the next run keeps these
        report = write_report(args, header, setup, rows, probes, time.perf_counter() - start)
    if not rows:
        print("nothing fits: no run to compare")
        return 1
    print(markdown(report))
    return 0


def write_report(
    args: argparse.Namespace,
    header: dict[str, Any],
    setup: PlanSetup,
    rows: list[dict[str, Any]],
    probes: dict[Config, HostProbe],
    wall_seconds: float,
) -> dict[str, Any]:
    """``plan_validation_nd<N>.json`` and ``.md`` of the runs so far."""
    host_steps = {
        r["config"]: r["host_optimizer_step_s"] for r in rows if "host_optimizer_step_s" in r
    }
    report = {
        **header,
        **evaluate(setup, [(r["config"], r["measured"]) for r in rows], probes, host_steps),
        "wall_seconds": wall_seconds,
    }
    for run, row in zip(report["runs"], rows, strict=True):
        for key in ("host_probe", "host_optimizer_step_s", "cpu_threads"):
            if key in row:
                run[key] = row[key]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"plan_validation_nd{header['nd']}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(report))
    return report


def _predicted(setup: PlanSetup, c: Config) -> float:
    return predict(setup, c)[1].total


def _first_choice(setup: PlanSetup, measured: list[tuple[Config, float]]) -> tuple[Config, float]:
    """The measured run the planner ranks first (shortest predicted step)."""
    return min(measured, key=lambda m: _predicted(setup, m[0]))


def _host_optimizer(setup: PlanSetup, cal: Calibration, label: str) -> PlanSetup:
    """``setup`` with the host optimizer bandwidth a calibration timed, as /v1/plan uses it."""
    if cal.host_optimizer_bandwidth is None:
        return setup
    return replace(
        setup,
        host_optimizer_bandwidth=cal.host_optimizer_bandwidth,
        host_optimizer_given_source=f"timed on {label}",
    )


def _with(setup: PlanSetup, cal: Calibration, label: str) -> PlanSetup:
    """``setup`` with the figure ``cal`` learned replaced, as /v1/plan uses a calibration."""
    setup = _host_optimizer(setup, cal, label)
    e = setup.efficiency
    if cal.learned is Learned.GPU:
        e = replace(e, value=cal.efficiency, source=f"calibrated on {label}")
    else:
        e = replace(
            e,
            host_seconds_per_kernel=cal.host_seconds_per_kernel,
            host_source=f"calibrated on {label}",
        )
    return replace(setup, efficiency=e)


def _with_both(setup: PlanSetup, cal: Calibration, label: str) -> PlanSetup:
    """``setup`` with both figures of a calibration that used the run's host probe."""
    setup = _host_optimizer(setup, cal, label)
    e = replace(
        setup.efficiency,
        value=cal.efficiency,
        source=f"calibrated on {label}"
        + ("" if cal.learned in (Learned.GPU, Learned.BOTH) else " (host-bound: stated)"),
        host_seconds_per_kernel=cal.host_seconds_per_kernel,
        host_source=f"host probe of {label}",
    )
    return replace(setup, efficiency=e)


def evaluate(
    setup: PlanSetup,
    measured: list[tuple[Config, float]],
    probes: dict[Config, HostProbe] | None = None,
    host_steps: dict[Config, float] | None = None,
) -> dict[str, Any]:
    """Predicted vs measured step times: with the stated defaults; calibrated on the planner's
    first choice (one run, as ``POST /v1/calibrations`` would: it sets the figure of the queue
    the model finds binding); and calibrated on two runs (the first choice sets the GEMM
    efficiency, the measured run the model finds most host-bound, with two or more micro-steps,
    the host cost per kernel). With ``probes`` (the runs' host probes): also calibrated on the
    first choice and its probe alone (both figures from one run), and each run's host cost as
    its own probe gives it. With ``host_steps`` (offloaded runs' timed host optimizer steps):
    each calibration on such a run also sets the host optimizer bandwidth."""
    timed = host_steps or {}
    first = _first_choice(setup, measured)
    cal_one = calibrate(setup, first[0], first[1], host_optimizer_seconds=timed.get(first[0]))
    one = _with(setup, cal_one, config_label(first[0]))

    # two runs: the first choice sets the GEMM efficiency, the run the model finds most
    # host-bound (host dispatch over GPU work, two or more micro-steps) the host cost per kernel
    def host_ratio(m: tuple[Config, float]) -> float:
        micro = predict(one, m[0])[1].micro
        return 0.0 if micro is None else micro.host / micro.gpu

    others = [m for m in measured if m is not first and m[0].grad_accumulation_steps >= 2]
    second = max(others, key=host_ratio) if others else None
    two = one
    if second is not None:
        two = setup
        for _ in range(2):  # each figure solved with the other's latest value
            cal_gpu = calibrate(
                two,
                first[0],
                first[1],
                learn=Learned.GPU,
                host_optimizer_seconds=timed.get(first[0]),
            )
            two = _with(two, cal_gpu, config_label(first[0]))
            cal_host = calibrate(
                two,
                second[0],
                second[1],
                learn=Learned.HOST,
                host_optimizer_seconds=timed.get(second[0]),
            )
            two = _with(two, cal_host, config_label(second[0]))
    probes = probes or {}
    first_probe = probes.get(first[0])
    cal_probe = None
    setups = [("default", setup), ("calibrated", one), ("calibrated_two", two)]
    probe_error = None
    if first_probe is not None:
        try:
            cal_probe = calibrate(
                setup,
                first[0],
                first[1],
                probe=first_probe,
                host_optimizer_seconds=timed.get(first[0]),
            )
        except InputError as err:
            probe_error = f"{err.field}: {err.message}"
        else:
            label = config_label(first[0])
            setups.append(("calibrated_probe", _with_both(setup, cal_probe, label)))
    runs = []
    for c, seconds in measured:
        row: dict[str, Any] = {"config": config_label(c), "measured": seconds}
        step = predict(setup, c)[1]
        row["bound_default"] = "host" if step.host_bound else "gpu"
        for key, s in setups:
            row[f"predicted_{key}"] = _predicted(s, c)
            row[f"error_{key}"] = row[f"predicted_{key}"] / seconds - 1
        own = probes.get(c)
        if own is not None:  # this run's own probe: the host cost it alone implies
            row["probe_seconds"] = own.seconds
            try:
                found = calibrate(
                    setup,
                    c,
                    seconds,
                    probe=own,
                    learn=Learned.HOST,
                    host_optimizer_seconds=timed.get(c),
                )
            except InputError:  # its predicted GPU work fills the probe: no host figure
                row["probe_host_seconds_per_kernel"] = None
            else:
                row["probe_host_seconds_per_kernel"] = found.host_seconds_per_kernel
        if c in timed:
            row["host_optimizer_step_s"] = timed[c]
            row["predicted_host_optimizer_step_s"] = step.optimizer_step
        row["config_fields"] = {k: str(v) for k, v in asdict(c).items()}
        runs.append(row)
    used_one = {config_label(first[0])}
    used_two = used_one | ({config_label(second[0])} if second is not None else set())

    def median(key: str, used: set[str]) -> float | None:
        vals = [abs(r[f"error_{key}"]) for r in runs if r["config"] not in used]
        return statistics.median(vals) if vals else None

    fastest = min(measured, key=lambda m: m[1])
    result: dict[str, Any] = {
        "gemm_efficiency_default": setup.efficiency.value,
        "host_seconds_per_kernel_default": setup.efficiency.host_seconds_per_kernel,
        "calibrated_on": config_label(first[0]),
        "calibrated_learned": cal_one.learned.value,
        "gemm_efficiency_calibrated": one.efficiency.value,
        "host_seconds_per_kernel_calibrated": one.efficiency.host_seconds_per_kernel,
        "second_calibration_on": None if second is None else config_label(second[0]),
        "gemm_efficiency_two": two.efficiency.value,
        "host_seconds_per_kernel_two": two.efficiency.host_seconds_per_kernel,
        "median_abs_error_default": median("default", set()),
        "median_abs_error_calibrated": median("calibrated", used_one),
        "median_abs_error_calibrated_two": median("calibrated_two", used_two),
        "measured_fastest": config_label(fastest[0]),
        "runs": runs,
    }
    pairs = checkpoint_offload_pairs(setup, measured)
    if pairs:
        result["checkpoint_offload_pairs"] = pairs
    if probe_error is not None:
        result["probe_error"] = probe_error
    if cal_probe is not None:
        result.update(
            calibrated_probe_learned=cal_probe.learned.value,
            gemm_efficiency_probe=cal_probe.efficiency,
            host_seconds_per_kernel_probe=cal_probe.host_seconds_per_kernel,
            probe_notes=list(cal_probe.notes),
            median_abs_error_calibrated_probe=median("calibrated_probe", used_one),
        )
    for key, s in setups:
        choice = _first_choice(s, measured)
        result[f"first_choice_{key}"] = config_label(choice[0])
        result[f"first_choice_{key}_within_5_percent"] = choice[1] <= fastest[1] * (1 + WITHIN)
    return result


def checkpoint_offload_pairs(
    setup: PlanSetup, measured: list[tuple[Config, float]]
) -> list[dict[str, Any]]:
    """Each configuration measured with its layers' inputs on the device and on the host:
    the measured step-time difference against the copies the planner predicts
    (``checkpoint_transfer``, the same at any efficiency)."""
    found = dict(measured)
    out = []
    for c, seconds in measured:
        kept = found.get(replace(c, checkpoint_offload=False))
        if not c.checkpoint_offload or kept is None:
            continue
        predicted = predict(setup, c)[1].checkpoint_transfer
        out.append(
            {
                "config": config_label(replace(c, checkpoint_offload=False)),
                "measured_difference": seconds - kept,
                "predicted_copies": predicted,
                "error": predicted / (seconds - kept) - 1,
            }
        )
    return out


def markdown(r: dict[str, Any]) -> str:
    us = 1e6
    lines = [
        f"### Plan vs measured: {r['model']:,} parameters, Nd = {r['nd']} × {r['device_name']} "
        f"({r['engine']}, {r['per_gpu_batch']} × {r['seq_len']} tokens per GPU)",
        "",
        f"Stated defaults: GEMM efficiency {r['gemm_efficiency_default']:.3f}, host "
        f"{r['host_seconds_per_kernel_default'] * us:.1f} µs per kernel. Calibrated on "
        f"{r['calibrated_on']} ({r['calibrated_learned']}-bound): GEMM efficiency "
        f"{r['gemm_efficiency_calibrated']:.3f}, host "
        f"{r['host_seconds_per_kernel_calibrated'] * us:.1f} µs"
        + (
            f"; and on {r['second_calibration_on']} as well: GEMM efficiency "
            f"{r['gemm_efficiency_two']:.3f}, host {r['host_seconds_per_kernel_two'] * us:.1f} µs."
            if r["second_calibration_on"]
            else "."
        ),
        "",
        "| configuration | bound | measured (s) | default (s) | error | calibrated, 1 run (s) "
        "| error | calibrated, 2 runs (s) | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in r["runs"]:
        lines.append(
            f"| {run['config']} | {run['bound_default']} | {run['measured']:.4f} | "
            f"{run['predicted_default']:.4f} | {run['error_default']:+.1%} | "
            f"{run['predicted_calibrated']:.4f} | {run['error_calibrated']:+.1%} | "
            f"{run['predicted_calibrated_two']:.4f} | {run['error_calibrated_two']:+.1%} |"
        )

    timed = [run for run in r["runs"] if "host_optimizer_step_s" in run]
    if timed:
        lines += [
            "",
            "Host optimizer steps the offloaded runs timed (predicted at the stated "
            "bandwidth): "
            + "; ".join(
                f"{run['config']} {run['host_optimizer_step_s']:.3f} s "
                f"({run['predicted_host_optimizer_step_s']:.3f} s)"
                for run in timed
            )
            + ".",
        ]

    pairs = r.get("checkpoint_offload_pairs") or []
    if pairs:
        lines += [
            "",
            "Checkpoint offload: each configuration's step with the layers' inputs in host "
            "memory less the same step with them on the device, against the copies predicted "
            "(checkpoint_transfer):",
            "",
            "| configuration | measured difference (s) | predicted copies (s) | error |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {p['config']} | {p['measured_difference']:.4f} | {p['predicted_copies']:.4f} "
            f"| {p['error']:+.1%} |"
            for p in pairs
        ]

    def pct(x: float | None) -> str:
        return "n/a (no other run)" if x is None else f"{x:.1%}"

    def yes(key: str) -> str:
        return "yes" if r[f"first_choice_{key}_within_5_percent"] else "no"

    if "probe_error" in r:
        lines += ["", f"Not calibrated with the first choice's host probe: {r['probe_error']}."]
    if "gemm_efficiency_probe" in r:
        lines += [
            "",
            f"Calibrated on {r['calibrated_on']} alone with its host probe "
            f"({r['calibrated_probe_learned']}): GEMM efficiency "
            f"{r['gemm_efficiency_probe']:.3f}, host {r['host_seconds_per_kernel_probe'] * us:.1f} "
            f"µs per kernel" + "".join(f"; {n}" for n in r["probe_notes"]) + ".",
            "",
            "| configuration | measured (s) | 1 run + probe (s) | error | probe (ms) | "
            "its host cost (µs per kernel) |",
            "|---|---|---|---|---|---|",
        ]
        for run in r["runs"]:
            probe = run.get("probe_seconds")
            lines.append(
                f"| {run['config']} | {run['measured']:.4f} | "
                f"{run['predicted_calibrated_probe']:.4f} | "
                f"{run['error_calibrated_probe']:+.1%} | "
                + ("n/a |" if probe is None else f"{probe * 1e3:.1f} |")
                + (
                    " n/a |"
                    if run.get("probe_host_seconds_per_kernel") is None
                    else f" {run['probe_host_seconds_per_kernel'] * us:.1f} |"
                )
            )
        lines += [
            "",
            f"Median |error| calibrated on one run with its probe: "
            f"{pct(r['median_abs_error_calibrated_probe'])}; its first choice "
            f"{r['first_choice_calibrated_probe']} (within 5 %: {yes('calibrated_probe')}).",
        ]
    lines += [
        "",
        f"Median |error|: {pct(r['median_abs_error_default'])} with the stated defaults, "
        f"{pct(r['median_abs_error_calibrated'])} calibrated on one run, "
        f"{pct(r['median_abs_error_calibrated_two'])} on two (runs not calibrated on).",
        f"Measured fastest: {r['measured_fastest']}. First choice: "
        f"{r['first_choice_default']} with the defaults (within 5 %: {yes('default')}), "
        f"{r['first_choice_calibrated']} calibrated on one run ({yes('calibrated')}), "
        f"{r['first_choice_calibrated_two']} on two ({yes('calibrated_two')}).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
