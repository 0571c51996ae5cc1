# ruff: noqa: T201 (a script: its report goes to stdout)
"""Plan benchmark: CPU time of one /v1/plan question with the default search space, in process.

Runs ``calculators.plan.plan`` (what ``POST /v1/plan`` computes, without HTTP and JSON) for the
bundled models on 8 × H100 with a global batch of 256 × 4,096 tokens, each engine, and keeps the
fastest of ``--repeat`` runs: the cost of a plan on an uncontended core. Prints the number of
configurations evaluated and the seconds per plan.

    python3 bench/plan_bench.py
    python3 bench/plan_bench.py --repeat 5 --json out.json
    python3 bench/plan_bench.py --every-n-layers 1,2,4   # a wider search (the torch engine)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.architecture import count_params  # noqa: E402
from calculators.conventions import Engine  # noqa: E402
from calculators.errors import InputError  # noqa: E402
from calculators.gpus import get_gpu  # noqa: E402
from calculators.plan import PlanSetup, Search, plan  # noqa: E402
from calculators.presets import get_preset  # noqa: E402
from calculators.topology import Network  # noqa: E402

MODELS = ("llama3-8b", "llama2-70b", "mixtral-8x7b")


def setup(model: str, engine: Engine, every_n_layers: tuple[int, ...] = (1,)) -> PlanSetup:
    arch = get_preset(model).architecture
    assert arch is not None
    return PlanSetup(
        architecture=arch,
        params=count_params(arch),
        gpu=get_gpu("h100-sxm"),
        gpus=8,
        gpus_per_node=8,
        network=Network(),
        global_batch_size=256,
        seq_len=4096,
        engine=engine,
        search=Search(checkpoint_every_n_layers=every_n_layers),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs per question; the fastest kept")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument(
        "--every-n-layers",
        default="1",
        help="full checkpointing's layer intervals to search: 1,2,4 (the torch engine only)",
    )
    args = ap.parse_args(argv)
    every = tuple(int(x) for x in args.every_n_layers.split(","))
    rows = []
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"{'model':16s} {'engine':10s} {'configurations':>14s} {'fit':>5s} {'seconds':>8s}")
    for model in MODELS:
        for engine in (Engine.TORCH, Engine.DEEPSPEED):
            if every != (1,) and engine is not Engine.TORCH:
                continue
            question = setup(model, engine, every)
            best, answer = float("inf"), None
            try:
                for _ in range(args.repeat):
                    start = time.process_time()
                    answer = plan(question)
                    best = min(best, time.process_time() - start)
            except InputError as err:  # a search over the bounded work: refused before any
                print(f"{model:16s} {engine.value:10s} refused: {err.field}: {err.message}")
                continue
            assert answer is not None
            rows.append(
                {
                    "model": model,
                    "engine": engine.value,
                    "evaluated": answer.evaluated,
                    "fit": len(answer.candidates),
                    "cpu_seconds": best,
                }
            )
            print(
                f"{model:16s} {engine.value:10s} {answer.evaluated:14d} "
                f"{len(answer.candidates):5d} {best:8.3f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"repeat": args.repeat, "runs": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
