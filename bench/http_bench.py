# ruff: noqa: T201 (a script: its report goes to stdout)
"""HTTP benchmark: wrk against POST /v1/memory and GET /healthz on one uvicorn server.

One uvicorn worker on 127.0.0.1 (a free port), 32 connections, one wrk thread (the other core of
a 2-core machine), rounds that alternate healthz and memory so both see the same machine state.
Reports each endpoint's rate and p99 over all rounds, and the ratio memory / healthz.

    apt-get install -y wrk
    python3 bench/http_bench.py                      # 3 rounds x 10 s per endpoint
    python3 bench/http_bench.py --rounds 1 --duration 3 --json out.json

Targets: memory >= 0.9 x the healthz rate, memory p99 < 25 ms. Loopback only; every
run is bounded by --rounds x --duration and stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
# The ZeRO paper's Figure 1 question (7.5B, Nd = 64, all four stages): the service's front page.
MEMORY_BODY = {"model": {"params": 7_500_000_000}, "dp": 64}
TARGET_RATIO = 0.9
TARGET_P99_MS = 25.0

LUA_POST = """wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server not ready at {url} after {timeout_s} s")


def to_ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def parse_wrk(text: str) -> dict[str, Any]:
    """Rate, latency percentiles and error counts from ``wrk --latency`` output."""
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", text).group(1))  # type: ignore[union-attr]
    percentiles = {
        p: to_ms(v) for p, v in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)$", text, re.MULTILINE)
    }
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    socket_errors = re.search(r"Socket errors:.*", text)
    return {
        "rate": rate,
        "requests": requests,
        "p50_ms": percentiles["50"],
        "p99_ms": percentiles["99"],
        "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
        "socket_errors": socket_errors.group(0) if socket_errors else None,
    }


def wrk(
    url: str, duration_s: int, connections: int, threads: int, script: str | None
) -> dict[str, Any]:
    cmd = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{duration_s}s",
        "--latency",
        "--timeout",
        "5s",
    ]
    if script:
        cmd += ["-s", script]
    out = subprocess.run(
        [*cmd, url], capture_output=True, text=True, check=True, timeout=duration_s + 30
    )
    return parse_wrk(out.stdout)


def installed() -> dict[str, str | None]:
    """Versions of what uvicorn's ``auto`` picks from (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in ("uvicorn", "h11", "httptools", "uvloop", "fastapi", "starlette", "pydantic"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Rate over all rounds (requests / time); p99 the worst round's (a conservative bound)."""
    return {
        "rate": sum(r["rate"] for r in rounds) / len(rounds),
        "p50_ms": max(r["p50_ms"] for r in rounds),
        "p99_ms": max(r["p99_ms"] for r in rounds),
        "requests": sum(r["requests"] for r in rounds),
        "non_2xx": sum(r["non_2xx"] for r in rounds),
        "rounds": rounds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run (<= 60)")
    parser.add_argument("--rounds", type=int, default=3, help="healthz+memory pairs (<= 10)")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of warm-up per endpoint")
    parser.add_argument(
        "--http",
        default="auto",
        choices=["auto", "h11", "httptools"],
        help="uvicorn's HTTP parser (auto: httptools when installed)",
    )
    parser.add_argument(
        "--loop",
        default="auto",
        choices=["auto", "asyncio", "uvloop"],
        help="uvicorn's event loop (auto: uvloop when installed)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install -y wrk")
    duration = min(max(args.duration, 1), 60)
    rounds = min(max(args.rounds, 1), 10)

    port = free_port()
    base = f"http://{HOST}:{port}"
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
            "--http",
            args.http,
            "--loop",
            args.loop,
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        wait_ready(f"{base}/healthz")
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
            lua.write(LUA_POST.format(body=json.dumps(json.dumps(MEMORY_BODY))))
        check = urllib.request.Request(
            f"{base}/v1/memory",
            data=json.dumps(MEMORY_BODY).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(check, timeout=5) as response:
            assert response.status == 200, response.status
        targets = {"healthz": (f"{base}/healthz", None), "memory": (f"{base}/v1/memory", lua.name)}
        for url, script in targets.values():
            wrk(url, args.warmup, args.connections, args.threads, script)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
        for _ in range(rounds):
            for name, (url, script) in targets.items():
                runs[name].append(wrk(url, duration, args.connections, args.threads, script))
    finally:
        server.terminate()
        server.wait(timeout=10)

    result = {name: combine(r) for name, r in runs.items()}
    ratio = result["memory"]["rate"] / result["healthz"]["rate"]
    summary = {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "command": " ".join(sys.argv),
        "server": {"http": args.http, "loop": args.loop, **installed()},
        "connections": args.connections,
        "wrk_threads": args.threads,
        "duration_s": duration,
        "rounds": rounds,
        "memory_body": MEMORY_BODY,
        "healthz": result["healthz"],
        "memory": result["memory"],
        "ratio": ratio,
        "ratio_ok": ratio >= TARGET_RATIO,
        "p99_ok": result["memory"]["p99_ms"] < TARGET_P99_MS,
    }
    for name in targets:
        r = result[name]
        print(
            f"{name:8s} {r['rate']:9.1f} req/s  p50 {r['p50_ms']:6.2f} ms  "
            f"p99 {r['p99_ms']:6.2f} ms  ({r['requests']} requests, {r['non_2xx']} non-2xx)"
        )
    print(f"server: --http {args.http} --loop {args.loop}; installed {installed()}")
    print(
        f"ratio memory/healthz = {ratio:.3f} (target >= {TARGET_RATIO}); "
        f"memory p99 = {result['memory']['p99_ms']:.2f} ms (target < {TARGET_P99_MS} ms)"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    failed = result["memory"]["non_2xx"] or result["healthz"]["non_2xx"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
