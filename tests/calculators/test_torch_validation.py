"""The torch engine's predictions against the committed H100 measurements (docs/VALIDATION.md).

``bench/results/torch_peak.json`` holds 80 real runs (``python -m measure.validate --part peak``
on one H100): stages 0–3, Nd 1–64, two model sizes, with and without checkpointing. Each is
predicted again here with the current calculator, so a change to the model that breaks the
figures fails CI without a GPU.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from calculators.architecture import Architecture
from calculators.batch import Batch, Checkpointing
from calculators.conventions import Engine, Precision, Stage
from calculators.memory import estimate
from calculators.model_states import TrainingSetup

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "torch_peak.json"
# the models of measure/validate.py's PEAK_MODELS (kept here so this test needs no torch)
MODELS = {
    "GPT 124M": (
        {"layers": 12, "hidden": 768, "heads": 12, "vocab_size": 50257, "max_seq_len": 1024},
        (8, 1024),
    ),
    "GPT 1.4B": (
        {"layers": 24, "hidden": 2048, "heads": 16, "vocab_size": 50304, "max_seq_len": 1024},
        (4, 1024),
    ),
}


def _runs() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(case, run, errors of the current prediction) for every committed run."""
    out = []
    for case in json.loads(RESULTS.read_text()):
        name, ckpt = case["case"].split(" ckpt=")
        arch_kw, (micro, seq) = MODELS[name]
        arch = Architecture(**arch_kw)
        batch = Batch(micro, seq, Checkpointing(ckpt))
        for run in case["result"]["runs"]:
            setup = TrainingSetup(
                params=case["result"]["params"],
                dp=run["world_size"],
                precision=Precision.MIXED_BF16,
                engine=Engine.TORCH,
                architecture=arch,
                batch=batch,
                engine_config={"fsdp_root_reshard_after_forward": True},
            )
            est = estimate(setup, [Stage(run["stage"])]).stages[0]
            m = run["measured"]
            predicted = {
                "resident": est.resident,
                "peak": est.peak,
                **{k: est.components[k] for k in ("after_forward", "after_backward")},
            }
            errors = {k: (v - m[k]) / m[k] for k, v in predicted.items() if v is not None}
            out.append((case["case"], run, errors))
    return out


RUNS = _runs()


def test_every_run_is_predicted() -> None:
    assert len(RUNS) == 80
    assert all(
        set(errors) == {"resident", "peak", "after_forward", "after_backward"}
        for _, _, errors in RUNS
    )


def test_peak_within_3_percent_median_8_max() -> None:
    # predicted peak within 3 % median and 8 % max of measured
    errors = [abs(e["peak"]) for _, _, e in RUNS]
    assert statistics.median(errors) <= 0.03
    assert max(errors) <= 0.08


@pytest.mark.parametrize("key", ["resident", "after_forward", "after_backward"])
def test_resident_and_phases_within_two_percent(key: str) -> None:
    # resident within 2 %; the probed phases check the activation and gradient claims
    worst = max(RUNS, key=lambda r: abs(r[2][key]))
    assert abs(worst[2][key]) <= 0.02, (worst[0], worst[1]["world_size"], worst[1]["stage"])
