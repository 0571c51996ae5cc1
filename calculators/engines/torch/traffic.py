"""What PyTorch's engines send per optimizer step: DDP (stage 0), DDP + ZeroRedundancyOptimizer
(stage 1), FSDP2 ``fully_shard`` with ``reshard_after_forward=False`` (stage 2) and ``True``
(stage 3), modelled from torch's source (torch/csrc/distributed/c10d/reducer.cpp,
torch/distributed/optim/zero_redundancy_optimizer.py, torch/distributed/fsdp/_fully_shard)."""

from __future__ import annotations

from collections.abc import Sequence

from calculators.conventions import FP32_BYTES, HALF_BYTES, PRECISION_BYTES, OffloadDevice, Stage
from calculators.engines.torch.config import check_offload, reduce_bytes
from calculators.errors import InputError
from calculators.model_states import ceil_div
from calculators.parameters import ParamList, ParamTensor, fsdp_padded_total, implied_note
from calculators.topology import Op
from calculators.traffic import (
    Collective,
    CommunicationSetup,
    EngineTraffic,
    Phase,
    Transfer,
    dtype_name,
    elements,
    micro_steps,
    padded,
    params_of,
    process_groups,
    reductions,
)

TRAFFIC_CONVENTION = (
    "torch: PyTorch engines — stage 0 DDP bucketed all-reduce (1 MiB first bucket, 25 MiB "
    "after); stage 1 DDP all-reduce + ZeroRedundancyOptimizer broadcast of every parameter "
    "from its owner after step(); stage 2 FSDP2 reshard_after_forward=False (all-gather "
    "forward, reduce-scatter); stage 3 FSDP2 reshard_after_forward=True (all-gather forward "
    "and backward, reduce-scatter), dim 0 padded to a multiple of N; mixed precision = "
    "fp32 parameters with autocast for DDP, MixedPrecisionPolicy(param_dtype=16-bit, "
    "reduce_dtype=fp32, or the param dtype where engine_config says so) for FSDP2."
)

# torch/csrc/distributed/c10d/reducer.hpp: kDefaultFirstBucketBytes = 1 MiB,
# kDefaultBucketBytesCap = 25 MiB (DDP bucket_cap_mb=25).
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
DDP_BUCKET_BYTES = 25 * 1024 * 1024


def ddp_buckets(numels: Sequence[int], elem: int, *, whole_run: bool) -> int:
    """Number of DDP buckets: parameters in reverse order, a bucket closes once its bytes reach
    the limit, 1 MiB for the first and 25 MiB after (reducer.cpp
    compute_bucket_assignment_by_size)."""
    if whole_run:
        (psi,) = numels
        total = psi * elem
        if total <= DDP_FIRST_BUCKET_BYTES:
            return 1
        return 1 + ceil_div(total - DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES)
    count = 0
    current = 0
    limit = DDP_FIRST_BUCKET_BYTES
    for n in reversed(numels):
        current += n * elem
        if current >= limit:
            count += 1
            current = 0
            limit = DDP_BUCKET_BYTES
    return count + (1 if current else 0)


def _fsdp_padded(params: Sequence[ParamTensor] | None, psi: int, n: int) -> int:
    """Elements FSDP2 moves: each parameter's dim 0 padded to a multiple of N
    (_fsdp_common.py _get_dim0_padded_size, _fsdp_param.py padded_sharded_param_size)."""
    if params is None:
        return padded(psi, n)
    return fsdp_padded_total(params, n)


def _root_params(params: Sequence[ParamTensor]) -> list[ParamTensor]:
    """Parameters of the root FSDP group: everything outside the blocks (each occurs once, so
    a :class:`ParamList`'s template holds them all)."""
    listed = params.template.tensors if isinstance(params, ParamList) else params
    return [p for p in listed if not p.module.startswith("blocks.")]


def _fsdp_groups(params: Sequence[ParamTensor] | None) -> int:
    """FSDP groups: one per transformer block plus the root (embeddings, final norm, head)."""
    if params is None:
        return 1
    if isinstance(params, ParamList):
        return sum(kind.blocks for kind in params.template.kinds) + 1
    blocks = {p.module.split(".")[1] for p in params if p.module.startswith("blocks.")}
    return len(blocks) + 1


