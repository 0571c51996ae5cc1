"""The planner: what it evaluates, what it keeps, how it ranks, and what it assumes."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest

from bench import plan_bench
from calculators.architecture import count_params
from calculators.batch import Checkpointing
from calculators.communication import GradSync, Phase
from calculators.conventions import Engine, Precision, Stage
from calculators.errors import InputError
from calculators.gpus import PRESETS, get_gpu, gpu_for_device_name
from calculators.plan import (
    Config,
    Efficiency,
    HostProbe,
    HostThreads,
    Learned,
    OffloadChoice,
    PlanSetup,
    Search,
    _Evaluator,
    calibrate,
    configs,
    context_reserve,
    plan,
    predict,
)
from calculators.topology import Op


def setup(engine: Engine = Engine.TORCH, **kw: object) -> PlanSetup:
    """bench/plan_bench.py's question (8 × H100, 256 × 4,096 tokens), changed by ``kw``."""
    base = plan_bench.setup(str(kw.pop("preset", "llama3-8b")), engine)
    return replace(base, **kw)  # type: ignore[arg-type]


@cache
def llama_plan(engine: Engine) -> object:
    return plan(setup(engine))


@pytest.mark.parametrize("engine", [Engine.TORCH, Engine.DEEPSPEED])
def test_evaluates_exactly_the_search_space(engine: Engine) -> None:
    p = llama_plan(engine)
    micro = 6  # 1, 2, 4, 8, 16, 32 divide 256 / 8
    # a transformers model checkpoints whole layers: none, and full with the layers' inputs on
    # the device or (checkpoint offload) in host memory; never selective
    ckpt = 3
    # offload choices per stage: torch 1 / 1 / 2 / 2 (FSDP2's CPU offload at stages 2-3);
    # deepspeed 1 / 2 / 2 / 3 for stages 0-3
    offloads = 1 + 1 + 2 + 2 if engine is Engine.TORCH else 1 + 2 + 2 + 3
    assert p.evaluated == micro * ckpt * offloads  # type: ignore[attr-defined]
    assert len(p.candidates) + len(p.rejected) == p.evaluated  # type: ignore[attr-defined]
    # communication is asked twice (1 and 2 micro-steps) per stage and offload, at most, and
    # DeepSpeed's stage 3 (3 offloads) twice more under full recomputation, which gathers again
    recomputed = 0 if engine is Engine.TORCH else 2 * 3
    assert p.communication_evaluations <= 2 * offloads + recomputed  # type: ignore[attr-defined]


@pytest.mark.parametrize("engine", [Engine.TORCH, Engine.DEEPSPEED])
def test_candidates_fit_and_are_ranked(engine: Engine) -> None:
    p = llama_plan(engine)
    s = p.setup  # type: ignore[attr-defined]
    usable = s.usable_memory
    assert p.candidates  # type: ignore[attr-defined]
    speeds = [c.tokens_per_second for c in p.candidates]  # type: ignore[attr-defined]
    assert speeds == sorted(speeds, reverse=True)
    for c in p.candidates:  # type: ignore[attr-defined]
        assert c.memory.peak is not None and c.memory.peak <= usable
        assert c.headroom == usable - c.memory.peak
        st = c.step
        assert st.total == pytest.approx(
            st.compute + st.optimizer_step + st.exposed_communication + st.offload_transfer
        )
        assert 0 <= st.exposed_communication <= st.communication + 1e-12
        assert c.tokens_per_second == pytest.approx(256 * 4096 / st.total)
    for r in p.rejected:  # type: ignore[attr-defined]
        assert r.peak is not None and r.over_by == r.peak - usable > 0
        assert "does not fit" in r.reason and "GiB" in r.reason


def test_stage_0_of_an_8b_model_never_fits_80_gb() -> None:
    p = llama_plan(Engine.TORCH)
    assert all(c.config.stage > Stage.NONE for c in p.candidates)  # type: ignore[attr-defined]
    # 16 B/param of model states alone is 128 GB
    assert any(r.config.stage is Stage.NONE for r in p.rejected)  # type: ignore[attr-defined]


