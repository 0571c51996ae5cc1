# ruff: noqa: T201 (a script: its report goes to stdout)
"""Whole training steps of generated transformers configs on the GPU, against the prediction.

``bench/trace_fuzz.py`` holds what forward saves to transformers' code on the CPU; this runs
whole steps (``measure.runner.run``: the torch engines, a stage and simulated Nd drawn at
random) of its configs made four times wider and eight times longer, so activations outweigh
the cuBLAS workspaces, and writes one JSON line per run: the measured peak, the requested
peak (the allocator's ``requested_bytes``, free of its block rounding), after-forward and
resident bytes beside the predicted ones and the predicted peak's moment. ``--report`` prints
the errors against the requested peak, worst first. Needs a CUDA device, torch and
transformers.

    NCCL_NVLS_ENABLE=0 python3 bench/gpu/step_fuzz.py --seed 11 --budget-s 380 --out DIR
    python3 bench/gpu/step_fuzz.py --report bench/results/step_fuzz/*.jsonl
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
    return {
        "model": {"hf_config": cfg},
        "dp": rng.choice([1, 8, 64]) if stage >= 2 else rng.choice([1, 8]),
        "stages": [stage],
        "precision": {"autocast": "mixed_bf16", "half": "bf16", "fp32": "fp32"}[regime.value],
        "optimizer": "adamw",
        "engine": "torch",
        "mode": "simulated",
        "device": "cuda",
        "warmup_steps": 2,
        "steps": 1,
        "batch": {
            "micro_batch_size": batch.micro_batch_size,
            "seq_len": batch.seq_len * LONGER,
            "activation_checkpointing": batch.activation_checkpointing.value,
            "padded": batch.padded,
            "checkpoint_every_n_layers": batch.checkpoint_every_n_layers,
        },
    }


def measure(seed: int, budget_s: float, out: Path) -> None:
    from calculators.errors import InputError
    from measure.runner import run

    rng = random.Random(seed)
    start = time.time()
    with (out / f"step_fuzz_{seed}.jsonl").open("w") as f:
        while time.time() - start < budget_s:
            b = body(rng)
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
                    "stage": r["stage"],
                    "moment": notes[0].split(";")[0] if notes else None,
                    **{k: m.get(k) for k in ("peak", "peak_requested", "after_forward")},
                    **{k: m.get(k) for k in ("resident",)},
                    **{f"pred_{k}": p.get(k) for k in ("peak", "after_forward", "resident")},
                }
                f.write(json.dumps(row) + "\n")
                f.flush()


def report(files: list[str]) -> None:
    rows = []
    for name in files:
        for line in Path(name).read_text().splitlines():
            d = json.loads(line)
            if "error" not in d:
                rows.append(d)
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
    errs = [abs(o[0]) for o in out]
    low = sum(o[0] < -1 for o in out)
    print(f"\n{len(out)} runs: median |error| {statistics.median(errs):.2f} %; {low} below -1 %")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--budget-s", type=float, default=380)
    p.add_argument("--out", type=Path, default=Path("."))
    p.add_argument("--report", nargs="+", metavar="JSONL")
    a = p.parse_args(argv)
    if a.report:
        report(a.report)
    else:
        measure(a.seed, a.budget_s, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
