# ruff: noqa: T201 (a script: its report goes to stdout)
"""Per-request cost in process: the service's endpoints against a bare FastAPI app, no sockets.

Calls each ASGI app directly (lifespan started, one request at a time, the same scope a server
would build) and reports, per target, the fastest of --rounds batches of --requests requests:
the cost of one request on an uncontended core. On a shared machine the fastest batch is the
one the neighbours disturbed least, so these ratios hold still where wrk's (bench/http_bench.py)
move with the load. They leave out the HTTP parser, the same for every endpoint, so a ratio
here is lower than the one wrk measures on a quiet machine.

    python3 bench/asgi_bench.py                     # 15 rounds
    python3 bench/asgi_bench.py --json out.json
    python3 bench/asgi_bench.py --layers            # + the paper question from each layer down
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ZEROCALC_DATA_DIR", tempfile.mkdtemp(prefix="zerocalc-bench-"))

from bench.floor_app import app as floor  # noqa: E402
from bench.http_bench import TARGETS, machine  # noqa: E402

# requests per batch: light answers take ~0.1-1 ms, the heavy ones 3-30 ms
BATCH = {"sweep_heavy": 5, "memory_heavy": 20, "communication_heavy": 20, "sweep_paper": 20}


def request(app: Any, path: str, body: dict[str, Any] | None) -> Callable[[], Awaitable[None]]:
    """One call of ``app`` as uvicorn would make it; fails unless the answer is 200."""
    data = json.dumps(body).encode() if body is not None else b""
    headers = [(b"host", b"127.0.0.1")]
    if body is not None:
        headers += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]

    async def call() -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST" if body is not None else "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 50000),
            "state": {},
        }
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": data, "more_body": False}
            await asyncio.Event().wait()  # no disconnect while the answer is written
            raise AssertionError

        status = 0

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await app(scope, receive, send)
        assert status == 200, (path, status)

    return call


async def start(app: Any) -> None:
    """Run ``app``'s lifespan startup (its job runner, its metrics) and leave it running."""
    started = asyncio.Event()
    messages: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    await messages.put({"type": "lifespan.startup"})

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    asyncio.get_running_loop().create_task(app(scope, messages.get, send))
    await asyncio.wait_for(started.wait(), 30)


def layers(app: Any) -> list[Any]:
    """The service's ASGI layers, outermost first, down to the direct answers (the layer that
    answers the calculators' POSTs and /healthz): each called directly times the request
    without the ones above it."""
    stack = [app, app.front]
    while type(stack[-1]).__name__ != "DirectAnswers":
        stack.append(stack[-1].app)
    return stack


async def measure(
    names: list[str], rounds: int, requests: int, by_layer: bool = False
) -> dict[str, float]:
    from app.main import app as service

    await start(service)
    apps = {"floor": floor, "service": service}
    calls = {name: request(apps[TARGETS[name][0]], *TARGETS[name][1:]) for name in names}
    if by_layer:  # the paper question from each layer down
        _, path, body = TARGETS["memory_paper"]
        for layer in layers(service)[1:]:
            calls[f"paper from {type(layer).__name__}"] = request(layer, path, body)
        names = list(calls)
    best = dict.fromkeys(names, float("inf"))
    for _ in range(rounds):  # interleaved, so every target sees the same spells of load
        for name in names:
            n = min(requests, BATCH.get(name, requests))
            call = calls[name]
            await call()
            t0 = time.perf_counter()
            for _ in range(n):
                await call()
            best[name] = min(best[name], (time.perf_counter() - t0) / n)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="batches per target (<= 100)")
    parser.add_argument("--requests", type=int, default=100, help="requests per batch (<= 1000)")
    parser.add_argument(
        "--layers", action="store_true", help="also the paper question from each ASGI layer down"
    )
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    best = asyncio.run(
        measure(list(TARGETS), min(args.rounds, 100), min(args.requests, 1000), args.layers)
    )
    names = list(best)
    load = os.getloadavg()
    print(f"machine: {machine()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'target':38s} {'µs/request':>11s} {'floor/target':>13s}")
    for name in names:
        print(f"{name:38s} {best[name] * 1e6:11.0f} {best['floor'] / best[name]:13.3f}")
    if args.json:
        summary = {
            "machine": machine(),
            "load_average": load,
            "command": " ".join(sys.argv),
            "seconds_per_request": best,
            "ratio_to_floor": {name: best["floor"] / best[name] for name in names},
        }
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
