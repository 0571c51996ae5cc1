"""bench/validate_plan.py without a GPU: the specs it hands the measure runner are ones the runner
accepts, for every candidate the planner enumerates, and its report reads as it should."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("validate_plan", ROOT / "bench" / "validate_plan.py")
assert spec is not None and spec.loader is not None
validate_plan = importlib.util.module_from_spec(spec)
sys.modules["validate_plan"] = validate_plan
spec.loader.exec_module(validate_plan)


def test_every_candidate_becomes_a_spec_the_runner_accepts() -> None:
    pytest.importorskip("torch")
    from calculators.architecture import count_params
    from calculators.communication import GradSync, Network
    from calculators.gpus import get_gpu
    from calculators.plan import PlanSetup, Search, plan
    from measure.runner import parse_spec

    args = validate_plan.parse(["--device", "cpu", "--gpus", "2", "--tiny", "--seq-len", "32"])
    arch, model = validate_plan.architecture(args)
    setup = PlanSetup(
        architecture=arch,
        params=count_params(arch),
        gpu=get_gpu("l4"),
        gpus=2,
        gpus_per_node=2,
        network=Network(),
        global_batch_size=16,
        seq_len=32,
        search=Search(micro_batch_sizes=(2, 8)),
        grad_sync=GradSync.PER_MICRO_STEP,
    )
    planned = plan(setup)
    assert planned.candidates
    for cand in planned.candidates:
        ms = parse_spec(validate_plan.spec_for(args, model, 2, cand.config))
        assert ms.model.architecture is not None
        assert count_params(ms.model.architecture) == count_params(arch)
        assert ms.stages == (cand.config.stage,)
        assert ms.batch is not None
        assert ms.batch.micro_batch_size * ms.batch.grad_accumulation_steps == 8
        assert ms.batch.activation_checkpointing is cand.config.activation_checkpointing
        assert ms.mode == "distributed"


def test_the_default_model_is_a_1b_gpt() -> None:
    from calculators.architecture import count_params

    args = validate_plan.parse([])
    arch, model = validate_plan.architecture(args)
    assert 0.9e9 < count_params(arch) < 1.2e9
    assert model["architecture"]["layers"] == arch.layers


def test_markdown_report() -> None:
    report = {
        "model": 1_000_000,
        "nd": 2,
        "device_name": "NVIDIA H100 80GB HBM3",
        "engine": "torch",
        "per_gpu_batch": 8,
        "seq_len": 1024,
        "efficiency_default": 0.4,
        "efficiency_calibrated": 0.35,
        "calibrated_on": "stage 1, micro 8 × 1",
        "median_abs_error_default": 0.12,
        "median_abs_error_calibrated": 0.04,
        "first_choice": "stage 1, micro 8 × 1",
        "measured_fastest": "stage 1, micro 8 × 1",
        "first_choice_within_5_percent": True,
        "runs": [
            {
                "config": "stage 1, micro 8 × 1",
                "measured": 0.5,
                "predicted_default": 0.45,
                "error_default": -0.1,
                "predicted_calibrated": 0.5,
                "error_calibrated": 0.0,
            }
        ],
    }
    text = validate_plan.markdown(report)
    assert "| stage 1, micro 8 × 1 | 0.5000 | 0.4500 | -10.0% | 0.5000 | +0.0% |" in text
    assert "4.0% after calibration" in text and "within 5 %: yes." in text
