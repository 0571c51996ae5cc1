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


def _gpt_1b_on_h200(nd: int = 1) -> object:
    from calculators.gpus import get_gpu

    args = validate_plan.parse(["--micro", "1,2,8", "--stages", "0,3"])
    return validate_plan.plan_setup(args, validate_plan.GPT_1B, get_gpu("h200"), nd)


def test_two_runs_recover_both_figures_and_the_report_says_so() -> None:
    from dataclasses import replace

    from calculators.batch import Checkpointing
    from calculators.conventions import Stage
    from calculators.plan import Config, Efficiency, OffloadChoice, predict

    setup = _gpt_1b_on_h200()
    truth = replace(setup, efficiency=Efficiency(0.6, "truth", host_seconds_per_kernel=25e-6))
    configs = [
        Config(Stage(s), m, 8 // m, Checkpointing.NONE, OffloadChoice.NONE)
        for s in (0, 3)
        for m in (1, 2, 8)
    ]
    measured = [(c, predict(truth, c)[1].total) for c in configs]
    r = validate_plan.evaluate(setup, measured)
    # the first choice (8 sequences at once) is GPU-bound: it sets the GEMM efficiency; the
    # most host-bound run (FSDP2, one sequence per micro-step) sets the host cost
    assert r["calibrated_on"].endswith("micro 8 × 1") and r["calibrated_learned"] == "gpu"
    assert r["second_calibration_on"] == "stage 3, micro 1 × 8"
    assert r["gemm_efficiency_two"] == pytest.approx(0.6, rel=1e-6)
    assert r["host_seconds_per_kernel_two"] == pytest.approx(25e-6, rel=1e-6)
    assert r["median_abs_error_calibrated_two"] == pytest.approx(0, abs=1e-9)
    assert r["median_abs_error_default"] > 0.05  # the defaults are not the truth
    assert r["first_choice_calibrated_two_within_5_percent"] is True
    report = {
        "model": 1_000_000,
        "nd": 1,
        "device_name": "NVIDIA H200",
        "engine": "torch",
        "per_gpu_batch": 8,
        "seq_len": 1024,
        **r,
    }
    text = validate_plan.markdown(report)
    assert "| stage 3, micro 1 × 8 | host |" in text
    assert "+0.0% |" in text and "0.0% on two (runs not calibrated on)" in text
    assert "host 25.0 µs" in text


def test_the_model_agrees_with_the_committed_profiles(tmp_path: Path) -> None:
    """The GPU profiles of the 1B GPT (Nd 1, 2, 4 on H200) re-predicted with the current model:
    the stated defaults and one calibration run stay within 10 % median |error|, and the
    planner's first choice within 5 % of the measured fastest."""
    pytest.importorskip("fastapi")
    files = sorted((ROOT / "bench" / "results" / "plan_profile").glob("plan_profile_nd*.json"))
    assert len(files) == 3
    argv = ["--report", *map(str, files), "--out", str(tmp_path)]
    assert validate_plan.main(argv) == 0
    import json

    for body in json.loads((tmp_path / "plan_model_check.json").read_text()):
        assert body["median_abs_error_default"] <= 0.10, body["source"]
        assert body["median_abs_error_calibrated"] <= 0.10, body["source"]
        assert body["first_choice_calibrated_within_5_percent"], body["source"]
    assert "Median |error|" in (tmp_path / "plan_model_check.md").read_text()


def test_one_run_with_its_probe_recovers_the_figures_it_was_made_with() -> None:
    """``--calibration probe``: step times and probes made by the model with known figures; the
    first choice and its probe alone give both back, and every run is then predicted exactly."""
    from dataclasses import replace

    from calculators.communication import Phase
    from calculators.gpus import get_gpu
    from calculators.plan import Efficiency, HostProbe, _Evaluator, plan, predict

    args = validate_plan.parse(["--gpus", "2", "--calibration", "probe"])
    arch, _ = validate_plan.architecture(args)
    setup = validate_plan.plan_setup(args, arch, get_gpu("h200"), 2)
    made = replace(setup, efficiency=Efficiency(0.66, "made", host_seconds_per_kernel=22e-6))
    measured, probes = [], {}
    for cand in plan(setup).candidates:
        c = cand.config
        measured.append((c, predict(made, c)[1].total))
        small = replace(made, seq_len=32, global_batch_size=2)
        one = replace(c, micro_batch_size=1, grad_accumulation_steps=1)
        step = predict(small, one)[1]
        step_phase = _Evaluator(small).communication(one).phases[Phase.STEP].total(1)
        probes[c] = HostProbe(step.total - step.optimizer_step - step_phase, 1, 32)
    r = validate_plan.evaluate(setup, measured, probes)
    assert r["calibrated_probe_learned"] == "both"
    assert r["gemm_efficiency_probe"] == pytest.approx(0.66, rel=1e-6)
    assert r["host_seconds_per_kernel_probe"] == pytest.approx(22e-6, rel=1e-6)
    assert r["median_abs_error_calibrated_probe"] == pytest.approx(0, abs=1e-6)
    for run in r["runs"]:  # each run's own probe gives the same host cost
        assert run["probe_host_seconds_per_kernel"] == pytest.approx(22e-6, rel=1e-6)
    text = validate_plan.markdown(
        {**r, "model": 1, "nd": 2, "device_name": "H200", "engine": "torch",
         "per_gpu_batch": 8, "seq_len": 1024}
    )  # fmt: skip
    assert "alone with its host probe (both)" in text and "22.0 µs per kernel" in text


def test_committed_offload_runs_are_predicted_on_the_threads_they_recorded() -> None:
    """A file's offloaded runs on one thread (OMP_NUM_THREADS=1 at Nd 1) are predicted at the
    one-thread figure, where the planner alone would give a node's only rank every core."""
    import json

    from calculators.plan import HostThreads

    path = ROOT / "bench/results/plan_validation/fsdp2_offload_one_thread_h200x1_gpt_nd1.json"
    body = json.loads(path.read_text())
    runs = validate_plan.measured_runs(body)
    _, setup = validate_plan.committed_setup(body, runs)
    assert setup.host_optimizer_threads is not None
    assert setup.host_optimizer_threads[0] is HostThreads.ONE
    for run in body["runs"]:
        run.pop("cpu_threads", None)
    _, derived = validate_plan.committed_setup(body, runs)
    assert derived.host_optimizer_threads is not None
    assert derived.host_optimizer_threads[0] is HostThreads.ALL
    assert derived.host_optimizer[0] > setup.host_optimizer[0]


def test_a_report_at_a_given_host_bandwidth(tmp_path: Path) -> None:
    """--host-optimizer-bandwidth re-predicts committed offloaded runs at that figure: the 1B
    GPT's one-thread DeepSpeed run at Nd 2, 3.24 GB/s as stated now, reads far too fast at the
    37.5 GB/s stated before."""
    pytest.importorskip("fastapi")
    import json

    run = ROOT / "bench/results/plan_validation/ds_offload_h200x2_gpt_nd2.json"
    errors = {}
    for given in (None, 37.5e9):
        out = tmp_path / str(given)
        argv = ["--report", str(run), "--out", str(out)]
        argv += [] if given is None else ["--host-optimizer-bandwidth", str(given)]
        assert validate_plan.main(argv) == 0
        (body,) = json.loads((out / "plan_model_check.json").read_text())
        errors[given] = body["median_abs_error_default"]
    assert errors[None] < 0.05 < 0.85 < errors[37.5e9]


def test_committed_checkpoint_offload_runs_hold_what_validation_states(tmp_path: Path) -> None:
    """The planner's checkpoint-offload candidates measured beside the same candidates without
    it (1.5B Llama-style, Nd 1 and 2): re-predicted with the current model, the copies read
    within a quarter of the measured difference, and every candidate within 10 % calibrated on
    two runs (docs/VALIDATION.md, "Twenty-seventh round")."""
    pytest.importorskip("fastapi")
    import json

    files = sorted((ROOT / "bench/results/plan_validation").glob("h200x2_llama_ckpt_offload_*"))
    assert len(files) == 2
    assert validate_plan.main(["--report", *map(str, files), "--out", str(tmp_path)]) == 0
    for body in json.loads((tmp_path / "plan_model_check.json").read_text()):
        pairs = body["checkpoint_offload_pairs"]
        assert len(pairs) >= 3
        assert all(-0.25 <= p["error"] <= 0 for p in pairs)
        moved = [r for r in body["runs"] if r["config_fields"]["checkpoint_offload"] == "True"]
        assert len(moved) >= 3
        assert all(abs(r["error_calibrated_two"]) <= 0.10 for r in body["runs"])
        assert body["first_choice_calibrated_two_within_5_percent"]


def test_plan_bench_runs_every_question(tmp_path: Path) -> None:
    """bench/plan_bench.py plans each bundled model with each engine and writes what it timed."""
    import json

    from bench import plan_bench

    out = tmp_path / "plan.json"
    assert plan_bench.main(["--repeat", "1", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 2 * len(plan_bench.MODELS)
    assert all(r["evaluated"] >= r["fit"] > 0 and r["cpu_seconds"] > 0 for r in runs)
