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
ran). Measuring needs a CUDA device, torch and transformers; reporting needs no GPU.

    NCCL_NVLS_ENABLE=0 python3 bench/gpu/step_fuzz.py --seed 11 --budget-s 380 --out DIR
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


def body(rng: random.Random) -> dict[str, Any]:
    """One ``/v1/measure`` body: a drawn config, widened and lengthened, at a drawn stage and
    simulated Nd."""
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
    return _body(
        cfg,
        precision,
        stage,
        dp,
        {
            "micro_batch_size": batch.micro_batch_size,
            "seq_len": batch.seq_len * LONGER,
            "activation_checkpointing": batch.activation_checkpointing.value,
            "padded": batch.padded,
            "checkpoint_every_n_layers": batch.checkpoint_every_n_layers,
        },
    )


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


def measure(
    seed: int, budget_s: float, out: Path, given: list[dict[str, Any]] | None = None
) -> None:
    import torch

    from calculators.errors import InputError
    from measure.runner import run

    rng = random.Random(seed)
    start = time.time()
    name = f"step_fuzz_{seed}.jsonl" if given is None else "step_real.jsonl"
    queue = list(given or [])
    with (out / name).open("w") as f:
        while time.time() - start < budget_s and (given is None or queue):
            b = body(rng) if given is None else queue.pop(0)
            try:
                result = run(b)
            except InputError:
                continue
            except Exception as e:  # transformers will not build the config
                f.write(json.dumps({"body": b, "error": repr(e)[:300]}) + "\n")
                continue
            for r in result["runs"]:
                m, p = r["measured"], r["predicted"]
                notes = [n for n in p.get("notes", []) if n.startswith("peak at ")]
                row = {
                    "body": b,
                    "compute_capability_major": torch.cuda.get_device_capability()[0],
                    "stage": r["stage"],
                    "moment": notes[0].split(";")[0] if notes else None,
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
    from measure.compare import predicted_memory
    from measure.runner import parse_spec, run_settings, training_setup
    from measure.workloads import build_workload

    ms = parse_spec(row["body"])
    workload = build_workload(ms)
    stage = Stage(row["stage"])
    settings = dataclasses.replace(
        run_settings(ms, workload, torch.device("cpu"), stage),
        device_type="cuda",
        compute_capability_major=row.get("compute_capability_major", 9),  # the H200 runs
    )
    setup = training_setup(ms, workload, row["body"]["dp"], settings, stage)
    p = predicted_memory(estimate(setup, [stage]).stages[0])
    notes = [n for n in p.get("notes", []) if n.startswith("peak at ")]
    return {
        **row,
        "moment": notes[0].split(";")[0] if notes else None,
        **{f"pred_{k}": p.get(k) for k in ("peak", "after_forward", "resident")},
    }


def load(files: list[str], current: bool = False) -> list[dict[str, Any]]:
    """The runs of ``files`` (those transformers would not build left out), predicted again
    where ``current``."""
    rows = []
    for name in files:
        for line in Path(name).read_text().splitlines():
            d = json.loads(line)
            if "error" not in d:
                rows.append(predict_again(d) if current else d)
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
                (d["pred_after_forward"] - d["after_forward"]) / d["after_forward"] * 100,
                f"{cfg['model_type']} stage {d['stage']} Nd {d['body']['dp']} "
                f"{d['body']['precision']} {batch['micro_batch_size']} x {batch['seq_len']} "
                f"{batch['activation_checkpointing']}"
                f"{f'/{every}' if every > 1 else ''}"
                f"{' padded' if batch['padded'] else ''} "
                f"{cfg.get('attn_implementation', 'sdpa')}, {d['moment']}",
            )
        )
    out.sort()
    print("| requested peak error | MiB | after forward | run, predicted moment |")
    print("|---|---|---|---|")
    for e, mib, af, what in out:
        print(f"| {e:+.2f} % | {mib:+.2f} | {af:+.2f} % | {what} |")
    print(f"\n{summary(rows)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--budget-s", type=float, default=380)
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--report", nargs="+", metavar="JSONL")
    p.add_argument("--current", action="store_true", help="predict again with the code as it is")
    p.add_argument("--real", type=Path, help="run these committed configs instead (real_bodies)")
    a = p.parse_args(argv)
    if a.report:
        report(load(a.report, a.current))
    else:
        measure(a.seed, a.budget_s, a.out, real_bodies(a.real) if a.real else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
