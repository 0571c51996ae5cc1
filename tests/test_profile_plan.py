"""bench/profile_plan.py without a GPU: the timeline reduction on a hand-made timeline (kernel
categories, the GPU's busy and idle time, exposed NCCL, launches, engine regions), and the
whole script on the CPU under torchrun (two gloo ranks, one FSDP2 candidate)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("profile_plan", ROOT / "bench" / "profile_plan.py")
assert spec is not None and spec.loader is not None
profile_plan = importlib.util.module_from_spec(spec)
sys.modules["profile_plan"] = profile_plan
spec.loader.exec_module(profile_plan)

Activity, Region, Timeline = profile_plan.Activity, profile_plan.Region, profile_plan.Timeline


def test_kernel_names_fall_in_their_categories() -> None:
    cat = profile_plan.category
    assert (
        cat("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "", "forward") == "gemm"
    )
    assert cat("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "aten::mm", "backward") == "gemm"
    assert cat("void pytorch_flash::flash_fwd_kernel<cutlass::bfloat16_t>", "", "forward") == (
        "attention"
    )
    assert cat("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", "", "optimizer") == "nccl"
    assert cat("multi_tensor_apply_kernel<FusedAdamMathFunctor>", "", "optimizer") == "optimizer"
    assert cat("unrolled_elementwise_kernel<direct_copy_kernel_cuda>", "", "forward") == (
        "copy_cast"
    )
    assert cat("CatArrayBatchedCopy_contig", "", "backward") == "copy_cast"
    assert cat(
        "vectorized_elementwise_kernel<4, BinaryFunctor>", "aten::_chunk_cat", "backward"
    ) == ("copy_cast")
    assert cat("vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", "aten::gelu", "forward") == (
        "elementwise_reduction"
    )


def test_union_clips_and_merges() -> None:
    assert profile_plan.union_ns([(0, 10), (5, 20), (30, 40)], 0, 100) == 30
    assert profile_plan.union_ns([(0, 10), (5, 20), (30, 40)], 8, 35) == 17
    assert profile_plan.union_ns([], 0, 10) == 0


def test_candidates_parse_and_reject() -> None:
    c = profile_plan.parse_candidates("3:2x4, 0:8x1:full")
    assert [(int(x.stage), x.micro_batch_size, x.grad_accumulation_steps) for x in c] == [
        (3, 2, 4),
        (0, 8, 1),
    ]
    assert c[1].activation_checkpointing.value == "full"
    with pytest.raises(SystemExit):
        profile_plan.parse_candidates("3:2")


def _timeline() -> Timeline:
    """One step of two micro-steps on thread 1 (times in ns); the autograd thread is 2."""
    zc = profile_plan.MARK
    regions = [
        Region(zc + "step", 0, 1000, 1),
        Region(zc + "forward", 0, 150, 1),
        Region(zc + "backward", 150, 400, 1),
        Region(zc + "forward", 400, 500, 1),
        Region(zc + "backward", 500, 800, 1),
        Region(zc + "optimizer", 800, 1000, 1),
        Region("FSDP::pre_forward (blocks.0)", 10, 100, 1),
        Region("FSDP::all_gather", 40, 60, 1),
        Region("FSDP::post_backward_reduce (blocks.0)", 600, 700, 2),
    ]
    acts = [
        Activity("sm90_xmma_gemm_bf16", 100, 300, 7, 20, 1, "aten::mm"),
        Activity("ncclDevKernel_AllGather_RING_LL", 200, 400, 9, 50, 1, ""),
        Activity("direct_copy_kernel_cuda", 400, 450, 7, 350, 2, "aten::copy_"),
        Activity("vectorized_elementwise_kernel<gelu>", 500, 600, 7, 450, 1, "aten::gelu"),
        Activity("ncclDevKernel_ReduceScatter_RING_LL", 600, 700, 9, 650, 2, ""),
        Activity("multi_tensor_apply_kernel<Adam>", 900, 950, 7, 850, 1, "aten::_foreach_add_"),
        Activity("launched before the step", 2000, 2100, 7, -5, 1, ""),
    ]
    return Timeline(acts, regions)


def test_summary_of_a_hand_made_step() -> None:
    s = profile_plan.summarize(_timeline(), steps=1, micro_steps=2, top=2)
    ms = 1e-6
    assert s["kernel_ms"] == pytest.approx(
        {
            "gemm": 200 * ms,
            "attention": 0.0,
            "elementwise_reduction": 100 * ms,
            "copy_cast": 50 * ms,
            "nccl": 300 * ms,
            "optimizer": 50 * ms,
        }
    )
    # window 100..950; kernels cover 100..450, 500..700, 900..950 = 600; without NCCL
    # 100..300, 400..450, 500..600, 900..950 = 400
    assert s["gpu_window_ms"] == pytest.approx(850 * ms)
    assert s["gpu_busy_ms"] == pytest.approx(600 * ms)
    assert s["gpu_idle_ms"] == pytest.approx(250 * ms)
    assert s["nccl_exposed_ms"] == pytest.approx(200 * ms)
    # launched at 20, 50, 450 (forward), 350, 650 (backward), 850 (optimizer); -5 is outside
    assert s["launches_per_step"] == {"forward": 3, "backward": 2, "optimizer": 1}
    assert s["launches_per_micro_step"] == pytest.approx(2.5)
    assert s["kernel_ms_by_phase"]["backward"]["nccl"] == pytest.approx(100 * ms)
    regions = s["regions"]
    # innermost region on the launching thread: the all-gather holds the NCCL launch at 50
    assert regions["FSDP::all_gather"]["kernel_ms"] == pytest.approx(200 * ms)
    assert regions["FSDP::pre_forward"]["kernel_ms"] == pytest.approx(200 * ms)
    assert regions["FSDP::pre_forward"]["cpu_ms"] == pytest.approx(90 * ms)
    assert regions["FSDP::post_backward_reduce"]["kernel_ms"] == pytest.approx(100 * ms)
    assert [k["category"] for k in s["top_kernels"]] == ["gemm", "nccl"]


@pytest.mark.slow
def test_the_script_runs_on_two_cpu_ranks(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "bench" / "profile_plan.py"),
        "--device",
        "cpu",
        "--tiny",
        "--gpu",
        "l4",
        "--seq-len",
        "32",
        "--candidates",
        "3:2x2",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "plan_profile_nd2_tiny.json").read_text())
    assert report["nd"] == 2 and report["skipped_for_budget"] == []
    (run,) = report["runs"]
    assert run["config"] == "stage 3, micro 2 × 2"
    assert run["engine_name"].startswith("FSDP2")
    assert run["step_s"] > 0 and run["timed"]["cpu"]["backward"] > 0
    assert run["predicted"]["total"] > 0
    # FSDP2 all-gathers and reduce-scatters on every micro-step; its hooks are annotated
    assert {c["op"] for c in run["collectives"]} >= {"all_gather", "reduce_scatter"}
    assert run["sent_bytes_per_rank"] > 0
    assert {"FSDP::pre_forward", "FSDP::post_backward_reduce"} <= set(run["profile"]["regions"])
    assert run["matmul_flops_per_step"]["linear"] > 0
    md = (tmp_path / "plan_profile_nd2_tiny.md").read_text()
    assert "| stage 3, micro 2 × 2 |" in md
