"""Parameter offload under DeepSpeed stage 3: the device copies of the partitions that forward's
prefetches gathered alone for backward, which torch's NCCL process group keeps until backward
waits on their gathers, against what a GPU run left alive after forward."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

from bench.accuracy import real_model_setups
from calculators.conventions import Stage
from calculators.estimates import StageEstimate
from calculators.memory import estimate

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
COPY_SITE = "partition_parameters.py:1396:"  # param_ds_tensor.to(device) in _all_gather_sequential


def _estimate(name: str, world: int | None = None) -> StageEstimate:
    for m in real_model_setups(RESULTS / "real_models" / "h200x2_set12.json"):
        if m.name == name:
            setup = m.setup if world is None else replace(m.setup, dp=world)
            return estimate(setup, [Stage.PARAMETERS]).stages[0]
    raise AssertionError(name)


def test_counted_copies_are_the_ones_the_snapshot_found_alive() -> None:
    """TinyLlama-1.1B, 1 x 2,048 tokens, checkpointing, Nd 2 (2 x H200): the allocator's
    snapshot after forward holds 29 copies made at the partition's host-to-device copy
    (``bench/gpu/ds_forward_snapshot.py --offload``); the prediction counts the same requests."""
    snapshot = json.loads(
        (
            RESULTS / "ds_forward_snapshot" / "ds_snapshot_tinyllama-1.1b_offload_full.json"
        ).read_text()
    )
    alive = Counter(
        b["requested"]
        for b in snapshot["blocks"]
        if b["in_forward"] and COPY_SITE in b["frames"][0]
    )
    assert sum(alive.values()) == 29
    stage = _estimate("tinyllama-1.1b_ds3offall_b1s2048_full")
    assert stage.components["peak.offload_gather_inputs"] == sum(n * c for n, c in alive.items())
    assert any("29 parameters a forward prefetch gathered alone" in n for n in stage.notes)


def test_one_rank_gathers_nothing_so_holds_no_copy() -> None:
    stage = _estimate("tinyllama-1.1b_ds3offall_b1s2048_full", world=1)
    assert "peak.offload_gather_inputs" not in stage.components
    assert not any("gathered alone are still in flight" in n for n in stage.notes)
