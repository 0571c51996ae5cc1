"""The torch engine's predictions against the committed H100 measurements (docs/VALIDATION.md).

``bench/results/torch_peak.json`` holds 80 real runs (``python -m measure.validate --part peak``
on one H100): stages 0–3, Nd 1–64, two model sizes, with and without checkpointing. Each is
predicted again with the current calculator (``bench.accuracy``); ``tests/test_accuracy.py``
holds every run to the error the README's accuracy table states, so a change to the model that
breaks the figures fails CI without a GPU.
"""

from __future__ import annotations

from bench.accuracy import (
    AFTER_BACKWARD,
    AFTER_FORWARD,
    PEAK,
    RESIDENT,
    RESULTS,
    SENT,
    torch_peak_runs,
)

RUNS = torch_peak_runs(RESULTS / "torch_peak.json")


def test_every_run_is_predicted() -> None:
    assert len(RUNS) == 80
    memory = {PEAK, RESIDENT, AFTER_FORWARD, AFTER_BACKWARD}
    assert all(memory <= set(run.errors) for run in RUNS)
    # every run that sent bytes (Nd > 1) has them predicted; one rank sends nothing
    assert all((SENT in run.errors) == (run.dp > 1) for run in RUNS)


def test_bytes_sent_are_exact() -> None:
    assert all(run.errors[SENT] == 0 for run in RUNS if SENT in run.errors)