def traffic(setup: CommunicationSetup, stage: Stage) -> EngineTraffic:
    """The collectives and offload transfers of one optimizer step under ``stage``."""
    check_offload(setup.training.offload, stage)
    t = setup.training
    if setup.zeropp.any:
        raise InputError("zeropp", "ZeRO++ is a DeepSpeed feature; use engine deepspeed or paper")
    psi = t.params_per_device
    params = params_of(t)
    n = t.dp
    dp_group, shard, replica = process_groups(setup)
    k, r = micro_steps(setup), reductions(setup)
    # Mixed precision: DDP and ZeroRedundancyOptimizer keep fp32 parameters under autocast;
    # FSDP2 MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32 or the param dtype).
    if t.precision.is_mixed:
        ddp_b, gather_b = FP32_BYTES, HALF_BYTES
    else:
        ddp_b = gather_b = PRECISION_BYTES[t.precision].parameter
    reduce_b = reduce_bytes(t.engine_config or {}, t.precision)
    numels = elements(params, psi)
    out: list[Collective] = []
    implied = implied_note(t.params) if t.architecture is None and params is not None else None
    notes: list[str] = [implied] if implied is not None else []
    if stage < Stage.GRADIENTS:
        if setup.shard_group_size not in (None, n):
            raise InputError(
                "shard_group_size",
                "shard groups apply to FSDP2 (stages 2 and 3) under engine torch",
            )
        buckets = ddp_buckets(numels, ddp_b, whole_run=params is None)
        out.append(
            Collective(
                Op.ALL_REDUCE,
                Phase.BACKWARD,
                r * buckets,
                r * ddp_b * psi,
                dtype_name(ddp_b, t.precision),
                dp_group,
                "DDP gradient buckets",
            )
        )
        if stage is Stage.OPTIMIZER and n > 1:
            # zero_redundancy_optimizer.py _sync_params: for every rank, dist.broadcast of each
            # parameter it owns (parameters_as_bucket_view=False).
            calls = len(numels) if params is not None else n
            out.append(
                Collective(
                    Op.BROADCAST,
                    Phase.STEP,
                    calls,
                    ddp_b * psi,
                    dtype_name(ddp_b, t.precision),
                    dp_group,
                    "updated parameters from their owners",
                )
            )
            notes.append(
                "ZeroRedundancyOptimizer broadcasts each parameter from its owner: "
                "the owner sends all of it, the ring's last rank none; "
                "sent_bytes_per_rank is the mean, (N−1)/N of the payload"
            )
            if params is None:
                notes.append(
                    "broadcast calls: one per parameter tensor; without the tensors N is listed"
                )
        return EngineTraffic(tuple(out), notes=tuple(notes))
    elems = _fsdp_padded(params, psi, shard.size)
    groups = _fsdp_groups(params)
    out.append(
        Collective(
            Op.ALL_GATHER,
            Phase.FORWARD,
            k * groups,
            k * gather_b * elems,
            dtype_name(gather_b, t.precision),
            shard,
            "parameters",
        )
    )
    if stage is Stage.PARAMETERS:
        # An explicit reshard_after_forward=True reshards the root too (_fsdp_state.py keeps the
        # root unsharded only when the flag was defaulted); engine_config
        # {"fsdp_root_reshard_after_forward": false} models a root left unsharded.
        root_reshards = (t.engine_config or {}).get("fsdp_root_reshard_after_forward", True)
        if not isinstance(root_reshards, bool):
            raise InputError(
                "engine_config.fsdp_root_reshard_after_forward", "must be true or false"
            )
        again, again_groups = elems, groups
        if not root_reshards:
            again -= _fsdp_padded(_root_params(params), 0, shard.size) if params else elems
            again_groups -= 1
        if again:
            out.append(
                Collective(
                    Op.ALL_GATHER,
                    Phase.BACKWARD,
                    k * again_groups,
                    k * gather_b * again,
                    dtype_name(gather_b, t.precision),
                    shard,
                    "parameters (reshard_after_forward=True"
                    + (", root included)" if root_reshards else ", root kept)"),
                )
            )
    out.append(
        Collective(
            Op.REDUCE_SCATTER,
            Phase.BACKWARD,
            r * groups,
            r * reduce_b * elems,
            dtype_name(reduce_b, t.precision),
            shard,
            "gradients",
        )
    )
    if replica.size > 1:
        # _fsdp_collectives.py foreach_reduce: HSDP all-reduces the reduce-scatter output
        # across the replicate dimension.
        out.append(
            Collective(
                Op.ALL_REDUCE,
                Phase.BACKWARD,
                r * groups,
                r * reduce_b * elems // shard.size,
                dtype_name(reduce_b, t.precision),
                replica,
                "gradient shard across replicas (HSDP)",
            )
        )
    if params is None:
        notes.append(
            "FSDP2 calls: one per fully_shard group; with tp/pp > 1 (or a count below the "
            "smallest implied decoder) 1 is listed and padding is per Ψ, not per parameter"
        )
    else:
        notes.append(f"FSDP2 groups: {groups} (one per block + root)")
    notes.append(
        "forward all-gathers repeat on every micro-step (parameters are resharded "
        "after backward by default)"
    )
    if k > 1 and r == 1:
        notes.append(
            "gradients reduced once per step (set_requires_gradient_sync(False) on the other "
            "micro-steps): FSDP2 then keeps every parameter's unsharded gradient in fp32 between "
            "micro-steps (_fsdp_param.py unsharded_accumulated_grad, 4 bytes per parameter); "
            "the memory figures count a reduce-scatter on every micro-step"
        )
    transfers: list[Transfer] = []
    if t.offload.params is not OffloadDevice.NONE:
        # CPUOffloadPolicy: sharded fp32 parameters copied up for each all-gather, reduced
        # gradient shards copied down.
        shard_param_b = FP32_BYTES if t.precision.is_mixed else gather_b
        gathers = k * (2 if stage is Stage.PARAMETERS else 1)
        transfers.append(
            Transfer(
                "h2d",
                Phase.FORWARD,
                gathers * shard_param_b * elems // shard.size,
                "sharded parameters (CPUOffloadPolicy)",
            )
        )
        transfers.append(
            Transfer(
                "d2h", Phase.BACKWARD, r * reduce_b * elems // shard.size, "reduced gradient shards"
            )
        )
    return EngineTraffic(tuple(out), tuple(transfers), tuple(notes))
