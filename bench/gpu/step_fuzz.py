# ruff: noqa: T201 (a script: its report goes to stdout)
"""Whole training steps of generated transformers configs on the GPU, against the prediction.

``bench/trace_fuzz.py`` holds what forward saves to transformers' code on the CPU; this runs
whole steps (``measure.runner.run``: the torch engines, a stage and simulated Nd drawn at
random) of its configs made four times wider and eight times longer, so activations outweigh
the cuBLAS workspaces, and writes one JSON line per run: the measured peak, the requested
peak (the allocator's ``requested_bytes``, free of its block rounding), after-forward and
resident bytes beside the predicted ones and the predicted peak's moment. ``--report`` prints
the errors against the requested peak, worst first; with ``--current`` it predicts every run
again with the calculators as they are now (the recorded prediction is the one of the code that
ran). ``--engine deepspeed`` runs each drawn config under DeepSpeed at stages 0–3 on one GPU
instead (eight times the micro-batch, the Trainer's "auto" buckets, overlap_comm drawn).
Every row records whether the run left its request as sent. Measuring needs a CUDA device,
torch and transformers (and DeepSpeed for its engine); reporting needs none of the GPU side.

    NCCL_NVLS_ENABLE=0 python3 bench/gpu/step_fuzz.py --seed 11 --budget-s 380 --out DIR
    NCCL_NVLS_ENABLE=0 python3 bench/gpu/step_fuzz.py --engine deepspeed --seed 21 --out DIR
    python3 bench/gpu/step_fuzz.py --report bench/results/step_fuzz/*.jsonl
    python3 bench/gpu/step_fuzz.py --report bench/results/step_fuzz/*.jsonl --current
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SCALE = 4  # widths
LONGER = 8  # sequence lengths and windows


def _body(
    hf: dict[str, Any], precision: str, stage: int, dp: int, batch: dict[str, Any]
) -> dict[str, Any]:
    """The ``/v1/measure`` body of one whole-step run: the torch engines, AdamW, simulated Nd on
    the CUDA device, two warm-up steps."""
    return {
        "model": {"hf_config": hf},
        "dp": dp,
        "stages": [stage],
        "precision": precision,
        "optimizer": "adamw",
        "engine": "torch",
        "mode": "simulated",
        "device": "cuda",
        "warmup_steps": 2,
        "steps": 1,
        "batch": batch,
    }


def _deepspeed_body(
    hf: dict[str, Any], batch: dict[str, Any], overlap_comm: bool
) -> dict[str, Any]:
    """The ``/v1/measure`` body of one DeepSpeed run on one GPU: stages 0–3, bf16 with fp32
    masters, AdamW, the buckets transformers' Trainer resolves from "auto" (sized by the hidden
    size, so a small model's activations are not hidden behind DeepSpeed's default 1 GB
    buckets), ``overlap_comm`` as drawn (off: stage 1 keeps every gradient until the boundary)."""
    auto = (
        "reduce_bucket_size",
        "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold",
    )
    return {
        **_body(hf, "mixed_bf16", 0, 1, batch),
        "stages": [0, 1, 2, 3],
        "engine": "deepspeed",
        "mode": "distributed",
        "engine_config": {
            "zero_optimization": {**dict.fromkeys(auto, "auto"), "overlap_comm": overlap_comm}
        },
    }


def body(rng: random.Random, engine: str = "torch") -> dict[str, Any]:
    """One ``/v1/measure`` body: a drawn config, widened and lengthened, at a drawn stage and
    simulated Nd (``engine`` torch), or at every stage on one GPU (deepspeed)."""
    from bench.trace_fuzz import random_case

    cfg, batch, regime = random_case(rng)
    cfg = dict(cfg)
    cfg["hidden_size"] *= SCALE
    cfg["intermediate_size"] *= SCALE
    if "head_dim" in cfg:
        cfg["head_dim"] *= 2
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if cfg.get(key):
            cfg[key] *= SCALE
    cfg["max_position_embeddings"] = 2048
    for key in ("original_max_position_embeddings", "sliding_window"):
        if cfg.get(key):
            cfg[key] *= LONGER
    stage = rng.choice([0, 1, 2, 3])
    dp = rng.choice([1, 8, 64]) if stage >= 2 else rng.choice([1, 8])
    precision = {"autocast": "mixed_bf16", "half": "bf16", "fp32": "fp32"}[regime.value]
    shape = {
        "micro_batch_size": batch.micro_batch_size,
        "seq_len": batch.seq_len * LONGER,
        "activation_checkpointing": batch.activation_checkpointing.value,
        "padded": batch.padded,
        "checkpoint_every_n_layers": batch.checkpoint_every_n_layers,
    }
    if engine == "deepspeed":
        # DeepSpeed checkpoints every layer or none (every_n_layers is refused); eight times
        # the micro-batch, so activations outweigh the cuBLAS workspaces at every stage
        shape["checkpoint_every_n_layers"] = 1
        shape["micro_batch_size"] *= 8
        return _deepspeed_body(cfg, shape, rng.random() < 0.5)
    return _body(cfg, precision, stage, dp, shape)


def real_bodies(path: Path) -> list[dict[str, Any]]:
    """``/v1/measure`` bodies from a JSON list of ``[config, precision, micro, seq, ckpt, stage,
    dp]``: a committed ``bench/hf_configs`` file each, run as :func:`body` runs a drawn one."""
    configs = Path(__file__).resolve().parents[1] / "hf_configs"
    return [
        _body(
            json.loads((configs / f"{config}.json").read_text()),
            precision,
            stage,
            dp,
            {
                "micro_batch_size": micro,
                "seq_len": seq,
                "activation_checkpointing": ckpt,
                "padded": False,
                "checkpoint_every_n_layers": 1,
            },
        )
        for config, precision, micro, seq, ckpt, stage, dp in json.loads(path.read_text())
    ]


def _moment(predicted: dict[str, Any]) -> str | None:
    """The predicted peak's moment, as the torch engines' notes and DeepSpeed's name it."""
    for n in predicted.get("notes", []):
        if n.startswith("peak at "):
            return str(n.split(";")[0])
        if n.startswith("peak moment: "):
            return "peak at " + n.removeprefix("peak moment: ")
    return None


