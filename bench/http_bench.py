# ruff: noqa: T201 (a script: its report goes to stdout)
"""HTTP benchmark: the service's endpoints against a bare FastAPI app, with wrk, in one run.

Two uvicorn servers on 127.0.0.1 (free ports, one worker each, the same --http/--loop): the
service (``app.main:app``) and the framework's floor (``bench/floor_app.py``: one async endpoint,
no middleware). Only one is loaded at a time. Each round runs, for every service target, wrk
(1 thread, 32 connections, --duration seconds) against the floor and right after it against
the target: each ratio is the target's rate over the floor's in that pair (the machine's load
moves between runs). A target's ratio, p50 and p99 are the medians over the rounds (goals are
checked on them); the worst round's ratio and p99 are printed beside. Each run also reads the
server's CPU time (``/proc``) and reports its CPU microseconds per answered request, and the
floor's over the target's (``cpu ratio``): on a machine other work shares, the rates swing with
that work, the CPU per request much less.

    apt-get install -y wrk
    python3 bench/http_bench.py                                  # 3 rounds x 5 s per target
    python3 bench/http_bench.py --rounds 1 --only memory_paper --json out.json

Targets: memory_paper >= 0.75 x the floor's rate with p99 < 15 ms; the deepspeed Llama 3 8B
question (memory, sweep, communication) p99 < 100 ms. Loopback only; every wrk run is bounded
by --duration and the whole run by --rounds x targets x --duration.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"

# The ZeRO paper's Figure 1 question (7.5B, Nd = 64, all four stages): the front page's question.
PAPER = {"model": {"params": 7_500_000_000}, "dp": 64}
# A heavy one: DeepSpeed's allocations for Llama 3 8B with activations, all four stages.
HEAVY = {
    "model": {"preset": "llama3-8b"},
    "dp": 64,
    "engine": "deepspeed",
    "batch": {"micro_batch_size": 2, "seq_len": 4096},
}
HEAVY_COMM = {"model": {"preset": "llama3-8b"}, "dp": 64, "engine": "deepspeed"}

# name -> (server, path, JSON body or None for GET)
TARGETS: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "floor": ("floor", "/", None),
    "healthz": ("service", "/healthz", None),
    "memory_paper": ("service", "/v1/memory", PAPER),
    "memory_heavy": ("service", "/v1/memory", HEAVY),
    "sweep_paper": ("service", "/v1/memory/sweep", PAPER),
    "sweep_heavy": ("service", "/v1/memory/sweep", HEAVY),
    "communication_heavy": ("service", "/v1/communication", HEAVY_COMM),
}
# name -> (least ratio to the floor, largest p99 in ms); None: measured, no target
GOALS: dict[str, tuple[float | None, float | None]] = {
    "memory_paper": (0.75, 15.0),
    "memory_heavy": (None, 100.0),
    "sweep_heavy": (None, 100.0),
    "communication_heavy": (None, 100.0),
}

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
    if "Latency Distribution" not in text:
        raise RuntimeError(f"wrk gave no latencies:\n{text}")
    percentiles = {
        p: to_ms(v) for p, v in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)\s*$", text, re.MULTILINE)
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


def wrk(url: str, duration_s: int, connections: int, script: str | None) -> dict[str, Any]:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", "--timeout", "5s"]
    if script:
        cmd += ["-s", script]
    out = subprocess.run(
        [*cmd, url], capture_output=True, text=True, check=True, timeout=duration_s + 30
    )
    return parse_wrk(out.stdout)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``; else None)."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.exists():
        return None
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_wrk(
    pid: int, url: str, duration_s: int, connections: int, script: str | None
) -> dict[str, Any]:
    """``wrk`` plus the server's CPU microseconds per answered request over the run: the cost
    of a request, which the machine's other load disturbs far less than the rate."""
    before = cpu_seconds(pid)
    result = wrk(url, duration_s, connections, script)
    after = cpu_seconds(pid)
    result["cpu_us_per_request"] = (
        None
        if before is None or after is None or not result["requests"]
        else (after - before) * 1e6 / result["requests"]
    )
    return result


