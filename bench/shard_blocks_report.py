# ruff: noqa: T201 (a script: its report goes to stdout)
"""FSDP2's shards and optimizer states as the caching allocator hands them out, from
``bench/gpu/shard_blocks_round.sh``'s results, each run predicted again with the current
calculators: what was allocated right after ``fully_shard`` beyond the shards' requests and what
the first step's states were handed beyond theirs, measured and replayed
(``calculators.engines.torch.allocator``), and the resident and peak errors with and without
the replayed blocks::

    python3 bench/shard_blocks_report.py bench/results/shard_blocks/h200x4_fresh.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from bench.accuracy import spec_setup
from calculators.conventions import Stage
from calculators.engines.torch.allocator import SHARD_BLOCKS, STATE_BLOCKS
from calculators.memory import estimate
from measure.compare import predicted_memory

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


def _pct(predicted: float, measured: float) -> str:
    return f"{100 * (predicted / measured - 1):+.2f} %"


def row(name: str, result: dict[str, Any], run: dict[str, Any]) -> str:
    config = json.loads((ROOT / "bench" / "hf_configs" / f"{name.split('_')[0]}.json").read_text())
    shape = re.search(r"b(\d+) s(\d+)", result["workload"])
    assert shape is not None
    spec = {
        "model": {"hf_config": config},
        "precision": result["precision"],
        "optimizer": result["optimizer"],
        "engine": "torch",
        "batch": {"micro_batch_size": int(shape[1]), "seq_len": int(shape[2])},
    }
    setup, _ = spec_setup(spec, run["world_size"], None)
    p = predicted_memory(estimate(setup, [Stage(run["stage"])]).stages[0])
    m = run["measured"]
    shards = p["components"][SHARD_BLOCKS]
    states = p["components"][STATE_BLOCKS]
    requested = p["components"]["sharded_params"]
    at_init = m["after_init"] - m["baseline"] - requested
    states_measured = m["model_state_resident"] - m["model_state_requested"] - at_init
    blocks = shards + states
    return (
        f"| {name} | {at_init / MIB:.3f} / {shards / MIB:.3f} "
        f"| {states_measured / MIB:.2f} / {states / MIB:.2f} "
        f"| {_pct(p['resident'], m['resident'])} | {_pct(p['resident'] - blocks, m['resident'])} "
        f"| {_pct(p['peak'], m['peak'])} | {_pct(p['peak'] - blocks, m['peak'])} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    args = parser.parse_args()
    print(
        "| run | shards' blocks beyond the requests, measured / replayed (MiB) "
        "| states' blocks, measured / replayed (MiB) | resident | without the replay "
        "| peak | without the replay |"
    )
    print("|---|---|---|---|---|---|---|")
    for path in args.results:
        for entry in json.loads(path.read_text()):
            for run in (entry["result"] or {}).get("runs", []):
                print(row(entry["name"], entry["result"], run))


if __name__ == "__main__":
    main()
