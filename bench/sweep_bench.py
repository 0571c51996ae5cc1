# ruff: noqa: T201 (a script: its report goes to stdout)
"""Sweep benchmark: server time of POST /v1/memory/sweep, 4 stages x Nd = 1, 2, 4, ..., 4096.

Starts one uvicorn worker on 127.0.0.1, sends each body --requests times one after another on
one keep-alive connection, and reads the server's own time from the ``Server-Timing: app;dur=``
header (request arrival to the start of the answer: body read, validation, 52 estimates,
serialization). Reports median, p99 and max per body; the target is < 20 ms.

    python3 bench/sweep_bench.py
    python3 bench/sweep_bench.py --requests 50 --json out.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
TARGET_MS = 20.0
STAGES = [0, 1, 2, 3]
ND = [2**i for i in range(13)]  # 1 ... 4096

BODIES: dict[str, dict[str, Any]] = {
    # The ZeRO paper's model-state accounting: the service's default question.
    "paper_7.5B": {"model": {"params": 7_500_000_000}, "dp": 64},
    # What the page sends with an architecture and a batch: activations and peak, per engine.
    "gpt_1.3B_batch_torch": {
        "model": {
            "architecture": {
                "layers": 24,
                "hidden": 2048,
                "heads": 16,
                "vocab_size": 50257,
                "max_seq_len": 2048,
            }
        },
        "dp": 8,
        "precision": "mixed_bf16",
        "engine": "torch",
        "batch": {"micro_batch_size": 4, "seq_len": 2048},
        "device_memory": 80_000_000_000,
    },
    "llama3_8b_batch_torch": {
        "model": {"preset": "llama3-8b"},
        "dp": 8,
        "precision": "mixed_bf16",
        "engine": "torch",
        "batch": {"micro_batch_size": 1, "seq_len": 4096},
        "device_memory": 80_000_000_000,
    },
    "llama3_8b_batch_deepspeed": {
        "model": {"preset": "llama3-8b"},
        "dp": 8,
        "precision": "mixed_bf16",
        "engine": "deepspeed",
        "batch": {"micro_batch_size": 1, "seq_len": 4096},
        "device_memory": 80_000_000_000,
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server not ready on port {port} after {timeout_s} s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(port: int, body: dict[str, Any], requests: int) -> dict[str, Any]:
    payload = json.dumps({**body, "stages": STAGES, "dp_values": ND}).encode()
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    server_ms, client_ms = [], []
    for i in range(requests + 3):  # 3 warm-up requests
        start = time.perf_counter()
        conn.request("POST", "/v1/memory/sweep", payload, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        elapsed = (time.perf_counter() - start) * 1000
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {data[:300]!r}")
        timing = re.search(r"app;dur=([\d.]+)", response.getheader("Server-Timing") or "")
        if timing is None:
            raise RuntimeError("no Server-Timing header")
        if i >= 3:
            server_ms.append(float(timing.group(1)))
            client_ms.append(elapsed)
    points = json.loads(data)["points"]
    assert [p["dp"] for p in points] == ND and all(len(p["stages"]) == 4 for p in points)
    return {
        "server_median_ms": statistics.median(server_ms),
        "server_p99_ms": percentile(server_ms, 0.99),
        "server_max_ms": max(server_ms),
        "client_median_ms": statistics.median(client_ms),
        "response_bytes": len(data),
        "requests": requests,
        "ok": percentile(server_ms, 0.99) < TARGET_MS,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="per body (<= 1000)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    requests = min(max(args.requests, 1), 1000)
    port = free_port()
    env = {**os.environ, "ZEROCALC_DATA_DIR": tempfile.mkdtemp(prefix="zerocalc-bench-")}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "app.main:app",
            "--host",
            HOST,
            "--port",
            str(port),
            "--workers",
            "1",
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        wait_ready(port)
        results = {name: measure(port, body, requests) for name, body in BODIES.items()}
    finally:
        server.terminate()
        server.wait(timeout=10)
    for name, r in results.items():
        print(
            f"{name:28s} server median {r['server_median_ms']:6.2f} ms  "
            f"p99 {r['server_p99_ms']:6.2f} ms  max {r['server_max_ms']:6.2f} ms  "
            f"(client median {r['client_median_ms']:.2f} ms, {r['response_bytes']} B)  "
            f"{'ok' if r['ok'] else 'over'} (< {TARGET_MS} ms)"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "command": " ".join(sys.argv),
                    "cpus": os.cpu_count(),
                    "python": sys.version.split()[0],
                    "stages": STAGES,
                    "dp_values": ND,
                    "bodies": BODIES,
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
