"""``stage_estimate`` builds the same ``StageEstimate`` as its constructor, every field set."""

from __future__ import annotations

from dataclasses import fields

import pytest

from calculators.conventions import Stage
from calculators.estimates import StageEstimate, stage_estimate
from calculators.model_states import Placement


@pytest.mark.parametrize(
    ("activations", "peak"), [(None, None), (7, 19), (0, 12)], ids=["no batch", "batch", "zero"]
)
@pytest.mark.parametrize("stage", list(Stage))
def test_same_estimate_as_the_constructor(
    stage: Stage, activations: int | None, peak: int | None
) -> None:
    device, cpu = Placement(2, 2, 8), Placement(0, 0, 4)
    args = {
        "stage": stage,
        "device": device,
        "cpu": cpu,
        "nvme": Placement(),
        "resident": 12,
        "activations": activations,
        "peak": peak,
        "notes": ("a note",),
        "theory": 12,
    }
    built = stage_estimate(**args)  # type: ignore[arg-type]
    assert built == StageEstimate(**args)  # type: ignore[arg-type]
    assert set(vars(built)) == {f.name for f in fields(StageEstimate)}
    with pytest.raises(AttributeError):  # still frozen
        built.resident = 0  # type: ignore[misc]
