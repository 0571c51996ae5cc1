# ruff: noqa: T201 (a script: its report goes to stdout)
"""Calculation benchmark: CPU time of single /v1/memory and /v1/communication answers, in process.

Each case runs in a fresh Python process (cold: no tensor list, coordinator trace or allocator
replay cached), answered the way the route answers it; ``time.process_time`` around the call
(CPU of that process only, so other load on the machine barely moves it). ``cold`` is the first
answer, ``warm`` the median of the next ``--repeat`` (what a sweep or a repeated question
pays); with ``--processes N``, cold is the median of N fresh processes;
``--collector-running`` keeps the cyclic garbage collector running through the engine walks.
With ``--before REF`` the same cases also run on the calculators of a git commit, extracted with
``git archive`` into a temporary folder (no checkout is touched)::

    python3 bench/calc_bench.py
    python3 bench/calc_bench.py --before 88a9cc1 --repeat 5
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

MANY_EXPERTS = {  # the widest MoE the schema allows: 16 layers x 4,096 experts
    "layers": 16,
    "hidden": 64,
    "heads": 4,
    "vocab_size": 1000,
    "ffn_hidden": 64,
    "num_experts": 4096,
    "experts_per_token": 2,
    "gated_mlp": True,
    "bias": False,
    "norm": "rmsnorm",
    "position_embedding": "rope",
}
STAGES = [0, 1, 2, 3]


def _cases() -> dict[str, tuple[str, dict[str, Any]]]:
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for engine in ("deepspeed", "paper", "torch"):
        body: dict[str, Any] = {
            "model": {"architecture": MANY_EXPERTS},
            "dp": 8,
            "stages": STAGES,
            "engine": engine,
        }
        if engine != "paper":
            body["precision"] = "mixed_bf16"
        out[f"moe-16x4096 {engine} memory"] = ("memory", body)
        out[f"moe-16x4096 {engine} memory+batch"] = (
            "memory",
            {**body, "batch": {"micro_batch_size": 1, "seq_len": 128}},
        )
        out[f"moe-16x4096 {engine} communication"] = ("communication", body)
    # experts over stage3_param_persistence_threshold (hidden 512: 262,144 elements each; 2048:
    # 1,048,576), so the stage-3 coordinator releases and re-gathers them
    for hidden in (512, 2048):
        wide = {
            "model": {"architecture": {**MANY_EXPERTS, "hidden": hidden, "ffn_hidden": 512}},
            "dp": 8,
            "stages": STAGES,
            "engine": "deepspeed",
            "precision": "mixed_bf16",
        }
        out[f"moe-16x4096-h{hidden} deepspeed memory"] = ("memory", wide)
        out[f"moe-16x4096-h{hidden} deepspeed memory+batch"] = (
            "memory",
            {**wide, "batch": {"micro_batch_size": 1, "seq_len": 128}},
        )
        out[f"moe-16x4096-h{hidden} deepspeed communication"] = ("communication", wide)
    # many blocks of few experts, every tensor released (stage3_param_persistence_threshold 0):
    # the stage-3 coordinator walks blocks that each hold a run of experts
    for layers, experts, hidden, ffn, stages in (
        (4096, 16, 256, 256, [3]),
        (1000, 64, 128, 96, [1, 2, 3]),
    ):
        blocks = {
            **MANY_EXPERTS,
            "layers": layers,
            "num_experts": experts,
            "hidden": hidden,
            "ffn_hidden": ffn,
            "bias": True,
        }
        out[f"blocks-{layers}x{experts}-h{hidden} deepspeed memory"] = (
            "memory",
            {
                "model": {"architecture": blocks},
                "dp": 8,
                "stages": stages,
                "engine": "deepspeed",
                "precision": "mixed_bf16",
                "engine_config": {"zero_optimization": {"stage3_param_persistence_threshold": 0}},
            },
        )
    # a bare count: the dense decoder Ψ implies (1,720 blocks for 10^15), the first block
    # holding the leftover elements, with one-element gradient buckets
    out["params-1e15 deepspeed communication"] = (
        "communication",
        {
            "model": {"params": 10**15},
            "dp": 8,
            "stages": STAGES,
            "engine": "deepspeed",
            "precision": "mixed_bf16",
            "engine_config": {"zero_optimization": {"reduce_bucket_size": 1}},
        },
    )
    llama = {
        "model": {"preset": "llama3-8b"},
        "dp": 8,
        "stages": STAGES,
        "engine": "deepspeed",
        "precision": "mixed_bf16",
    }
    out["llama3-8b deepspeed memory mb 2x4096"] = (
        "memory",
        {**llama, "batch": {"micro_batch_size": 2, "seq_len": 4096}},
    )
    out["llama3-8b deepspeed communication"] = ("communication", llama)
    # a config.json traced under fake tensors (needs torch and transformers): DeepSpeed asks
    # the bf16 regime, DDP and FSDP2 under mixed precision autocast and bf16. "new batch": each
    # warm answer asks another sequence length, so none reuses a kept trace
    configs = ROOT / "bench" / "hf_configs"
    for (name, engine), endpoint in itertools.product(
        (("llama-3.1-8b", "deepspeed"), ("qwen3-30b-a3b", "torch")),
        ("memory", "memory_new_batch"),
    ):
        hf_config = json.loads((configs / f"{name}.json").read_text())
        label = " new batch" if endpoint == "memory_new_batch" else ""
        out[f"{name} {engine} memory traced 1x4096{label}"] = (
            endpoint,
            {
                "model": {"hf_config": hf_config},
                "dp": 8,
                "stages": STAGES,
                "engine": engine,
                "precision": "mixed_bf16",
                "batch": {"micro_batch_size": 1, "seq_len": 4096},
                "activation_model": "traced",
            },
        )
    # the deepest transformers models: 65,536 layers, every one a ZeroRedundancyOptimizer
    # parameter list of 851,970 tensors at stage 1, and transformers' every_n_layers walked
    # layer by layer
    deep = {"micro_batch_size": 1, "seq_len": 1024, "activation_checkpointing": "full"}
    for name, dp, every in (
        ("gemma-3-1b", 8, 1),
        ("gemma-3-1b", 2**20, 1),
        ("llama-1b", 8, 2),
    ):
        hf_config = json.loads((configs / f"{name}.json").read_text())
        label = f" every {every} layers" if every > 1 else ""
        out[f"{name} x65536 layers torch memory dp {dp}{label}"] = (
            "memory",
            {
                "model": {"hf_config": {**hf_config, "num_hidden_layers": 65_536}},
                "dp": dp,
                "stages": STAGES,
                "engine": "torch",
                "precision": "mixed_bf16",
                "batch": {**deep, "checkpoint_every_n_layers": every},
            },
        )
    return out


# Runs inside the measured tree: answer one body cold, then `repeat` times warm.
_PROBE = """
import gc, json, os, statistics, sys, time
if os.environ.get("CALC_BENCH_COLLECTOR_RUNNING"):
    gc.disable = lambda: None  # the walks' pause of the cyclic collector made a no-op
