"""Device memory outside PyTorch's caching allocator, from measured runs.

For each run, rank 0's ``nvml_used − reserved`` read together after a step: what the GPU holds
beyond the allocator's segments (the CUDA context, loaded kernels, NCCL's buffers), grouped by
engine, Nd and GPU::

    python3 bench/context_reserve.py bench/results/real_models/h200x4_set2[1-4].json
    python3 bench/context_reserve.py bench/results/context/*.json   # bench/gpu/context_round.sh

Files: ``python -m measure`` results, or the packed lists of ``bench/gpu/real_models_round.sh``.
Only runs alone on their GPUs read true: a job sharing a GPU adds its neighbour's memory, and
before ``measure`` named the GPU by UUID a rank under ``CUDA_VISIBLE_DEVICES`` not starting at
0 read another GPU (the real-model sets 1-3 ran a second lane on GPUs 2,3).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GIB = 2**30


def results(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, ``/v1/measure`` result) of every run the file holds."""
    data = json.loads(path.read_text())
    if isinstance(data, list):
        for job in data:
            if job.get("result"):
                yield job["name"], job["result"]
    elif isinstance(data, dict) and "runs" in data:
        yield path.stem, data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    a = ap.parse_args(argv)
    groups: dict[tuple[str, int, str], list[tuple[float, str]]] = defaultdict(list)
    for path in a.files:
        for name, result in results(path):
            device = result.get("environment", {}).get("device_name", "?")
            for run in result.get("runs", []):
                m = run.get("measured", {})
                if m.get("nvml_used") and m.get("reserved"):
                    outside = (m["nvml_used"] - m["reserved"]) / GIB
                    key = (str(result.get("engine")), int(run["world_size"]), device)
                    groups[key].append((outside, f"{name} stage {run['stage']}"))
    print("| engine | Nd | GPU | runs | outside the allocator, GiB: lowest / median / highest |")
    print("|---|---:|---|---:|---|")
    for (engine, nd, device), rows in sorted(groups.items()):
        xs = [x for x, _ in rows]
        print(
            f"| {engine} | {nd} | {device} | {len(xs)} | "
            f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
