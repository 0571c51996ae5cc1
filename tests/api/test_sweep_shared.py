"""A sweep works out what its Nd values share once (``calculators.memory.across_dp``): each of its
estimates must equal a fresh ``estimate`` of the same setup at that Nd, whatever the order the Nd
values come in, over the grid of ``test_figures_unchanged`` (every engine, model, DeepSpeed knob
that changes a walk, offload, precision, optimizer, checkpointing)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from app.api.convert import memory_setup
from app.api.routes.memory import answer
from app.api.routes.sweep import sweep
from app.schemas.memory import MemoryRequest
from app.schemas.sweep import MemorySweepRequest
from calculators.conventions import Stage
from calculators.errors import InputError
from calculators.memory import MemoryEstimate, across_dp, estimate
from tests.api.test_figures_unchanged import DPS, cases

# Nd values of one sweep: the grid's own, out of order, odd ones (ragged partitions), a repeat
SWEPT = (64, 1, 3, 1024, 2, 7, 8, 16, 4, 100, 1, 4096)


def _bodies() -> dict[str, dict[str, Any]]:
    """The grid's memory bodies, once per setup whatever its Nd: every DeepSpeed one (the engine
    that shares work across Nd), every fifth of the others (they estimate each Nd afresh)."""
    out: dict[str, dict[str, Any]] = {}
    for key, body in cases().items():
        if key.startswith("mem/"):
            tag = json.dumps({k: v for k, v in body.items() if k != "dp"}, sort_keys=True)
            out.setdefault(tag, body)
    kept = [
        body
        for i, body in enumerate(out.values())
        if body.get("engine") == "deepspeed" or i % 5 == 0
    ]
    return {f"{i:03d}": body for i, body in enumerate(kept)}


_BODIES = _bodies()


def _fresh(setup: Any, dp: int, stages: list[Stage]) -> MemoryEstimate | str:
    try:
        return estimate(replace(setup, dp=dp), stages)
    except InputError as err:
        return f"{err.field}: {err.message}"


def test_the_grid_is_broad() -> None:
    engines = {b.get("engine", "paper") for b in _BODIES.values()}
    assert engines == {"paper", "torch", "deepspeed"}
    assert sum(b.get("engine") == "deepspeed" for b in _BODIES.values()) > 150
    assert set(DPS) <= set(SWEPT)


@pytest.mark.parametrize("name", sorted(_BODIES))
def test_each_nd_equals_a_fresh_estimate(name: str) -> None:
    body = _BODIES[name]
    request = MemoryRequest(**body)
    try:
        setup = memory_setup(request)
    except InputError:
        pytest.skip("refused before any estimate")
    stages = [Stage(s) for s in request.stages]
    at_dp = across_dp(setup, stages)
    for dp in (setup.dp, *SWEPT):
        try:
            got: MemoryEstimate | str = at_dp(dp)
        except InputError as err:
            got = f"{err.field}: {err.message}"
        assert got == _fresh(setup, dp, stages), (name, dp)


@pytest.mark.parametrize(
    "name", [n for n, b in sorted(_BODIES.items()) if b.get("engine") == "deepspeed"][::7]
)
def test_each_sweep_point_is_the_memory_answer(name: str) -> None:
    """Through the routes: a sweep point's per-device figures are those of /v1/memory at its Nd."""
    body = {**_BODIES[name], "device_memory": 80_000_000_000}
    try:
        swept = json.loads(bytes(sweep(MemorySweepRequest(**body, dp_values=list(DPS))).body))
    except InputError:
        pytest.skip("refused at the request's own Nd")
    for point in swept["points"]:
        single = json.loads(bytes(answer(MemoryRequest(**{**body, "dp": point["dp"]})).body))
        assert [s["per_device"] for s in point["stages"]] == [
            s["per_device"] for s in single["stages"]
        ]
        assert [s["fits"] for s in point["stages"]] == [s["fits"] for s in single["stages"]]