def test_torch_engine_offloads_as_fsdp2_does() -> None:
    # CPUOffloadPolicy: parameters with their optimizer, at stages 2 and 3 only
    by_stage = {(c.stage, c.offload) for c in configs(setup())}
    assert by_stage == {(s, OffloadChoice.NONE) for s in Stage} | {
        (s, OffloadChoice.OPTIMIZER_AND_PARAMS) for s in (Stage.GRADIENTS, Stage.PARAMETERS)
    }


def test_fsdp2_cpu_offload_steps_torch_optimizer_on_the_host() -> None:
    s = setup()
    shard = -(-s.params // s.gpus)
    one = Config(Stage.PARAMETERS, 32, 1, Checkpointing.FULL, OffloadChoice.OPTIMIZER_AND_PARAMS)
    _, step, _ = predict(s, one)
    bandwidth, source = s.host_optimizer
    assert "single-tensor" in source and "DeepSpeed" in setup(Engine.DEEPSPEED).host_optimizer[1]
    # torch.optim.Adam's element-wise passes over the fp32 host shard (72 B per parameter)
    assert step.optimizer_step == pytest.approx(shard * 72 / bandwidth)
    assert step.offload_transfer > 0
    # accumulating: 12 B per parameter on the host for each later micro-step, and the later
    # micro-steps' reduce-scatters wait: never less exposed than without offload
    acc = replace(one, micro_batch_size=4, grad_accumulation_steps=8)
    _, accumulating, _ = predict(s, acc)
    _, kept, _ = predict(s, replace(acc, offload=OffloadChoice.NONE))
    assert accumulating.optimizer_step == pytest.approx(shard * (72 + 7 * 12) / bandwidth)
    assert accumulating.exposed_communication > kept.exposed_communication
    assert accumulating.exposed_communication <= accumulating.communication + 1e-12


def test_fsdp2_host_optimizer_threads_follow_the_launchers() -> None:
    # torchrun sets OMP_NUM_THREADS=1 only when a node runs several ranks; a node's only rank
    # keeps torch's default, every core, and its optimizer steps that much faster
    shared = setup()
    assert shared.host_optimizer_threads is not None
    assert shared.host_optimizer_threads[0] is HostThreads.ONE
    alone = setup(gpus_per_node=1)
    assert alone.host_optimizer_threads is not None
    assert alone.host_optimizer_threads[0] is HostThreads.ALL
    assert alone.host_optimizer[0] > shared.host_optimizer[0]
    assert "every core" in alone.host_optimizer[1]
    c = Config(Stage.PARAMETERS, 32, 1, Checkpointing.FULL, OffloadChoice.OPTIMIZER_AND_PARAMS)
    ratio = alone.host_optimizer[0] / shared.host_optimizer[0]
    assert predict(shared, c)[1].optimizer_step == pytest.approx(
        predict(alone, c)[1].optimizer_step * ratio
    )
    told = setup(gpus_per_node=1, host_threads=HostThreads.ONE, host_threads_source="said")
    assert told.host_optimizer == shared.host_optimizer
    assert told.host_optimizer_threads == (HostThreads.ONE, "said")
    # DeepSpeed's offloaded step follows the same threads (CPU Adam and torch's host ops),
    # and its source says the deepspeed launcher leaves each rank every core
    ds = setup(Engine.DEEPSPEED)
    assert ds.host_optimizer_threads[0] is HostThreads.ONE
    assert "deepspeed launcher" in ds.host_optimizer_threads[1]
    ds_all = setup(Engine.DEEPSPEED, host_threads=HostThreads.ALL)
    assert ds_all.host_optimizer[0] > ds.host_optimizer[0]
    assert "every core" in ds_all.host_optimizer[1] and "DeepSpeed" in ds_all.host_optimizer[1]


def test_deepspeed_offload_only_where_the_stage_allows_it() -> None:
    for c in configs(setup(Engine.DEEPSPEED)):
        if c.offload is OffloadChoice.OPTIMIZER:
            assert c.stage >= Stage.OPTIMIZER
        if c.offload is OffloadChoice.OPTIMIZER_AND_PARAMS:
            assert c.stage is Stage.PARAMETERS


def test_more_memory_fits_at_least_as_much() -> None:
    small = plan(setup(search=Search(activation_checkpointing=(Checkpointing.NONE,))))
    big = plan(
        setup(gpu=get_gpu("h200"), search=Search(activation_checkpointing=(Checkpointing.NONE,)))
    )
    fit_small = {c.config for c in small.candidates}
    fit_big = {c.config for c in big.candidates}
    assert fit_small < fit_big


def test_checkpointing_costs_compute_only() -> None:
    ev = _Evaluator(setup())
    base = Config(Stage.PARAMETERS, 2, 16, Checkpointing.NONE, OffloadChoice.NONE)
    steps = {
        ck: ev.step_time(replace(base, activation_checkpointing=ck))[0] for ck in Checkpointing
    }
    none, sel, full = (
        steps[Checkpointing.NONE],
        steps[Checkpointing.SELECTIVE],
        steps[Checkpointing.FULL],
    )
    assert none.recompute == 0 < sel.recompute < full.recompute
    assert none.compute < sel.compute < full.compute
    assert none.communication == sel.communication == full.communication


def test_efficiency_scales_the_gemms_only() -> None:
    c = Config(Stage.GRADIENTS, 4, 8, Checkpointing.FULL, OffloadChoice.NONE)
    _, a, _ = predict(setup(efficiency=Efficiency(0.2, "test")), c)
    _, b, _ = predict(setup(efficiency=Efficiency(0.4, "test")), c)
    ma, mb = a.micro, b.micro
    assert ma is not None and mb is not None
    assert ma.gemm_forward == pytest.approx(2 * mb.gemm_forward)
    assert ma.gemm_backward == pytest.approx(2 * mb.gemm_backward)
    assert ma.attention_forward == mb.attention_forward
    assert ma.memory_bound == mb.memory_bound and ma.host == mb.host
    # an 8B model at 4 × 4096 tokens per micro-step keeps the GPU the slower queue
    assert not a.host_bound and a.compute == pytest.approx(8 * ma.gpu)


def test_a_small_micro_step_is_host_bound() -> None:
    s = setup(preset="gpt2", global_batch_size=64, seq_len=128)
    small = predict(s, Config(Stage.PARAMETERS, 1, 8, Checkpointing.NONE, OffloadChoice.NONE))[1]
    assert small.host_bound and small.micro is not None
    assert small.compute == pytest.approx(8 * small.micro.host)
    # the host's work does not depend on the micro-batch; the GPU's grows with it
    big = predict(s, Config(Stage.PARAMETERS, 8, 1, Checkpointing.NONE, OffloadChoice.NONE))[1]
    assert big.micro is not None
    assert big.micro.host == pytest.approx(small.micro.host)
    assert big.micro.gpu > small.micro.gpu


@pytest.mark.parametrize("stage", [Stage.GRADIENTS, Stage.PARAMETERS])
@pytest.mark.parametrize("micro_steps", [1, 3, 8, 32])
def test_communication_is_linear_in_micro_steps(stage: Stage, micro_steps: int) -> None:
    """The planner asks the communication model at 1 and 2 micro-steps and extrapolates."""
    for engine in (Engine.TORCH, Engine.DEEPSPEED):
        ev = _Evaluator(setup(engine))
        c = Config(stage, 1, micro_steps, Checkpointing.NONE, OffloadChoice.NONE)
        direct = ev.stage_communication(c, micro_steps)
        profile = ev.communication(c)
        for phase in Phase:
            want = sum(x.time_seconds for x in direct.collectives if x.collective.phase is phase)
            assert profile.phases[phase].total(micro_steps) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("grad_sync", list(GradSync))
def test_fsdp2_reduces_every_micro_step_as_its_memory_is_counted(grad_sync: GradSync) -> None:
    """DDP follows grad_sync; FSDP2 reduce-scatters per micro-step whatever grad_sync says
    (once per step it would hold unsharded fp32 gradients the memory figures leave out)."""
    ev = _Evaluator(setup(grad_sync=grad_sync))

    def reductions(stage: Stage, micro_steps: int) -> int:
        c = Config(stage, 1, micro_steps, Checkpointing.NONE, OffloadChoice.NONE)
        found = ev.stage_communication(c, micro_steps).collectives
        op = Op.ALL_REDUCE if stage < Stage.GRADIENTS else Op.REDUCE_SCATTER
        return sum(x.collective.calls for x in found if x.collective.op is op)

    for stage in Stage:
        per_micro = stage >= Stage.GRADIENTS or grad_sync is GradSync.PER_MICRO_STEP
        assert reductions(stage, 4) == (4 if per_micro else 1) * reductions(stage, 1)


def test_deepspeed_overlap_comm_hides_stage_2_reductions() -> None:
    c = Config(Stage.GRADIENTS, 1, 32, Checkpointing.NONE, OffloadChoice.NONE)
    _, off, ov_off = predict(setup(Engine.DEEPSPEED), c)
    config = {"zero_optimization": {"overlap_comm": True}}
    _, on, ov_on = predict(setup(Engine.DEEPSPEED, engine_config=config), c)
    assert not ov_off.backward and ov_on.backward
    assert off.exposed_communication == pytest.approx(off.communication)
    assert on.exposed_communication < off.exposed_communication


def test_offload_adds_host_traffic_and_a_cpu_optimizer() -> None:
    none = Config(Stage.GRADIENTS, 1, 32, Checkpointing.NONE, OffloadChoice.NONE)
    _, a, _ = predict(setup(Engine.DEEPSPEED), none)
    _, b, _ = predict(setup(Engine.DEEPSPEED), replace(none, offload=OffloadChoice.OPTIMIZER))
    assert a.offload_transfer == 0 < b.offload_transfer
    assert b.optimizer_step > a.optimizer_step


def test_hsdp_only_across_nodes_and_at_stage_3() -> None:
    one_node = configs(setup())
    assert all(c.shard_group_size is None for c in one_node)
    two = setup(gpus=16, gpus_per_node=8, global_batch_size=256)
    hsdp = [c for c in configs(two) if c.shard_group_size is not None]
    assert hsdp and all(c.stage is Stage.PARAMETERS and c.shard_group_size == 8 for c in hsdp)
    # DeepSpeed 0.19.8 has no shard groups (MiCS removed): none tried, and the plan answers
    two_ds = replace(two, engine=Engine.DEEPSPEED)
    assert all(c.shard_group_size is None for c in configs(two_ds))
    assert plan(replace(two_ds, search=Search(stages=(Stage.PARAMETERS,)))).candidates
    only = Search(stages=(Stage.PARAMETERS,), micro_batch_sizes=(1,), offload=(OffloadChoice.NONE,))
    p = plan(replace(two, search=only))
    by_shard = {c.config.shard_group_size: c for c in p.candidates}
    # model states sharded over 8 instead of 16: more memory per device
    assert by_shard[8].memory.resident > by_shard[None].memory.resident


def test_calibration_recovers_the_efficiency_it_was_made_with() -> None:
    c = Config(Stage.PARAMETERS, 2, 4, Checkpointing.SELECTIVE, OffloadChoice.NONE)
    made = setup(Engine.DEEPSPEED, efficiency=Efficiency(0.23, "test"), global_batch_size=64)
    _, step, _ = predict(made, c)
    assert not step.host_bound
    found = calibrate(setup(Engine.DEEPSPEED, global_batch_size=64), c, step.total)
    assert found.learned is Learned.GPU
    assert found.efficiency == pytest.approx(0.23, rel=1e-9)


def test_calibration_recovers_the_host_cost_it_was_made_with() -> None:
    s = setup(preset="gpt2", global_batch_size=64, seq_len=128)
    c = Config(Stage.PARAMETERS, 1, 8, Checkpointing.NONE, OffloadChoice.NONE)
    made = replace(s, efficiency=Efficiency(host_seconds_per_kernel=21e-6))
    _, step, _ = predict(made, c)
    assert step.host_bound
    found = calibrate(s, c, step.total)
    assert found.learned is Learned.HOST
    assert found.host_seconds_per_kernel == pytest.approx(21e-6, rel=1e-9)
    assert found.efficiency == s.efficiency.value
    # asked for the GPU figure instead, the same run reads as slow GEMMs
    forced = calibrate(s, c, step.total, learn=Learned.GPU)
    assert forced.learned is Learned.GPU and forced.efficiency < s.efficiency.value


def _probe_seconds(made: PlanSetup, c: Config, probe_seq: int) -> float:
    """What the model with ``made``'s figures predicts for the host probe: ``c``'s forward and
    backward at one sequence of ``probe_seq`` tokens, one micro-step, no optimizer step (the
    step's own collectives are not overlapped: the whole phase is left out)."""
    small = replace(made, seq_len=probe_seq, global_batch_size=made.gpus)
    one = replace(c, micro_batch_size=1, grad_accumulation_steps=1)
    _, step, _ = predict(small, one)
    step_phase = _Evaluator(small).communication(one).phases[Phase.STEP].total(1)
    return step.total - step.optimizer_step - step_phase - step.offload_transfer


# (engine, GPUs, configuration): GPU-bound steps of 1024-token sequences
ONE_RUN_CASES = [
    (Engine.TORCH, 1, Config(Stage.NONE, 8, 1, Checkpointing.NONE, OffloadChoice.NONE)),
    (Engine.TORCH, 8, Config(Stage.PARAMETERS, 16, 1, Checkpointing.NONE, OffloadChoice.NONE)),
    (Engine.TORCH, 8, Config(Stage.NONE, 4, 2, Checkpointing.FULL, OffloadChoice.NONE)),
    (Engine.DEEPSPEED, 4, Config(Stage.GRADIENTS, 8, 1, Checkpointing.NONE, OffloadChoice.NONE)),
]


@pytest.mark.parametrize(("engine", "gpus", "c"), ONE_RUN_CASES)
def test_one_run_with_a_probe_recovers_both_figures(engine: Engine, gpus: int, c: Config) -> None:
    per_gpu = c.micro_batch_size * c.grad_accumulation_steps
    s = setup(engine, preset="gpt2-xl", gpus=gpus, gpus_per_node=gpus, seq_len=1024)
    s = replace(s, global_batch_size=per_gpu * gpus)
    made = replace(s, efficiency=Efficiency(0.61, "test", host_seconds_per_kernel=21e-6))
    _, step, _ = predict(made, c)
    assert not step.host_bound  # the main step shows the GPU
    probe = HostProbe(_probe_seconds(made, c, 32), 1, 32)
    found = calibrate(s, c, step.total, probe=probe)
    assert found.learned is Learned.BOTH
    assert found.host_seconds_per_kernel == pytest.approx(21e-6, rel=1e-6)
    assert found.efficiency == pytest.approx(0.61, rel=1e-6)
    assert found.probe_dispatches is not None and found.probe_dispatches > 0
    # the probe is host-bound: its GPU work is a small part of its time
    assert found.probe_gpu_seconds is not None and found.probe_gpu_seconds < 0.5 * probe.seconds
    assert found.notes == ()
    # the figures reproduce both measurements
    fitted = replace(
        s,
        efficiency=Efficiency(
            found.efficiency, "fit", host_seconds_per_kernel=found.host_seconds_per_kernel
        ),
    )
    assert predict(fitted, c)[1].total == pytest.approx(step.total, rel=1e-6)
    assert _probe_seconds(fitted, c, 32) == pytest.approx(probe.seconds, rel=1e-6)


def test_a_host_bound_run_with_a_probe_sets_the_host_cost_alone() -> None:
    s = setup(preset="gpt2", global_batch_size=64, seq_len=128)
    c = Config(Stage.PARAMETERS, 1, 8, Checkpointing.NONE, OffloadChoice.NONE)
    made = replace(s, efficiency=Efficiency(0.5, "test", host_seconds_per_kernel=25e-6))
    _, step, _ = predict(made, c)
    assert step.host_bound
    found = calibrate(s, c, step.total, probe=HostProbe(_probe_seconds(made, c, 32), 1, 32))
    assert found.learned is Learned.HOST
    assert found.host_seconds_per_kernel == pytest.approx(25e-6, rel=1e-6)
    assert found.efficiency == s.efficiency.value  # the stated default, and a note says why
    assert len(found.notes) == 1 and "host-bound at the probe's host cost" in found.notes[0]


def test_a_probe_shorter_than_its_gpu_work_leaves_the_host_cost() -> None:
    s = setup(preset="gpt2-xl", gpus=1, gpus_per_node=1, global_batch_size=8, seq_len=1024)
    c = Config(Stage.NONE, 8, 1, Checkpointing.NONE, OffloadChoice.NONE)
    made = replace(s, efficiency=Efficiency(0.61, "test"))
    total = predict(made, c)[1].total
    found = calibrate(s, c, total, probe=HostProbe(1e-6, 1, 32))
    assert found.learned is Learned.GPU
    assert found.efficiency == pytest.approx(0.61, rel=1e-6)
    assert found.host_seconds_per_kernel == s.efficiency.host_seconds_per_kernel
    assert "does not show the host" in found.notes[0]


def test_figures_one_at_a_time_with_a_probe() -> None:
    s = setup(preset="gpt2-xl", gpus=1, gpus_per_node=1, global_batch_size=8, seq_len=1024)
    c = Config(Stage.NONE, 8, 1, Checkpointing.NONE, OffloadChoice.NONE)
    made = replace(s, efficiency=Efficiency(0.61, "test", host_seconds_per_kernel=21e-6))
    total = predict(made, c)[1].total
    probe = HostProbe(_probe_seconds(made, c, 32), 1, 32)
    host = calibrate(s, c, total, probe=probe, learn=Learned.HOST)
    assert host.learned is Learned.HOST and host.efficiency == s.efficiency.value
    assert host.host_seconds_per_kernel == pytest.approx(21e-6, rel=1e-6)
    gpu = calibrate(s, c, total, probe=probe, learn=Learned.GPU)
    assert gpu.learned is Learned.GPU and gpu.efficiency == pytest.approx(0.61, rel=1e-6)
    assert gpu.host_seconds_per_kernel == s.efficiency.host_seconds_per_kernel
    with pytest.raises(InputError) as err:
        calibrate(s, c, total, learn=Learned.BOTH)
    assert err.value.field == "figure"
    with pytest.raises(InputError) as err:
        calibrate(s, c, total, probe=HostProbe(0.0, 1, 32))
    assert err.value.field == "host_probe"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"global_batch_size": 100}, "global_batch_size"),
        ({"gpus_per_node": 3}, "gpus_per_node"),
        ({"engine": Engine.PAPER}, "engine"),
        ({"search": Search(micro_batch_sizes=(3,))}, "search.micro_batch_size"),
        ({"efficiency": Efficiency(1.5, "x")}, "efficiency"),
    ],
)
def test_bad_setups_name_their_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(InputError) as err:
        plan(setup(**change))
    assert err.value.field == field


