# ruff: noqa: T201 (a script: its report goes to stdout)
"""Every sweep answer of the figures grid, hashed: run it in two trees and compare the files.

``tests/api/test_figures_unchanged.py`` pins the memory and communication answers; this covers
``POST /v1/memory/sweep`` over the same grid's memory bodies (each setup once, whatever its Nd),
with the default Nd values and with ``dp_values`` [1, 3, 5, 64, 100, 2048, 2] and a device
memory: status, content type and a SHA-256 of the body per request.

    python3 bench/sweep_answers.py --json after.json            # in each tree
    python3 bench/sweep_answers.py --compare before.json after.json

A body near the sweep's 5 s budget (the 4,096-expert torch one) can be refused in one run and
answered in another when the machine is loaded: run the two trees one after the other.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ZEROCALC_DATA_DIR", tempfile.mkdtemp(prefix="zerocalc-sweeps-"))

EXTRAS: tuple[dict[str, Any], ...] = (
    {},
    {"dp_values": [1, 3, 5, 64, 100, 2048, 2], "device_memory": 80_000_000_000},
)


def answers() -> dict[str, list[Any]]:
    from fastapi.testclient import TestClient

    from app.main import app
    from tests.api.test_figures_unchanged import cases

    out: dict[str, list[Any]] = {}
    seen: set[str] = set()
    with TestClient(app) as client:
        for key, body in sorted(cases().items()):
            if not key.startswith("mem/"):
                continue
            tag = json.dumps({k: v for k, v in body.items() if k != "dp"}, sort_keys=True)
            if tag in seen:
                continue
            seen.add(tag)
            for extra in EXTRAS:
                r = client.post("/v1/memory/sweep", json={**body, **extra})
                digest = hashlib.sha256(r.content).hexdigest()
                out[tag + json.dumps(extra)] = [r.status_code, r.headers["content-type"], digest]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the hashes here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        print(f"{len(before)} and {len(after)} answers, {len(differ)} differ")
        for k in differ:
            print(f"  {k[:160]}: {before.get(k)} -> {after.get(k)}")
        return 1 if differ else 0
    found = answers()
    answered = sum(1 for status, _, _ in found.values() if status == 200)
    print(f"{len(found)} sweep answers, {answered} of them 200")
    if args.json:
        args.json.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
