"""What DeepSpeed 0.19.8 sends per optimizer step, stage by stage.

Paths relative to ``deepspeed/runtime/``: engine.py, zero/stage_1_and_2.py, zero/stage3.py,
zero/partitioned_param_coordinator.py, zero/parameter_offload.py. The knob parsing, parameter
list and stage-3 coordinator simulation are the memory model's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from calculators.conventions import FP32_BYTES, PRECISION_BYTES, OffloadDevice, Stage
from calculators.engines.deepspeed.buckets import (
    MEMORY_OPT_ALLREDUCE_SIZE,
    fallback_buckets,
    ipg_buckets,
)
from calculators.engines.deepspeed.config import (
    Knobs,
    knobs_with,
    model_steps,
    param_list,
    parse_config,
)
from calculators.engines.deepspeed.stage3 import Stage3Plan, leaf_layers, stage3_plan
from calculators.errors import InputError
from calculators.model_states import ceil_div
from calculators.parameters import implied_note, param_numels
from calculators.topology import Group, Op
from calculators.traffic import (
    Collective,
    CommunicationSetup,
    EngineTraffic,
    Phase,
    Transfer,
    ZeroPlusPlus,
    dtype_name,
    micro_steps,
    padded,
)

TRAFFIC_CONVENTION = (
    "deepspeed: DeepSpeed 0.19.8 defaults read from its source — stage 0 bucketed "
    "all-reduce at the accumulation boundary (engine.py allreduce_gradients); stages 1/2 "
    "all-reduce of IPG gradient buckets (reduce_scatter=True with "
    "use_multi_rank_bucket_allreduce=True issues all_reduce, stage_1_and_2.py "
    "average_tensor) then one all_gather_into_tensor of the padded 16-bit flat buffer; stage "
    "3 the all-gathers of a simulated partitioned_param_coordinator in steady state (module "
    "fetches and prefetches; persistent parameters, numel <= "
    "stage3_param_persistence_threshold, stay gathered; backward re-gathers only what the "
    "coordinator released, nothing on models whose prefetch reaches backward), bucketed "
    "reduce-scatter of padded gradients, all-gather of persistent parameters after the "
    "step. Knobs from engine_config (calculators.engines.deepspeed.parse_config)."
)


def deepspeed_knobs(config: Mapping[str, Any] | None, zeropp: ZeroPlusPlus) -> Knobs:
    """The DeepSpeed config body's knobs (engines.deepspeed.parse_config), with the request's
    ZeRO++ options switched on where the config leaves them off."""
    knobs = parse_config(config)
    return knobs_with(
        knobs,
        qwz=knobs.qwz or zeropp.qwz,
        qgz=knobs.qgz or zeropp.qgz,
        hpz=zeropp.hpz if zeropp.hpz > 1 else knobs.hpz,
    )


def _ds_stage12(setup: CommunicationSetup, stage: Stage, knobs: Knobs) -> EngineTraffic:
    t = setup.training
    n = t.dp
    psi = t.params_per_device
    params, exact = param_list(t)
    pb = PRECISION_BYTES[t.precision].parameter
    cb = knobs.communication_bytes or pb  # engine.py communication_data_type: model dtype
    dp_group = setup.topology.dp_group()
    k = micro_steps(setup)
    # engine.py allreduce_gradients: stage 2 reduces on every micro-step, stage 1 only at the
    # accumulation boundary (optimizer.reduce_gradients).
    reductions = k if stage is Stage.GRADIENTS else 1
    numels = param_numels(params)
    order = numels if stage is Stage.OPTIMIZER else numels[::-1]
    buckets = ipg_buckets(order, knobs.reduce_bucket_size, whole_run=not exact)
    out: list[Collective] = []
    grad_bytes = cb * psi
    if knobs.reduce_scatter and not knobs.use_multi_rank_bucket_allreduce:
        # average_tensor: one dist.reduce per destination partition touched by each bucket.
        psi12 = padded(psi, 2 * n)
        calls = sum(
            _partitions_touched(start, size, psi12 // n)
            for start, size in _bucket_spans(order, buckets)
        )
        out.append(
            Collective(
                Op.REDUCE,
                Phase.BACKWARD,
                reductions * calls,
                reductions * grad_bytes,
                dtype_name(cb, t.precision),
                dp_group,
                "gradient buckets, one reduce per owning rank",
            )
        )
    else:
        # reduce_scatter=True + use_multi_rank_bucket_allreduce=True: allreduce_bucket (all_reduce)
        # of the flattened bucket; reduce_scatter=False: gradient_reduction_w_predivide, in place.
        out.append(
            Collective(
                Op.ALL_REDUCE,
                Phase.BACKWARD,
                reductions * len(buckets),
                reductions * grad_bytes,
                dtype_name(cb, t.precision),
                dp_group,
                "gradient buckets",
            )
        )
    # step(): utils.py all_gather_dp_groups -> all_gather_into_tensor of the flat 16-bit buffer,
    # padded to a multiple of 2N (nccl_start_alignment_factor = 2); skipped when N = 1.
    if n > 1:
        out.append(
            Collective(
                Op.ALL_GATHER,
                Phase.STEP,
                1,
                pb * padded(psi, 2 * n),
                dtype_name(pb, t.precision),
                dp_group,
                "updated parameter partitions (flat buffer)",
            )
        )
    notes = [
        "allgather_bucket_size is not used: DeepSpeed calls all_gather_into_tensor once per "
        "parameter group whenever torch has it (runtime/utils.py all_gather_dp_groups)",
    ]
    if stage is Stage.GRADIENTS and k > 1:
        notes.append(
            "stage 2 reduces gradients on every micro-step (engine.py: 'ZeRO stage >= 2 "
            "communicates during non gradient accumulation boundaries as well')"
        )
    return EngineTraffic(tuple(out), notes=tuple(notes))


def _bucket_spans(order: Sequence[int], buckets: Sequence[int]) -> list[tuple[int, int]]:
    """(start, size) in flat-buffer element offsets, approximating each bucket as contiguous."""
    total = sum(order)
    spans = []
    pos = 0
    for size in buckets:
        spans.append((pos, size))
        pos += size
    return [(min(s, total), z) for s, z in spans]


def _partitions_touched(start: int, size: int, part: int) -> int:
    return (start + size - 1) // part - start // part + 1 if size else 0


# CUDAQuantizer.target_group_size (zero/partition_parameters.py): one fp32 scale per group of at
# most ~8000 int8 weights; we count ceil(numel / 8000) scales (a lower bound: the search may
# pick groups down to half that size).
QWZ_GROUP = 8000


def _ds_stage3(
    setup: CommunicationSetup, knobs: Knobs, plan: Stage3Plan, exact: bool
) -> EngineTraffic:
    t = setup.training
    n = t.dp
    pb = PRECISION_BYTES[t.precision].parameter
    cb = knobs.communication_bytes or pb
    topo = setup.topology
    dp_group = topo.dp_group()
    k = micro_steps(setup)
    out: list[Collective] = []
    notes: list[str] = [
        f"steady state (trace complete), simulated partitioned_param_coordinator: {plan.kept} of "
        f"{plan.params} parameters ({plan.persistent} persistent) are still gathered when "
        "forward ends (a prefetch recorded their backward use); the first step records the "
        "trace, releases everything and re-gathers all of it in backward",
        "calls: one all-gather per module fetch and one per prefetch that finds parameters to "
        "gather (all_gather_coalesced), as the simulation issues them",
    ]
    if not exact:
        notes.append(
            "approximate: with tp/pp > 1 (or a count below the smallest implied decoder) the "
            "coordinator sees Ψ per device as one tensor, which is never re-gathered in "
            "backward; a real model larger than stage3_max_live_parameters re-gathers what "
            "the prefetcher cannot reach, so give model.architecture"
        )
    if knobs.hpz > 1 and n % knobs.hpz:  # zero_hpz_partition_size 0 and 1 both mean off
        raise InputError(
            "engine_config.zero_optimization.zero_hpz_partition_size", f"must divide dp = {n}"
        )
    gather_b, gather_dt = pb, dtype_name(pb, t.precision)
    if knobs.qwz:
        gather_b, gather_dt = 1, "int8"  # partition_parameters.py CUDAQuantizer, 8 bits

    def gathers(phase: Phase, elements: int, calls: int, group: Group, what: str) -> None:
        if not elements:
            return
        out.append(
            Collective(
                Op.ALL_GATHER, phase, k * calls, k * gather_b * elements, gather_dt, group, what
            )
        )
        if knobs.qwz:
            scales = FP32_BYTES * ceil_div(elements, QWZ_GROUP)
            out.append(
                Collective(
                    Op.ALL_GATHER,
                    phase,
                    k * calls,
                    k * scales,
                    "fp32",
                    group,
                    "qwZ quantization scales",
                )
            )

    gathers(
        Phase.FORWARD,
        plan.forward_padded,
        plan.forward_calls,
        dp_group,
        "parameters (non-persistent)",
    )
    bwd_group = dp_group if knobs.hpz <= 1 else topo.dp_group(knobs.hpz)
    gathers(
        Phase.BACKWARD,
        plan.backward_padded,
        plan.backward_calls,
        bwd_group,
        "parameters the coordinator released in forward"
        + (" (hpZ secondary partition)" if knobs.hpz > 1 else ""),
    )
    if knobs.qgz and topo.dp_group().nodes > 1:
        # coalesced_collectives.py all_to_all_quant_reduce: int4 all-to-all within the node,
        # quantized reduction, int4 all-to-all across nodes on 1/local_world_size of it.
        local = topo.dp_group(min(dp_group.per_node, n))
        across = topo.dp_group(dp_group.nodes, local.size)
        out.append(
            Collective(
                Op.ALL_TO_ALL,
                Phase.BACKWARD,
                k * plan.reduce_buckets,
                k * ceil_div(plan.reduce_plain, 2),
                "int4",
                local,
                "gradients (qgZ, in node)",
            )
        )
        out.append(
            Collective(
                Op.ALL_TO_ALL,
                Phase.BACKWARD,
                k * plan.reduce_buckets,
                k * ceil_div(plan.reduce_plain, 2 * local.size),
                "int4",
                across,
                "gradients (qgZ, across nodes)",
            )
        )
        notes.append(
            "qgZ: 1-D tensors and tensors whose numel does not divide by 2 × world "
            "fall back to reduce-scatter; scales are not counted"
        )
    elif knobs.reduce_scatter:
        # stage3.py __avg_scatter_grads -> reduce_scatter_coalesced: padded, interleaved flat
        # buffer, one reduce_scatter_tensor per IPG bucket.
        out.append(
            Collective(
                Op.REDUCE_SCATTER,
                Phase.BACKWARD,
                k * plan.reduce_buckets,
                k * cb * plan.reduce_padded,
                dtype_name(cb, t.precision),
                dp_group,
                "gradient buckets (padded per parameter)",
            )
        )
    else:
        # __avg_scatter_contiguous_grads: all-reduce of the contiguous bucket.
        out.append(
            Collective(
                Op.ALL_REDUCE,
                Phase.BACKWARD,
                k * plan.reduce_buckets,
                k * cb * plan.reduce_plain,
                dtype_name(cb, t.precision),
                dp_group,
                "gradient buckets",
            )
        )
    if plan.persistent_padded:
        # one all_gather_into_tensor per persistent parameter (_allgather_params_coalesced)
        out.append(
            Collective(
                Op.ALL_GATHER,
                Phase.STEP,
                plan.persistent,
                pb * plan.persistent_padded,
                dtype_name(pb, t.precision),
                dp_group,
                f"{plan.persistent} persistent parameters (stage3.py _post_step)",
            )
        )
    return EngineTraffic(tuple(out), notes=tuple(notes))


def _ds_offload(
    setup: CommunicationSetup, stage: Stage, plan_fwd_bwd: tuple[int, int] | None
) -> tuple[Transfer, ...]:
    """PCIe traffic of DeepSpeed offload per step (docs/engines/deepspeed.md §4.6, §5.7, §5.8).

    Stage 1/2 with optimizer offload: each rank's fp32 gradient partition down
    (async_inplace_copy_grad_to_fp32_buffer_from_gpu), its 16-bit updated partition up.
    Stage 3 with optimizer offload: the 16-bit gradient partition down and back up in
    partition_grads, the fp32 gradient down at the boundary, the 16-bit partition up after the
    CPU step. Parameter offload: every gather first copies the partition up.
    """
    t = setup.training
    n = t.dp
    psi = t.params_per_device
    pb = PRECISION_BYTES[t.precision].parameter
    k = micro_steps(setup)
    out: list[Transfer] = []
    if t.offload.optimizer is not OffloadDevice.NONE:
        if stage < Stage.PARAMETERS:
            part = padded(psi, 2 * n) // n
            if k > 1:
                # copy_grads_in_partition -> async_accumulate_grad_in_cpu_via_gpu whenever
                # micro_step_id > 0 or not at the boundary: the CPU copy comes up to be added to
                # (micro_step_id > 0) and goes back down. Stage 2 reduces every micro-step,
                # stage 1 once, at micro-step k - 1. Whole in-partition parameters move; we
                # count the partition.
                downs, ups = (k, k - 1) if stage is Stage.GRADIENTS else (1, 1)
                out.append(
                    Transfer(
                        "d2h",
                        Phase.BACKWARD,
                        downs * pb * part,
                        "16-bit gradient accumulation copy (accumulated_grads_in_cpu)",
                    )
                )
                out.append(
                    Transfer(
                        "h2d",
                        Phase.BACKWARD,
                        ups * pb * part,
                        "16-bit gradient accumulation copy back",
                    )
                )
            out.append(
                Transfer("d2h", Phase.BACKWARD, FP32_BYTES * part, "fp32 gradient partition")
            )
            out.append(Transfer("h2d", Phase.STEP, pb * part, "updated 16-bit partition"))
        else:
            part = ceil_div(psi, n)
            out.append(Transfer("d2h", Phase.BACKWARD, k * pb * part, "16-bit gradient partition"))
            out.append(
                Transfer(
                    "h2d",
                    Phase.BACKWARD,
                    k * pb * part,
                    "16-bit gradient partition back (partition_grads)",
                )
            )
            out.append(Transfer("d2h", Phase.STEP, FP32_BYTES * part, "fp32 gradient partition"))
            out.append(Transfer("h2d", Phase.STEP, pb * part, "updated 16-bit partition"))
    if t.offload.params is not OffloadDevice.NONE and stage is Stage.PARAMETERS and plan_fwd_bwd:
        fwd, bwd = plan_fwd_bwd
        out.append(Transfer("h2d", Phase.FORWARD, k * pb * fwd // n, "parameter partitions"))
        if bwd:
            out.append(Transfer("h2d", Phase.BACKWARD, k * pb * bwd // n, "parameter partitions"))
    return tuple(out)


def traffic(setup: CommunicationSetup, stage: Stage) -> EngineTraffic:
    """The collectives and offload transfers of one optimizer step under ``stage``."""
    t = setup.training
    if setup.shard_group_size is not None and setup.shard_group_size != t.dp:
        raise InputError(
            "shard_group_size",
            "DeepSpeed 0.19.8 removed MiCS sharding (runtime/config.py); use engine "
            "paper or torch (HSDP) for shard groups",
        )
    knobs = deepspeed_knobs(t.engine_config, setup.zeropp)
    knobs = knobs_with(
        knobs,
        leaves=leaf_layers(t.architecture, knobs),
        steps=model_steps(t.architecture),
        recompute=setup.recomputes_layers,
    )
    extra_notes: tuple[str, ...] = (
        ("ZeRO++ (qwZ/hpZ/qgZ) acts on stage 3 only; ignored here",)
        if (knobs.qwz or knobs.qgz or knobs.hpz > 1) and stage < Stage.PARAMETERS
        else ()
    )
    implied = implied_note(t.params) if t.architecture is None and t.tp * t.pp == 1 else None
    if implied is not None:
        extra_notes += (implied,)
    if stage is Stage.NONE:
        pb = PRECISION_BYTES[t.precision].parameter
        cb = knobs.communication_bytes or pb
        params, exact = param_list(t)
        numels = param_numels(params)
        # engine.py allreduce_gradients -> buffered_allreduce_fallback, at the accumulation
        # boundary only.
        buckets = fallback_buckets(numels, MEMORY_OPT_ALLREDUCE_SIZE, whole_run=not exact)
        c = Collective(
            Op.ALL_REDUCE,
            Phase.BACKWARD,
            len(buckets),
            cb * t.params_per_device,
            dtype_name(cb, t.precision),
            setup.topology.dp_group(),
            "gradient buckets",
        )
        return EngineTraffic((c,), notes=extra_notes)
    if stage < Stage.PARAMETERS:
        sent = _ds_stage12(setup, stage, knobs)
        return EngineTraffic(
            sent.collectives, _ds_offload(setup, stage, None), sent.notes + extra_notes
        )
    params, exact = param_list(t)
    plan = stage3_plan(params, t.dp, knobs, exact=exact)
    sent = _ds_stage3(setup, knobs, plan, exact)
    transfers = _ds_offload(setup, stage, (plan.forward_padded, plan.backward_padded))
    return EngineTraffic(sent.collectives, transfers, sent.notes + extra_notes)
