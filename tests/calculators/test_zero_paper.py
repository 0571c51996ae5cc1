"""The ZeRO paper's published figures (arXiv 1910.02054) and a 10B model's examples, exact."""

from __future__ import annotations

import pytest

from calculators.capacity import max_params
from calculators.conventions import Optimizer, Precision, Stage
from calculators.memory import estimate
from calculators.model_states import TrainingSetup

GB = 10**9


def device_bytes(params: int, dp: int, stage: int, **kw: object) -> int:
    setup = TrainingSetup(params=params, dp=dp, **kw)  # type: ignore[arg-type]
    return estimate(setup, [Stage(stage)]).stages[0].model_states


# Figure 1: Ψ = 7.5B, Nd = 64, K = 12, bytes per device for stages 0..3.
@pytest.mark.parametrize(
    ("stage", "expected"),
    [(0, 120_000_000_000), (1, 31_406_250_000), (2, 16_640_625_000), (3, 1_875_000_000)],
)
def test_figure_1_exact(stage: int, expected: int) -> None:
    assert device_bytes(7_500_000_000, 64, stage) == expected


def agrees_to_printed_precision(value: float, printed: str) -> bool:
    """The printed cell equals the value rounded half-up or truncated at its decimals."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    scale = 10**decimals
    rounded = int(value * scale + 0.5) / scale
    truncated = int(value * scale) / scale
    return float(printed) in (rounded, truncated)


# Table 1 (GB per device; columns P_os / P_os+g / P_os+g+p), per REFERENCE.md §1.
TABLE_1 = {
    # Nd: (7.5B, 128B, 1T), each "P_os / P_os+g / P_os+g+p"
    1: ("120 120 120", "2048 2048 2048", "16000 16000 16000"),
    4: ("52.5 41.3 30", "896 704 512", "7000 5500 4000"),
    16: ("35.6 21.6 7.5", "608 368 128", "4750 2875 1000"),
    64: ("31.4 16.6 1.88", "536 284 32", "4187 2218 250"),
    256: ("30.4 15.4 0.47", "518 263 8", "4046 2054 62.5"),
    1024: ("30.1 15.1 0.12", "513 257 2", "4011 2013 15.6"),
}
MODELS = (7_500_000_000, 128_000_000_000, 1_000_000_000_000)
TABLE_1_CELLS = [
    (nd, psi, stage, cell)
    for nd, row in TABLE_1.items()
    for psi, cells in zip(MODELS, row, strict=True)
    for stage, cell in zip((1, 2, 3), cells.split(), strict=True)
]


def test_table_1_has_54_cells() -> None:
    assert len(TABLE_1_CELLS) == 54


@pytest.mark.parametrize(("nd", "psi", "stage", "printed"), TABLE_1_CELLS)
def test_table_1(nd: int, psi: int, stage: int, printed: str) -> None:
    assert agrees_to_printed_precision(device_bytes(psi, nd, stage) / GB, printed)


# Table 2: largest model on 32 GB V100s at Nd = 64, MP = 1: 2B / 7.6B / 14.4B / 128B.
@pytest.mark.parametrize(("stage", "printed_b"), [(0, "2"), (1, "7.6"), (2, "14.4"), (3, "128")])
def test_table_2(stage: int, printed_b: str) -> None:
    largest = max_params(TrainingSetup(params=1, dp=64), Stage(stage), 32 * GB)
    assert largest is not None
    assert agrees_to_printed_precision(largest / GB, printed_b)


# A 10B model's model states. fp32 Adam: 40 + 40 + 80 = 160 GB. Half precision:
# params + grads 40 GB, fp32 moments 80 GB = 120 GB (no fp32 master copy). With the paper's
# master copy, mixed Adam is 16 B/param = 160 GB.
@pytest.mark.parametrize(
    ("precision", "master_weights", "expected_gb"),
    [
        (Precision.FP32, True, 160),
        (Precision.MIXED_BF16, False, 120),
        (Precision.MIXED_FP16, False, 120),
        (Precision.MIXED_FP16, True, 160),
    ],
)
def test_10b_model_states(precision: Precision, master_weights: bool, expected_gb: int) -> None:
    got = device_bytes(
        10_000_000_000,
        1,
        0,
        precision=precision,
        optimizer=Optimizer.ADAM,
        master_weights=master_weights,
    )
    assert got == expected_gb * GB