endpoint, body, repeat = json.loads(sys.argv[1])
if endpoint == "memory":
    from app.api.routes.memory import answer
    from app.schemas.memory import MemoryRequest
    call = lambda: answer(MemoryRequest(**body))
elif endpoint == "memory_new_batch":  # each answer one token longer: no kept trace reused
    from app.api.routes.memory import answer
    from app.schemas.memory import MemoryRequest
    asked = [0]
    def call():
        asked[0] += 1
        batch = {**body["batch"], "seq_len": body["batch"]["seq_len"] + asked[0] - 1}
        return answer(MemoryRequest(**{**body, "batch": batch}))
else:
    from app.api.routes.communication import communication
    from app.schemas.communication import CommunicationRequest
    call = lambda: communication(CommunicationRequest(**body))
times = []
for _ in range(1 + repeat):
    start = time.process_time()
    call()
    times.append(time.process_time() - start)
print(json.dumps({"cold": times[0], "warm": statistics.median(times[1:]) if repeat else None}))
"""


def measure(tree: Path, endpoint: str, body: dict[str, Any], repeat: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps([endpoint, body, repeat])],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def extract(ref: str, into: Path) -> Path:
    """The ``calculators``, ``app`` and ``measure`` packages of commit ``ref``, via ``git
    archive``."""
    archive = subprocess.run(
        ["git", "archive", ref, "calculators", "app", "measure"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a git commit to compare with (e.g. 88a9cc1)")
    parser.add_argument("--repeat", type=int, default=5, help="warm answers after the cold one")
    parser.add_argument(
        "--processes", type=int, default=1, help="fresh processes per case: cold is their median"
    )
    parser.add_argument(
        "--collector-running",
        action="store_true",
        help="keep the cyclic garbage collector running through the engine walks",
    )
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    cases = {k: v for k, v in _cases().items() if args.only in k}
    if args.collector_running:
        os.environ["CALC_BENCH_COLLECTOR_RUNNING"] = "1"
    trees = {"after": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        if args.before:
            trees = {"before": extract(args.before, Path(tmp)), **trees}
        results: dict[str, dict[str, Any]] = {}
        print(f"{os.cpu_count()} CPUs visible; CPU seconds per answer (process_time)")
        header = "".join(f"{name + ' cold':>14}{name + ' warm':>14}" for name in trees)
        print(f"{'case':<42}{header}")
        for name, (endpoint, body) in cases.items():
            row = results.setdefault(name, {})
            for tree_name, tree in trees.items():
                runs = [measure(tree, endpoint, body, args.repeat) for _ in range(args.processes)]
                row[tree_name] = {
                    "cold": statistics.median(r["cold"] for r in runs),
                    "warm": runs[0]["warm"],
                    "cold_runs": [r["cold"] for r in runs],
                }
            cells = "".join(
                f"{row[t]['cold']:>14.4f}"
                + (f"{row[t]['warm']:>14.4f}" if row[t]["warm"] is not None else f"{'-':>14}")
                for t in trees
            )
            print(f"{name:<42}{cells}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