def measure(
    seed: int,
    budget_s: float,
    out: Path,
    given: list[dict[str, Any]] | None = None,
    engine: str = "torch",
) -> None:
    import torch

    from calculators.errors import InputError
    from measure.runner import deepspeed_linear_patched, run

    rng = random.Random(seed)
    start = time.time()
    tag = "" if engine == "torch" else "ds_"
    name = f"step_fuzz_{tag}{seed}.jsonl" if given is None else "step_real.jsonl"
    queue = list(given or [])
    with (out / name).open("w") as f:
        while time.time() - start < budget_s and (given is None or queue):
            b = body(rng, engine) if given is None else queue.pop(0)
            sent = json.dumps(b)
            # a DeepSpeed stage-3 engine patches F.linear for the rest of the process
            patched = engine == "deepspeed" and deepspeed_linear_patched()
            try:
                result = run(b)
            except InputError:
                continue
            except Exception as e:  # transformers will not build the config
                f.write(json.dumps({"body": b, "error": repr(e)[:300]}) + "\n")
                continue
            for r in result["runs"]:
                m, p = r["measured"], r["predicted"]
                row = {
                    "body": b,
                    # the run left the request as it was sent
                    "request_unchanged": json.dumps(b) == sent,
                    "compute_capability_major": torch.cuda.get_device_capability()[0],
                    "stage": r["stage"],
                    "linear_patched": patched,
                    "moment": _moment(p),
                    **{k: m.get(k) for k in ("peak", "peak_requested", "after_forward")},
                    **{k: m.get(k) for k in ("resident",)},
                    **{f"pred_{k}": p.get(k) for k in ("peak", "after_forward", "resident")},
                }
                f.write(json.dumps(row) + "\n")
                f.flush()


