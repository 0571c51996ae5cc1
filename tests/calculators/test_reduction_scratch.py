"""The reduction kernel's staging buffer against the GPU: every shape that
``bench/gpu/reduction_scratch.py`` measured on an H200 (``grad.sum(0)`` and an ``nn.Linear``'s
bias gradient reduced by autograd), predicted from the kernel's launch configuration."""

from __future__ import annotations

import json
from pathlib import Path

from calculators.caching_allocator import K_SMALL_SIZE
from calculators.reduction_scratch import HOPPER, ReductionDevice, reduction_scratch

MEASURED = Path(__file__).resolve().parents[2] / "bench/results/reduction_scratch/h200.json"


def test_every_measured_shape_is_predicted() -> None:
    data = json.loads(MEASURED.read_text())
    device = ReductionDevice(data["multiprocessors"], data["max_threads_per_multiprocessor"])
    assert device == HOPPER
    rows = data["rows"]
    assert len(rows) == 160 and any(r["sum"] for r in rows) and any(not r["sum"] for r in rows)
    for i, r in enumerate(rows):
        predicted = reduction_scratch(r["features"], r["tokens"], device)
        # the caching allocator hands out a cached block up to 1 MiB larger whole
        assert predicted <= r["sum"] <= predicted + K_SMALL_SIZE, r
        if i:  # the process's first backward also allocated cuBLAS's workspace
            assert predicted <= r["bias_backward"] <= predicted + K_SMALL_SIZE, r


def test_short_or_narrow_reductions_stay_in_their_blocks() -> None:
    assert reduction_scratch(4096, 1) == 0
    assert reduction_scratch(4096, 256) == 0  # 64 values a thread: warps split, no CTAs
    assert reduction_scratch(3072, 1024) == 24 * 2**20 + 512  # GPT-2 small's fc1, one sequence
    # large shapes are bounded by the grid the device keeps busy, not by the tensor
    assert reduction_scratch(14336, 16384) < 140 * 2**20
