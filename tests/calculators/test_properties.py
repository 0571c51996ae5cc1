"""Properties of the model-state formulas, for any Ψ, Nd, K and precision (hypothesis)."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from calculators.conventions import GradientConvention, Optimizer, Precision, Stage
from calculators.memory import estimate
from calculators.model_states import TrainingSetup, bytes_per_param

psi = st.integers(min_value=1, max_value=10**13)
nd = st.integers(min_value=1, max_value=2**16)
setups = st.builds(
    TrainingSetup,
    params=psi,
    dp=nd,
    precision=st.sampled_from(list(Precision)),
    optimizer=st.sampled_from(list(Optimizer)),
    gradients=st.sampled_from(list(GradientConvention)),
)


def per_stage(setup: TrainingSetup) -> list[int]:
    return [s.model_states for s in estimate(setup, list(Stage)).stages]


@given(setups)
def test_non_increasing_in_stage(setup: TrainingSetup) -> None:
    figures = per_stage(setup)
    assert figures == sorted(figures, reverse=True)


@given(setups)
def test_nd_1_equals_stage_0(setup: TrainingSetup) -> None:
    from dataclasses import replace

    figures = per_stage(replace(setup, dp=1))
    assert len(set(figures)) == 1


@given(setups, st.integers(min_value=2, max_value=1000))
def test_linear_in_psi(setup: TrainingSetup, factor: int) -> None:
    from dataclasses import replace

    small = per_stage(replace(setup, dp=1))
    big = per_stage(replace(setup, dp=1, params=setup.params * factor))
    if bytes_per_param(setup).total.denominator == 1:
        assert big == [s * factor for s in small]
    else:  # fractional K (8-bit Adam): each of three ceilings may round by under a byte
        assert all(0 <= s * factor - b < 3 * factor for s, b in zip(small, big, strict=True))


@given(setups)
def test_shards_cover_the_whole(setup: TrainingSetup) -> None:
    whole = bytes_per_param(setup).total * setup.params
    for figure in per_stage(setup)[1:]:
        assert Fraction(figure) * setup.dp >= whole


@given(setups)
def test_stage_3_is_the_whole_over_nd_rounded_up(setup: TrainingSetup) -> None:
    whole = bytes_per_param(setup).total * setup.params
    assert per_stage(setup)[3] - whole / setup.dp < 3  # three ceilings, one byte each at most
