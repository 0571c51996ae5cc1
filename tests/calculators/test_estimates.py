"""``stage_estimate`` builds the same ``StageEstimate`` as its constructor, every field set
(an engine's buffers, components and host buffers too)."""

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
    # an engine's estimate: buffers at the peak, components, pinned host buffers
    engine = {"temporary_buffers": 3, "components": {"a": 1, "peak.b": 2}, "cpu_buffers": 64}
    built = stage_estimate(**args, **engine)  # type: ignore[arg-type]
    assert built == StageEstimate(**args, **engine)  # type: ignore[arg-type]
    assert vars(built) == vars(StageEstimate(**args, **engine))  # type: ignore[arg-type]
    # no components: a fresh empty mapping each, as the constructor's default
    first, second = stage_estimate(**args), stage_estimate(**args)  # type: ignore[arg-type]
    assert first.components == {} and first.components is not second.components