def test_fp32_runs_at_the_fp32_peak() -> None:
    s = setup(precision=Precision.FP32)
    assert s.peak_flops == get_gpu("h100-sxm").peak_flops_fp32


def test_gpu_presets_are_consistent() -> None:
    for g in PRESETS.values():
        assert g.peak_flops_16bit > g.peak_flops_fp32 > 0
        assert g.memory >= 16 * 2**30 and g.memory_bandwidth > 0 and g.source
        for name in g.device_names:
            assert gpu_for_device_name(name) is g
    assert get_gpu("h100-sxm").peak_flops_16bit == pytest.approx(989.5e12)
    assert gpu_for_device_name("NVIDIA H100 80GB HBM3") is get_gpu("h100-sxm")
    assert gpu_for_device_name("some other card") is None


def test_tensor_count_is_what_the_engines_walk() -> None:
    from calculators.architecture import tensors
    from calculators.plan import tensor_count
    from calculators.presets import PRESETS

    for p in PRESETS.values():
        assert tensor_count(p.architecture) == len(tensors(p.architecture))


def test_a_search_too_large_for_the_model_is_refused_before_any_work() -> None:
    from calculators.architecture import Architecture

    moe = Architecture(
        layers=16, hidden=64, heads=1, vocab_size=100, max_seq_len=64, num_experts=1024
    )
    s = setup(architecture=moe, params=count_params(moe), seq_len=64)
    with pytest.raises(InputError) as err:
        plan(s)
    assert err.value.field == "search" and "narrow" in err.value.message
    # one stage, one micro-batch, no checkpointing, no offload: few enough configurations
    narrow = Search(
        stages=(Stage.PARAMETERS,),
        micro_batch_sizes=(32,),
        activation_checkpointing=(Checkpointing.NONE,),
        offload=(OffloadChoice.NONE,),
    )
    assert plan(replace(s, search=narrow)).evaluated == 1


