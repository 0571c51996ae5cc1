# ruff: noqa: T201 (a script: its report goes to stdout)
"""The first ``activation_model: traced`` answer of a fresh service, with and without the
``preload_trace`` setting (``ZEROCALC_PRELOAD_TRACE``), in one sitting.

Each run is a new process: it starts the service in process (``TestClient``, so the lifespan
runs, and with ``preload_trace`` the imports and a small trace happen there), then asks one
traced question (Llama 3.1 8B, DeepSpeed stages 0–3, 1 × 4,096 tokens) and one more with a new
batch. CPU seconds of the process (``time.process_time``) for the start and for each answer::

    python3 bench/trace_cold.py --repeat 3 --json bench/results/speed/trace_cold.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
t0 = time.process_time()
from fastapi.testclient import TestClient
from app.main import app
cfg = json.load(open("bench/hf_configs/llama-3.1-8b.json"))
def ask(c, seq):
    t = time.process_time()
    r = c.post("/v1/memory", json={"model": {"hf_config": cfg}, "dp": 8, "engine": "deepspeed",
        "batch": {"micro_batch_size": 1, "seq_len": seq}, "activation_model": "traced"})
    assert r.status_code == 200, r.text
    return time.process_time() - t
imported = time.process_time() - t0
t = time.process_time()
with TestClient(app) as c:
    started = time.process_time() - t
    first = ask(c, 4096)
    new_batch = ask(c, 4097)
print(json.dumps({"import": imported, "start": started, "first": first, "new_batch": new_batch}))
"""


def run(preload: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ZEROCALC_PRELOAD_TRACE": str(preload).lower()}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write every run here")
    a = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for _ in range(a.repeat):  # interleaved, so load drifts touch both
        for mode in runs:
            runs[mode].append(run(mode == "on"))
    print(f"{os.cpu_count()} cores; CPU seconds, median of {a.repeat} fresh processes")
    print("| preload_trace | start | first traced answer | next, a new batch |")
    print("|---|---:|---:|---:|")
    medians = {}
    for mode, rs in runs.items():
        m = {k: statistics.median(r[k] for r in rs) for k in ("start", "first", "new_batch")}
        medians[mode] = m
        print(f"| {mode} | {m['start']:.2f} | {m['first']:.2f} | {m['new_batch']:.2f} |")
    ratio = medians["on"]["first"] / medians["off"]["first"]
    print(f"first traced answer, on / off: {ratio:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "ratio_first": ratio}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