def installed() -> dict[str, str | None]:
    """Versions of the server stack (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in ("uvicorn", "h11", "httptools", "uvloop", "fastapi", "starlette", "pydantic"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def machine() -> str:
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE)
        if names:
            model = names[0]
    return f"{model}, {os.cpu_count()} logical cores, Python {platform.python_version()}"


def start(module: str, port: int, args: argparse.Namespace, env: dict[str, str]) -> Any:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            module,
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


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run (<= 30)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all targets (<= 10)")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1, help="seconds of warm-up per target")
    parser.add_argument(
        "--only", nargs="+", choices=[t for t in TARGETS if t != "floor"], help="these targets"
    )
    parser.add_argument("--http", default="auto", choices=["auto", "h11", "httptools"])
    parser.add_argument("--loop", default="auto", choices=["auto", "asyncio", "uvloop"])
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install -y wrk")
    duration = min(max(args.duration, 1), 30)
    rounds = min(max(args.rounds, 1), 10)
    names = ["floor", *(args.only or [t for t in TARGETS if t != "floor"])]

    load_before = os.getloadavg()
    ports = {"service": free_port(), "floor": free_port()}
    env = {
        **os.environ,
        "ZEROCALC_DATA_DIR": tempfile.mkdtemp(prefix="zerocalc-bench-"),
        "PYTHONPATH": str(ROOT),
    }
    servers = [
        start("app.main:app", ports["service"], args, env),
        start("bench.floor_app:app", ports["floor"], args, env),
    ]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    floors: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    try:
        wait_ready(f"http://{HOST}:{ports['service']}/healthz")
        wait_ready(f"http://{HOST}:{ports['floor']}/")
        plan: dict[str, tuple[str, str | None]] = {}
        for name in names:
            server, path, body = TARGETS[name]
            url = f"http://{HOST}:{ports[server]}{path}"
            script = None
            if body is not None:
                data = json.dumps(body)
                check = urllib.request.Request(
                    url, data=data.encode(), headers={"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(check, timeout=10) as response:
                    assert response.status == 200, (name, response.status)
                with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
                    lua.write(LUA_POST.format(body=json.dumps(data)))
                script = lua.name
            plan[name] = (url, script)
            wrk(url, max(args.warmup, 1), args.connections, script)
        for _ in range(rounds):
            for name in names[1:]:  # each target right after a floor run of its own
                floor_pid, pid = servers[1].pid, servers[0].pid
                floors[name].append(
                    timed_wrk(floor_pid, plan["floor"][0], duration, args.connections, None)
                )
                runs[name].append(
                    timed_wrk(pid, plan[name][0], duration, args.connections, plan[name][1])
                )
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)

    runs["floor"] = [r for name in names[1:] for r in floors[name]]
    floors["floor"] = runs["floor"]
    result: dict[str, Any] = {}
    for name in names:
        rs = runs[name]
        ratios = [r["rate"] / f["rate"] for r, f in zip(rs, floors[name], strict=True)]
        cpu_ratios = [
            f["cpu_us_per_request"] / r["cpu_us_per_request"]
            for r, f in zip(rs, floors[name], strict=True)
            if r["cpu_us_per_request"] and f["cpu_us_per_request"]
        ]
        result[name] = {
            "rate": statistics.mean(r["rate"] for r in rs),
            "ratio": statistics.median(ratios),
            "p50_ms": statistics.median(r["p50_ms"] for r in rs),
            "p99_ms": statistics.median(r["p99_ms"] for r in rs),
            "p99_worst_ms": max(r["p99_ms"] for r in rs),
            "cpu_us_per_request": statistics.median(
                r["cpu_us_per_request"] or float("nan") for r in rs
            ),
            # the floor's CPU per request over the target's, per round (median): the rate ratio
            # a machine with a core to spare for the server would give
            "cpu_ratio": statistics.median(cpu_ratios) if cpu_ratios else None,
            "ratio_worst": min(ratios),
            "requests": sum(r["requests"] for r in rs),
            "non_2xx": sum(r["non_2xx"] for r in rs),
            "rounds": [{**r, "ratio": q} for r, q in zip(rs, ratios, strict=True)],
        }
    load = os.getloadavg()
    print(
        f"machine: {machine()}; load average {load_before[0]:.2f} before, "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} after"
    )
    print(f"server: --http {args.http} --loop {args.loop}; {installed()}")
    print(f"wrk -t1 -c{args.connections} -d{duration}s, {rounds} rounds")
    print(
        f"{'target':20s} {'req/s':>9s} {'ratio':>6s} {'worst':>6s} {'p50 ms':>7s} "
        f"{'p99 ms':>7s} {'worst':>7s} {'cpu µs':>7s} {'cpu ratio':>9s}  goal"
    )
    ok = True
    for name in names:
        r = result[name]
        least, most = GOALS.get(name, (None, None))
        met = (least is None or r["ratio"] >= least) and (most is None or r["p99_ms"] < most)
        goal = " ".join(
            [*([f"ratio>={least}"] if least else []), *([f"p99<{most:g}"] if most else [])]
        )
        ok &= met and not r["non_2xx"]
        cpu_ratio = "" if r["cpu_ratio"] is None else f"{r['cpu_ratio']:.3f}"
        print(
            f"{name:20s} {r['rate']:9.1f} {r['ratio']:6.3f} {r['ratio_worst']:6.3f} "
            f"{r['p50_ms']:7.2f} {r['p99_ms']:7.2f} {r['p99_worst_ms']:7.2f} "
            f"{r['cpu_us_per_request']:7.1f} {cpu_ratio:>9s}  {goal} "
            f"{'' if not goal else ('met' if met else 'MISSED')}"
            + (f" ({r['non_2xx']} non-2xx)" if r["non_2xx"] else "")
        )
    if args.json:
        summary = {
            "machine": machine(),
            "load_average_before": load_before,
            "load_average": load,
            "command": " ".join(sys.argv),
            "server": {"http": args.http, "loop": args.loop, **installed()},
            "connections": args.connections,
            "duration_s": duration,
            "rounds": rounds,
            "bodies": {name: TARGETS[name][2] for name in names},
            "results": result,
        }
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