def test_deepspeeds_timed_boundary_step_is_cpu_adam_plus_the_copy_back() -> None:
    # engine.step() at the boundary runs CPU Adam, then copies the updated parameters back and
    # all-gathers them (stages 1-2): the calibration takes those off as predicted
    s = setup(Engine.DEEPSPEED, gpus=16, gpus_per_node=8)
    c = Config(Stage.GRADIENTS, 4, 2, Checkpointing.FULL, OffloadChoice.OPTIMIZER)
    ev = _Evaluator(s)
    comm = ev.communication(c)
    around = comm.transfer[1] + comm.phases[Phase.STEP].total(2)
    assert around > 0
    step = predict(s, c)[1].total
    timed = ev.host_step_bytes(c) / 20e9 + around
    found = calibrate(s, c, step, host_optimizer_seconds=timed)
    assert found.host_optimizer_bandwidth == pytest.approx(20e9, rel=1e-9)
    assert found.host_optimizer_threads is HostThreads.ONE  # two ranks per node: torchrun's one
    with pytest.raises(InputError) as err:
        calibrate(s, c, step, host_optimizer_seconds=around * 0.5)
    assert err.value.field == "host_optimizer_step_s"


def test_calibrating_on_an_offloaded_run_says_what_it_takes_as_given() -> None:
    s = setup()
    c = Config(Stage.PARAMETERS, 32, 1, Checkpointing.FULL, OffloadChoice.OPTIMIZER_AND_PARAMS)
    _, step, _ = predict(s, c)
    found = calibrate(s, c, step.total * 1.1)
    assert any("the run offloads" in n for n in found.notes)
    plain = calibrate(s, replace(c, offload=OffloadChoice.NONE), step.total)
    assert not any("offloads" in n for n in plain.notes)


