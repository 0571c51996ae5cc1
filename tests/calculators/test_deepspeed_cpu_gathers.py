"""The stage-3 simulation against DeepSpeed itself: every case of the committed CPU runs
(``bench/ds_cpu_gathers.py``: transformers' modelling code, one rank of DeepSpeed 0.19.8 on the
CPU, every all-gather logged; some with transformers' gradient checkpointing) is simulated again
and must gather the same, call for call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.ds_cpu_gathers import simulated_gathers

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def _cases() -> list[tuple[str, str, dict[str, Any], str, dict[str, Any]]]:
    out = []
    for path in sorted(RESULTS.glob("ds_cpu_gathers_*.json")):
        run = json.loads(path.read_text())
        for case in run["cases"]:
            checkpointing = case.get("checkpointing", "none")
            out.append(
                (case["family"], run["size"], case["knobs"], checkpointing, case["deepspeed"])
            )
    return out


CASES = _cases()


def test_the_committed_runs_are_there() -> None:
    # every family under three knob sets at the tiny size, with and without checkpointing
    assert sum(c[3] == "none" for c in CASES) >= 36
    assert sum(c[3] == "full" for c in CASES) >= 36


def _name(family: str) -> str:
    """A family's name, or a config.json's model type and size."""
    if not family.startswith("{"):
        return family
    body = json.loads(family)
    return f"{body['model_type']}-{body['hidden_size']}x{body['num_hidden_layers']}"


@pytest.mark.parametrize(
    ("family", "size", "knobs", "checkpointing", "deepspeed"),
    CASES,
    ids=[f"{_name(f)}-{s}-{c}-{json.dumps(k, sort_keys=True)}" for f, s, k, c, _ in CASES],
)
def test_simulation_gathers_what_deepspeed_gathered(
    family: str, size: str, knobs: dict[str, Any], checkpointing: str, deepspeed: dict[str, Any]
) -> None:
    simulated = simulated_gathers(family, size, knobs, checkpointing)
    for phase in ("forward", "backward"):
        want = (deepspeed[phase]["calls"], deepspeed[phase]["elements"])
        assert (simulated[phase]["calls"], simulated[phase]["elements"]) == want, phase