def predict_again(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its predicted figures as the current calculators give them: the setup
    ``measure.runner`` builds for the run (the module's own parameter list, on the device the
    run had), without running anything."""
    import dataclasses

    import torch

    from calculators.conventions import Stage
    from calculators.memory import estimate
    from measure import runner, spec
    from measure.compare import predicted_memory
    from measure.workloads import build_workload

    # a DeepSpeed run is predicted where DeepSpeed is not installed, with F.linear as the run
    # had it
    with (
        mock.patch.object(spec, "deepspeed_available", return_value=True),
        mock.patch.object(
            runner, "deepspeed_linear_patched", return_value=row.get("linear_patched", False)
        ),
    ):
        ms = runner.parse_spec(row["body"])
        workload = build_workload(ms)
        stage = Stage(row["stage"])
        settings = dataclasses.replace(
            runner.run_settings(ms, workload, torch.device("cpu"), stage),
            device_type="cuda",
            compute_capability_major=row.get("compute_capability_major", 9),  # the H200 runs
        )
        setup = runner.training_setup(ms, workload, row["body"]["dp"], settings, stage)
    p = predicted_memory(estimate(setup, [stage]).stages[0])
    return {
        **row,
        "moment": _moment(p),
        **{f"pred_{k}": p.get(k) for k in ("peak", "after_forward", "resident")},
    }


def load(files: list[str], current: bool = False) -> list[dict[str, Any]]:
    """The runs of ``files`` (those transformers would not build left out), predicted again
    where ``current`` (those the calculators now refuse with a 422 left out too)."""
    from calculators.errors import InputError

    rows = []
    for name in files:
        for line in Path(name).read_text().splitlines():
            d = json.loads(line)
            if "error" in d:
                continue
            try:
                rows.append(predict_again(d) if current else d)
            except InputError:
                continue
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    """The report's last line: how many runs, the median |error| against the requested peak,
    how many read more than 1 % low, the range."""
    errs = [(d["pred_peak"] - d["peak_requested"]) / d["peak_requested"] * 100 for d in rows]
    low = sum(e < -1 for e in errs)
    return (
        f"{len(errs)} runs: median |error| {statistics.median(abs(e) for e in errs):.2f} %; "
        f"{low} below -1 %; {min(errs):+.2f} … {max(errs):+.2f} %"
    )


def allocated_summary(rows: list[dict[str, Any]]) -> str:
    """The same against the measured peak as ``memory_allocated`` counts it: the whole blocks the
    caching allocator hands out, which the prediction replays for FSDP2's shards and states
    only (a block over 1 MiB taken from the cache is handed out whole when at most 1 MiB
    larger than asked)."""
    errs = [(d["pred_peak"] - d["peak"]) / d["peak"] * 100 for d in rows]
    low = sum(e < -1 for e in errs)
    return (
        f"against the allocated peak: median |error| "
        f"{statistics.median(abs(e) for e in errs):.2f} %; {low} below -1 %; "
        f"{min(errs):+.2f} … {max(errs):+.2f} %"
    )


def _engine(body: dict[str, Any]) -> str:
    """``deepspeed`` and its overlap_comm for a DeepSpeed run; nothing for the torch engines."""
    if body.get("engine") != "deepspeed":
        return ""
    overlap = body["engine_config"]["zero_optimization"]["overlap_comm"]
    return f"deepspeed (overlap_comm {'on' if overlap else 'off'}) "


def report(rows: list[dict[str, Any]]) -> None:
    out = []
    for d in rows:
        req = d["peak_requested"]
        cfg, batch = d["body"]["model"]["hf_config"], d["body"]["batch"]
        every = batch["checkpoint_every_n_layers"]
        out.append(
            (
                (d["pred_peak"] - req) / req * 100,
                (d["pred_peak"] - req) / 2**20,
                # DeepSpeed's profile predicts no after-forward figure
                None
                if d["pred_after_forward"] is None
                else (d["pred_after_forward"] - d["after_forward"]) / d["after_forward"] * 100,
                f"{cfg['model_type']} {_engine(d['body'])}stage {d['stage']} Nd {d['body']['dp']} "
                f"{d['body']['precision']} {batch['micro_batch_size']} x {batch['seq_len']} "
                f"{batch['activation_checkpointing']}"
                f"{f'/{every}' if every > 1 else ''}"
                f"{' padded' if batch['padded'] else ''} "
                f"{cfg.get('attn_implementation', 'sdpa')}, {d['moment']}",
            )
        )
    out.sort(key=lambda r: (r[0], r[1]))
    print("| requested peak error | MiB | after forward | run, predicted moment |")
    print("|---|---|---|---|")
    for e, mib, af, what in out:
        shown = "–" if af is None else f"{af:+.2f} %"
        print(f"| {e:+.2f} % | {mib:+.2f} | {shown} | {what} |")
    print(f"\n{summary(rows)}")
    print(allocated_summary(rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--budget-s", type=float, default=380)
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--report", nargs="+", metavar="JSONL")
    p.add_argument("--current", action="store_true", help="predict again with the code as it is")
    p.add_argument("--real", type=Path, help="run these committed configs instead (real_bodies)")
    p.add_argument("--engine", choices=["torch", "deepspeed"], default="torch")
    a = p.parse_args(argv)
    if a.report:
        report(load(a.report, a.current))
    else:
        measure(a.seed, a.budget_s, a.out, real_bodies(a.real) if a.real else None, a.engine)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