@pytest.mark.parametrize("engine", [Engine.TORCH, Engine.DEEPSPEED])
def test_context_reserve_covers_what_was_measured_outside_the_allocator(engine: Engine) -> None:
    """The reserve for one rank and for an NCCL world is not below the device memory the
    dedicated runs found outside the allocator (rank 0's nvml_used − reserved after a step,
    ``bench/results/context``, ``bench/gpu/context_round.sh``)."""
    from pathlib import Path

    from bench.context_reserve import results

    seen = 0
    for path in sorted(Path("bench/results/context").glob("*.json")):
        for _, result in results(path):
            if result["engine"] != engine.value:
                continue
            for run in result["runs"]:
                m = run["measured"]
                outside = m["nvml_used"] - m["reserved"]
                reserve, source = context_reserve(engine, run["world_size"])
                assert 0 < outside <= reserve, (path.name, outside, reserve)
                assert engine.value in source
                seen += 1
    assert seen >= 2  # one rank and two


def test_the_reserve_follows_engine_and_ranks_unless_given() -> None:
    alone = setup(gpus=1, gpus_per_node=1, global_batch_size=8)
    world = setup()
    ds = setup(Engine.DEEPSPEED)
    assert alone.reserve[0] < world.reserve[0] < ds.reserve[0]
    assert "with 8 ranks" in world.reserve[1] and "one GPU" in alone.reserve[1]
    given = replace(world, context_reserve=3 * 2**30)
    assert given.reserve == (3 * 2**30, "given")
    assert given.usable_memory < world.usable_memory
    assert plan(world).assumptions.context_reserve_source == world.reserve[1]
