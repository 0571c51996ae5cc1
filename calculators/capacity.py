"""The inverse questions: the largest model that fits, the smallest Nd that fits it.

Both search the forward formulas (``calculators.memory``), so every engine and convention the
forward estimate supports answers here too, and the answers agree with it by construction.
The criterion is the per-device model states (ZeRO paper Table 2's criterion), or the figure
``fits`` uses when ``use_peak`` is set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from calculators.conventions import Stage
from calculators.memory import StageEstimate, estimate
from calculators.model_states import TrainingSetup

MAX_PARAMS = 10**15
MAX_DP = 2**20


def _needed(est: StageEstimate, use_peak: bool) -> int:
    if use_peak:
        return est.peak if est.peak is not None else est.resident
    return est.model_states


def _largest_true(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """Largest n in [lo, hi] with ok(n), for ok true on a prefix; None if ok(lo) is false."""
    if not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def max_params(
    setup: TrainingSetup, stage: Stage, device_memory: int, use_peak: bool = False
) -> int | None:
    """Largest Ψ whose per-device figure fits ``device_memory`` (None if not even Ψ = 1)."""

    def fits(psi: int) -> bool:
        trial = replace(setup, params=psi, architecture=None)
        return _needed(estimate(trial, [stage]).stages[0], use_peak) <= device_memory

    return _largest_true(1, MAX_PARAMS, fits)


def min_dp(
    setup: TrainingSetup,
    stage: Stage,
    device_memory: int,
    max_dp: int = MAX_DP,
    use_peak: bool = False,
) -> int | None:
    """Smallest Nd at which ``setup``'s model fits (None if no Nd up to ``max_dp`` does)."""

    def fits(n: int) -> bool:
        return _needed(estimate(replace(setup, dp=n), [stage]).stages[0], use_peak) <= device_memory

    # Per-device bytes never grow with Nd, so "does not fit" holds on a prefix of Nd.
    last_bad = _largest_true(1, max_dp, lambda n: not fits(n))
    if last_bad is None:
        return 1
    return last_bad + 1 if last_bad < max_dp else None
