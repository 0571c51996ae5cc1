# ruff: noqa: T201 (a script: its report goes to stdout)
"""Where one answer's time goes: each phase of POST /v1/memory, /v1/memory/sweep and
/v1/communication alone.

Per phase the fastest of ``--repeat`` batches, timed in CPU time of this process
(``time.process_time``), which a neighbour's load disturbs less than wall time; no server, no
framework (bench/asgi_bench.py measures whole requests).

    python3 bench/phase_bench.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.asgi_bench import machine  # noqa: E402
from bench.http_bench import HEAVY, HEAVY_COMM, PAPER  # noqa: E402


def best(f: Callable[[], Any], number: int, repeat: int) -> float:
    """Fastest CPU seconds per call over ``repeat`` batches of ``number`` calls."""
    timer = timeit.Timer(f, timer=time.process_time)
    return min(timer.repeat(number=number, repeat=repeat)) / number


def to_json(response: Any, schema: Any) -> bytes:
    """What leaves the route: a Response's bytes, or FastAPI's validate-and-dump of a model."""
    from pydantic import TypeAdapter
    from pydantic_core import to_json as encode
    from starlette.responses import Response

    if isinstance(response, Response):
        return bytes(response.body)
    if isinstance(response, dict):  # plain JSON values in the model's field order
        return encode(response)
    adapter = TypeAdapter(schema)
    return adapter.dump_json(adapter.validate_python(response))


def memory_phases(body: dict[str, Any], number: int, repeat: int) -> dict[str, float]:
    from app.api.convert import memory_setup
    from app.api.presenters import memory_response
    from app.schemas.memory import MemoryRequest, MemoryResponse
    from calculators.conventions import Stage
    from calculators.memory import estimate

    raw = json.dumps(body).encode()
    request = MemoryRequest.model_validate_json(raw)
    setup = memory_setup(request)
    stages = [Stage(s) for s in request.stages]
    result = estimate(setup, stages)
    response = memory_response(result, request.device_memory)
    return {
        "body -> MemoryRequest": best(
            lambda: MemoryRequest.model_validate_json(raw), number, repeat
        ),
        "memory_setup": best(lambda: memory_setup(request), number, repeat),
        "estimate": best(lambda: estimate(setup, stages), number, repeat),
        "memory_response": best(
            lambda: memory_response(result, request.device_memory), number, repeat
        ),
        "response -> JSON": best(lambda: to_json(response, MemoryResponse), number, repeat),
    }


def sweep_phases(body: dict[str, Any], number: int, repeat: int) -> dict[str, float]:
    """The default 13 Nd values × the request's stages: parsing, then the route's whole work
    (setup, every estimate, the encoded answer)."""
    from app.api.routes.sweep import sweep
    from app.schemas.sweep import MemorySweepRequest

    raw = json.dumps(body).encode()
    request = MemorySweepRequest.model_validate_json(raw)
    return {
        "body -> MemorySweepRequest": best(
            lambda: MemorySweepRequest.model_validate_json(raw), number, repeat
        ),
        "sweep (setup, estimates, JSON)": best(lambda: sweep(request), number, repeat),
    }


def communication_phases(body: dict[str, Any], number: int, repeat: int) -> dict[str, float]:
    from app.api import presenters
    from app.api.convert import communication_setup
    from app.schemas.communication import CommunicationRequest, CommunicationResponse
    from calculators.communication import estimate_communication
    from calculators.conventions import Stage

    raw = json.dumps(body).encode()
    request = CommunicationRequest.model_validate_json(raw)
    setup = communication_setup(request)
    stages = [Stage(s) for s in request.stages]
    result = estimate_communication(setup, stages)
    # the answer's plain JSON values where the tree has them, else its response models
    present: Callable[[Any], Any] = getattr(
        presenters, "communication_body", presenters.communication_response
    )
    response = present(result)
    return {
        "body -> CommunicationRequest": best(
            lambda: CommunicationRequest.model_validate_json(raw), number, repeat
        ),
        "communication_setup": best(lambda: communication_setup(request), number, repeat),
        "estimate_communication": best(
            lambda: estimate_communication(setup, stages), number, repeat
        ),
        "communication_response": best(lambda: present(result), number, repeat),
        "response -> JSON": best(lambda: to_json(response, CommunicationResponse), number, repeat),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=25, help="batches per phase (<= 100)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    repeat = min(max(args.repeat, 1), 100)
    runs = {
        "memory_paper": memory_phases(PAPER, 200, repeat),
        "memory_heavy": memory_phases(HEAVY, 5, repeat),
        "sweep_heavy": sweep_phases(HEAVY, 2, repeat),
        "communication_heavy": communication_phases(HEAVY_COMM, 10, repeat),
    }
    load = os.getloadavg()
    print(f"machine: {machine()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for name, phases in runs.items():
        print(f"{name}: total {sum(phases.values()) * 1e6:,.0f} µs CPU")
        for phase, seconds in phases.items():
            print(f"  {phase:30s} {seconds * 1e6:10,.1f} µs")
    if args.json:
        summary = {
            "machine": machine(),
            "load_average": load,
            "command": " ".join(sys.argv),
            "cpu_seconds": runs,
        }
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
