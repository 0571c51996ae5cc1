"""DeepSpeed's IPG buckets (``ipg_walk``) found on prefix sums are the buckets of the
gradient-by-gradient walk in DeepSpeed's order (stage_1_and_2.py
reduce_independent_p_g_buckets_and_remove_grads: reduce before a gradient that would overflow)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.engines.deepspeed.buckets import ipg_walk


def walked(numels: list[int], bucket: int) -> list[list[int]]:
    """One gradient at a time, as DeepSpeed adds them."""
    out: list[list[int]] = []
    current: list[int] = []
    fill = 0
    for i, n in enumerate(numels):
        if n == 0:
            continue
        if fill and fill + n > bucket:
            out.append(current)
            current, fill = [], 0
        current.append(i)
        fill += n
        if fill > bucket:  # an oversized gradient, reduced on its own
            out.append(current)
            current, fill = [], 0
    if current:
        out.append(current)
    return out


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(
    numels=st.lists(st.one_of(st.just(0), st.integers(1, 50), st.integers(1, 5000)), max_size=60),
    bucket=st.integers(0, 3000),
)
def test_buckets_are_the_walks(numels: list[int], bucket: int) -> None:
    assert ipg_walk(numels, bucket) == walked(numels, bucket)


def test_oversized_and_empty_gradients() -> None:
    assert ipg_walk([5, 0, 20, 3, 0, 0, 4, 9], 10) == [[0], [2], [3, 6], [7]]
    assert ipg_walk([0, 0], 10) == []
