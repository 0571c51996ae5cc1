"""``bench/gpu/step_snapshot.py --blocks``: a run's allocator history replayed on
``calculators.caching_allocator`` gives the blocks handed out, so the most they held at once is
``max_memory_allocated``. A made-up history stands in for a GPU's here."""

from __future__ import annotations

from typing import Any

import pytest

from bench.gpu.step_snapshot import MARK, MARK_END, block_report

MIB = 2**20
FRAMES = [{"filename": "model.py", "line": 7, "name": "forward"}]


def _history(sizes: list[int], freed: list[int]) -> dict[str, Any]:
    """The step's four peak resets, ``sizes`` allocated one after another (at addresses 1, 2,
    ...), then ``freed`` (those addresses) freed, then the end marker."""
    trace: list[dict[str, Any]] = []
    for k in range(4):
        trace.append({"action": "alloc", "addr": 100 + k, "size": MARK, "stream": 0})
        trace.append({"action": "free_completed", "addr": 100 + k, "size": MARK, "stream": 0})
    for addr, size in enumerate(sizes, 1):
        trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": FRAMES})
    for addr in freed:
        trace.append({"action": "free_completed", "addr": addr, "size": 0, "stream": 0})
    trace.append({"action": "alloc", "addr": 999, "size": MARK_END, "stream": 0})
    return {"device_traces": [trace], "segments": []}


def test_a_block_at_most_1_mib_too_big_is_handed_out_whole(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # six 3 MiB requests cut a 20 MiB segment down to a 2 MiB rest, which a 1.5 MiB request
    # takes whole (0.5 MiB left is not split off in the large pool)
    block_report(_history([3 * MIB] * 6 + [3 * MIB // 2], []), False, 20 * MIB, 5)
    out = capsys.readouterr().out
    assert "blocks replayed: peak 20.000 MiB" in out
    assert "requested then 19.500 MiB, beyond the requests 0.500 MiB" in out
    assert "1,572,864 B +  524,288 x  1" in out


def test_the_peak_is_the_blocks_held_then_not_after_they_merge(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the whole-block request is freed after the peak; its neighbours merge with it, and the
    # report still gives the blocks as they were at the peak
    block_report(_history([3 * MIB] * 6 + [3 * MIB // 2], [7, 6, 5]), False, 20 * MIB, 5)
    out = capsys.readouterr().out
    assert "peak 20.000 MiB" in out and "beyond the requests 0.500 MiB" in out
    groups = [line for line in out.splitlines() if line.startswith("   ")]
    assert len(groups) == 1 and "1,572,864 B +  524,288 x  1" in groups[0]
