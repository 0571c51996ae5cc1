"""The stage-3 simulation against DeepSpeed itself: every case of the committed CPU runs
(``bench/ds_cpu_gathers.py``: transformers' modelling code, one rank of DeepSpeed 0.19.8 on the
CPU, every all-gather logged) is simulated again and must gather the same, call for call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.ds_cpu_gathers import simulated_gathers

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def _cases() -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    out = []
    for path in sorted(RESULTS.glob("ds_cpu_gathers_*.json")):
        run = json.loads(path.read_text())
        for case in run["cases"]:
            out.append((case["family"], run["size"], case["knobs"], case["deepspeed"]))
    return out


CASES = _cases()


def test_the_committed_runs_are_there() -> None:
    assert len(CASES) >= 36  # every family under three knob sets at the tiny size, at least


@pytest.mark.parametrize(
    ("family", "size", "knobs", "deepspeed"),
    CASES,
    ids=[f"{f}-{s}-{json.dumps(k, sort_keys=True)}" for f, s, k, _ in CASES],
)
def test_simulation_gathers_what_deepspeed_gathered(
    family: str, size: str, knobs: dict[str, Any], deepspeed: dict[str, Any]
) -> None:
    simulated = simulated_gathers(family, size, knobs)
    for phase in ("forward", "backward"):
        want = (deepspeed[phase]["calls"], deepspeed[phase]["elements"])
        assert (simulated[phase]["calls"], simulated[phase]["elements"]) == want, phase
