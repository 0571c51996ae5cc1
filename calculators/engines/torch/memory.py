"""PyTorch's own engines, modelled from torch's source (2.11-2.13), rank 0's view.

- Stage 0: ``DistributedDataParallel`` (torch/nn/parallel/distributed.py) over fp32 parameters
  with autocast. ``gradient_as_bucket_view=False`` by default, so the Reducer keeps one flat
  gradient bucket per bucket group for the whole run (reducer.cpp ``initialize_buckets``:
  ``bucket.gradients = at::empty({total numel})``), besides each ``param.grad`` that backward
  fills and ``zero_grad(set_to_none=True)`` frees. Bucket bytes = Σ numel × grad dtype.
- Stage 1: the same plus ``torch.distributed.optim.ZeroRedundancyOptimizer``: parameters sorted
  by numel, largest first (a stable sort), each given to the rank with the smallest total so far
  (``_partition_parameters``); only the local optimizer's states of rank 0 are held. After the
  local step each rank ``broadcast``s its parameters (``_sync_params``).
- Stages 2 and 3: FSDP2 ``fully_shard`` on every block, then the root
  (torch/distributed/fsdp/_fully_shard). Each parameter is chunked on dim 0 into
  ``ceil(dim0 / N)`` rows; every rank allocates that padded chunk (``_fsdp_param.py``:
  ``padded_sharded_size = chunks[0].size()``), rank 0's chunk is full, so its gradient (a view
  of the reduce-scatter output, ``_fsdp_collectives.foreach_reduce``) and Adam states
  (``zeros_like`` of the local shard) are padded-sized too. ``MixedPrecisionPolicy(param_dtype,
  reduce_dtype=fp32)``: all-gather in the 16-bit dtype, reduce-scatter in fp32; with
  ``reduce_dtype`` the param dtype (``engine_config["reduce_dtype"]``) the reduce-scatter input
  and output are 16-bit, and the output is cast to an fp32 shard
  (``_to_dtype_if_needed(reduce_output, orig_dtype)``) before the 16-bit one is freed.

``CPUOffloadPolicy`` (``offload.params`` cpu, stages 2 and 3): the padded shards are copied to
pinned host memory when ``fully_shard`` shards them, so the optimizer built on them keeps its
states there and steps there, and each reduced gradient shard is copied down as
``foreach_reduce`` makes it. None of the model states stays on the device; a step adds the
shards copied up and cast for each all-gather (``FSDPParam.all_gather_inputs``).

``resident`` is what stays allocated between steps after ``zero_grad(set_to_none=True)``.
Adam's ``step`` counters live on the CPU unless ``capturable``/``fused`` (torch/optim/adam.py),
so they are not device bytes. Runtime allocations outside the engine (the cuBLAS workspace, the
CUDA context, NCCL buffers) are not part of these figures.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from calculators.activations import INDEX_BYTES, Regime
from calculators.architecture import tensor_counts
from calculators.caching_allocator import ACTIVATION_BLOCKS_NOTE
from calculators.conventions import (
    FP32_BYTES,
    HALF_BYTES,
    Optimizer,
    Precision,
    Stage,
)
from calculators.engines.torch.allocator import (
    MAX_REPLAYED_TENSORS,
    SHARD_BLOCKS,
    STATE_BLOCKS,
    Build,
    Excess,
    block_excess,
    rounding_only,
)
from calculators.engines.torch.config import check_offload, offloads, reduce_bytes
from calculators.engines.torch.peak import (
    DdpBackwardGrads,
    FsdpBackward,
    FsdpBlock,
    StepMemory,
    converts_outputs,
    step_memory,
)
from calculators.errors import InputError
from calculators.estimates import StageEstimate
from calculators.model_states import Placement, TrainingSetup, ceil_div
from calculators.parameters import (
    ROOT_GROUP,
    ParamList,
    ParamTensor,
    fsdp_shard_total,
    implied_note,
    param_numels,
    shape_counts,
)
from calculators.traffic import params_of

CONVENTION = (
    "torch: what PyTorch's engines allocate on rank 0 (stage 0 DDP, stage 1 DDP + "
    "ZeroRedundancyOptimizer, stage 2/3 FSDP2 fully_shard reshard_after_forward False/True), "
    "fp32 parameters with bf16/fp16 compute in mixed precision (4 + 4 + 8 B/param with Adam: "
    "fp32 parameters, fp32 gradients, two fp32 states; no separate master copy); resident = "
    "torch.cuda.memory_allocated between steps after zero_grad(set_to_none=True), peak = "
    "max_memory_allocated within a step; with an architecture and a batch both include "
    "activations, the cuBLAS workspaces, the batch and the loop's last logits and loss, "
    "otherwise model states only"
)

# torch.optim: Adam/AdamW keep exp_avg and exp_avg_sq, SGD with momentum one momentum_buffer,
# all ``zeros_like(param)`` (same dtype and shape as the local parameter).
STATE_TENSORS: dict[Optimizer, int] = {
    Optimizer.ADAM: 2,
    Optimizer.ADAMW: 2,
    Optimizer.SGD_MOMENTUM: 1,
    Optimizer.SGD: 0,
}


@dataclass(frozen=True)
class Dtypes:
    """Element bytes of each copy under one precision."""

    parameter: int
    """The optimizer's parameter (fp32 in mixed precision: autocast / MixedPrecisionPolicy)."""
    gradient: int
    """The gradient the optimizer reads (DDP buckets, FSDP2 reduce_dtype)."""
    compute: int
    """The copy forward runs on (FSDP2 all-gather dtype)."""
    reduce: int
    """FSDP2's reduce-scatter buffers (its ``reduce_dtype``)."""


def dtypes(precision: Precision, reduce: int | None = None) -> Dtypes:
    """Element bytes under ``precision``; ``reduce``: FSDP2's reduce-scatter element bytes
    (``calculators.engines.torch.config.reduce_bytes``; default: the gradients')."""
    if precision is Precision.FP32:
        return Dtypes(FP32_BYTES, FP32_BYTES, FP32_BYTES, reduce or FP32_BYTES)
    if precision is Precision.BF16:  # parameters cast to bf16, no policy: everything 16-bit
        return Dtypes(HALF_BYTES, HALF_BYTES, HALF_BYTES, reduce or HALF_BYTES)
    # mixed: fp32 params, autocast (DDP) or MixedPrecisionPolicy(param_dtype=16-bit,
    # reduce_dtype=fp32 or 16-bit) (FSDP2); DDP grads are in the parameter dtype (fp32)
    return Dtypes(FP32_BYTES, FP32_BYTES, HALF_BYTES, reduce or FP32_BYTES)


def _short_dim0(setup: TrainingSetup) -> str | None:
    """A note where some tensor has fewer dim-0 rows than ranks (3-D expert tensors of a MoE
    model): FSDP2 gives every rank one padded row, so those tensors gather and reduce N rows."""
    ts = param_tensors(setup)
    if ts is None:
        return None
    short = {s: n for s, n in shape_counts(ts).items() if len(s) >= 2 and s[0] < setup.dp}
    if not short:
        return None
    shape = max(short, key=math.prod)
    # named as its first copy is (a ParamList's template holds one copy of each shape)
    named = ts.template.tensors if isinstance(ts, ParamList) else ts
    worst = next(t for t in named if t.shape == shape)
    rows = shape[0]
    return (
        f"{sum(short.values())} tensors have fewer rows on dim 0 than the {setup.dp} ranks (e.g. "
        f"{worst.name}, {rows} rows): FSDP2 pads each rank's shard to one row, so they are "
        f"gathered and reduced as {setup.dp} rows, {setup.dp / rows:.3g}× their size, and "
        "counted so here; sharding them on another dim (fully_shard's shard_placement_fn) "
        "avoids it and is not modelled"
    )


def param_tensors(setup: TrainingSetup) -> Sequence[ParamTensor] | None:
    """The tensor list: ``engine_config["tensors"]``, the architecture's, or for a bare count
    the implied decoder's (``calculators.traffic.params_of``)."""
    return params_of(setup)


def _greedy(numels: Sequence[int], world: int) -> Iterator[tuple[int, int]]:
    """(parameter, rank) in ZeroRedundancyOptimizer's assignment order.

    ``_partition_parameters``: ``sorted(params, key=numel, reverse=True)`` (stable), then each
    goes to ``_get_min_index(sizes)``, the first rank with the smallest total.
    """
    order = sorted(range(len(numels)), key=lambda i: numels[i], reverse=True)
    # (total, rank) pairs: the heap's top is the smallest total, ties to the lowest rank, as
    # _get_min_index picks it, in O(log N) rather than O(N) per parameter. Ranks are taken
    # lowest first among equal totals, so the ranks ever given a parameter are the first
    # len(numels) at most: the others never enter the heap.
    totals = [(0, rank) for rank in range(min(world, len(numels)))]
    for i in order:
        total, rank = heapq.heappop(totals)
        yield i, rank
        heapq.heappush(totals, (total + numels[i], rank))


def zero_partition(numels: Sequence[int], world: int) -> list[list[int]]:
    """Indices each rank owns under ZeroRedundancyOptimizer's greedy partition (``_greedy``)."""
    owned: list[list[int]] = [[] for _ in range(world)]
    for i, rank in _greedy(numels, world):
        owned[rank].append(i)
    return owned


def rank0_partition(numels: Sequence[int], world: int) -> list[int]:
    """``zero_partition(numels, world)[0]`` without a list per rank (Nd runs to 2**20), and
    without a heap step per parameter where a run of equal sizes deals whole rounds.

    Within a run of ``k`` parameters of one size ``s`` (adjacent in the sorted order), while the
    ranks' totals differ by less than ``s``, each rank given one goes behind all the others: the
    next ``W`` (the ranks in play) go one to each rank in the order of ``(total, rank)``, and
    every total grows by ``s``, keeping that order. Such rounds are dealt at once (rank 0 takes
    the same place in each); the rest goes one by one as ``_greedy`` does (until the totals
    come that close).
    """
    order = sorted(range(len(numels)), key=numels.__getitem__, reverse=True)
    if world >= len(order):
        # a rank with nothing yet is always free: rank 0 takes the largest parameter, and the
        # rest too only where every size is 0 (its total then stays the least)
        return order if not order or numels[order[0]] == 0 else order[:1]
    if world == 1:
        return order
    ranks = world
    descending = [-numels[i] for i in order]  # ascending, for bisect
    # the first parameters of positive size go one to each rank with nothing yet, in rank order
    fresh = min(ranks, bisect_left(descending, 0))
    totals = [(-descending[r] if r < fresh else 0, r) for r in range(ranks)]  # a heap, as in
    heapq.heapify(totals)  # _greedy
    most = -descending[0] if fresh else 0  # the largest total
    owned: list[int] = order[:1] if fresh else []
    pos = fresh
    while pos < len(order):
        size = -descending[pos]
        end = bisect_right(descending, -size, pos)
        while pos < end:
            rounds = (end - pos) // ranks
            if rounds and most - totals[0][0] < size:
                place = sorted(totals).index(next(t for t in totals if t[1] == 0))
                owned.extend(order[pos + place : pos + rounds * ranks : ranks])
                totals = [(total + rounds * size, rank) for total, rank in totals]
                most += rounds * size
                pos += rounds * ranks
                continue
            total, rank = heapq.heappop(totals)
            if rank == 0:
                owned.append(order[pos])
            heapq.heappush(totals, (total + size, rank))
            most = max(most, total + size)
            pos += 1
    return owned


def _check(setup: TrainingSetup, stage: Stage) -> int:
    """State tensors per parameter; rejects what the torch engines here do not run."""
    if setup.k is not None:
        raise InputError("k", "the torch engine derives optimizer states from the optimizer")
    if setup.optimizer not in STATE_TENSORS:
        known = ", ".join(o.value for o in STATE_TENSORS)
        raise InputError("optimizer", f"the torch engine models {known}")
    check_offload(setup.offload, stage)
    for name in ("tp", "pp"):
        if getattr(setup, name) != 1:
            raise InputError(
                name, "the torch engine profile models data parallelism only (DDP, ZeRO, FSDP2)"
            )
    return STATE_TENSORS[setup.optimizer]


@dataclass(frozen=True)
class Shares:
    """Elements rank 0 holds of each model state."""

    params: int
    grads: int
    states: int
    exact: bool


def _shares(setup: TrainingSetup, stage: Stage) -> Shares:
    n = setup.dp
    ts = param_tensors(setup)
    numels = param_numels(ts) if ts is not None else None
    psi = sum(numels) if numels is not None else setup.params_per_device
    if stage <= Stage.OPTIMIZER:
        if stage is Stage.NONE:
            return Shares(psi, psi, psi, True)
        if numels is None:
            return Shares(psi, psi, ceil_div(psi, n), False)
        owned = rank0_partition(numels, n)
        return Shares(psi, psi, sum(numels[i] for i in owned), True)
    if ts is None:
        return Shares(ceil_div(psi, n), ceil_div(psi, n), ceil_div(psi, n), False)
    shard = fsdp_shard_total(ts, n)
    return Shares(shard, shard, shard, True)


def estimate(setup: TrainingSetup, stage: Stage) -> StageEstimate:
    """What rank 0 allocates under ``stage`` (module docstring)."""
    n_states = _check(setup, stage)
    offload = offloads(setup.offload)
    # an FSDP2 policy's reduce dtype; DDP reduces its buckets in the gradients' dtype
    reduce = None
    if stage >= Stage.GRADIENTS:
        reduce = reduce_bytes(setup.engine_config or {}, setup.precision)
    d = dtypes(setup.precision, reduce)
    share = _shares(setup, stage)
    params = share.params * d.parameter
    grads = share.grads * d.gradient
    states = share.states * n_states * d.parameter
    components: dict[str, int]
    if stage <= Stage.OPTIMIZER:
        # DDP Reducer buckets: persistent, full size, in the gradient dtype
        buckets = share.grads * d.gradient
        components = {"fp32_params" if d.parameter == FP32_BYTES else "params": params}
        components["ddp_buckets"] = buckets
        components["optimizer_states"] = states
        resident = params + buckets + states
        notes = [
            "DDP keeps its gradient buckets between steps (gradient_as_bucket_view=False); "
            "param.grad is freed by zero_grad(set_to_none=True)",
        ]
        if stage is Stage.OPTIMIZER:
            notes.append(
                "ZeroRedundancyOptimizer: rank 0's greedy partition (largest first)"
                + ("" if share.exact else ", taken as Ψ/N: no tensor shapes given")
            )
    elif offload:
        components = {}
        resident = 0
        notes = [
            "FSDP2 CPUOffloadPolicy: the sharded parameters (pinned), their gradients and the "
            "optimizer's states live in host memory and the optimizer steps there; the device "
            "holds what a step gathers and makes (each shard copied up and cast for its "
            "all-gather, each reduced gradient shard copied down as it is made)"
            + ("" if share.exact else "; padding ignored: no tensor shapes given"),
        ]
    else:
        components = {"sharded_params": params, "optimizer_states": states}
        resident = params + states
        notes = [
            "FSDP2 shards each parameter on dim 0 padded to a multiple of N; sharded "
            "gradients are freed by zero_grad(set_to_none=True)"
            + ("" if share.exact else "; padding ignored: no tensor shapes given"),
        ]
    if stage >= Stage.GRADIENTS:
        if d.reduce != d.gradient:
            notes.append(
                f"gradients reduce-scattered in {d.reduce * 8}-bit (reduce_dtype), each "
                "reduced shard cast to the fp32 gradient the optimizer reads"
            )
        excess, excess_note = (None, "") if offload else _allocator_blocks(setup, d, n_states)
        if excess is not None:
            components[SHARD_BLOCKS] = excess.shards
            components[STATE_BLOCKS] = excess.states
            resident += excess.shards + excess.states
            notes.append(excess_note)
        short = _short_dim0(setup)
        if short is not None:
            notes.append(short)
    bare = setup.architecture is None and "tensors" not in (setup.engine_config or {})
    implied = implied_note(setup.params) if bare and share.exact else None
    if implied is not None:
        notes.append(implied)
    if not share.exact:
        notes.append("approximate: give an architecture for the exact per-tensor split")
    device = Placement(parameters=params, gradients=grads, optimizer_states=states)
    cpu = Placement()
    if offload:
        device, cpu = Placement(), device
    step = _step(setup, stage, share, d, n_states)
    if step is None:
        return StageEstimate(
            stage=stage,
            device=device,
            cpu=cpu,
            nvme=Placement(),
            resident=resident,
            components=components,
            notes=tuple(notes),
        )
    memory, runtime = step
    components["model_states_resident"] = resident
    components["runtime_workspaces"] = memory.workspaces
    components["batch"] = runtime
    components["held_outputs"] = memory.held_outputs
    components.update({f"peak_candidate_{k}": v for k, v in memory.moments.items()})
    base = resident + memory.workspaces + runtime
    # allocated at the moments measure/ probes: forward done; backward done (the loop now
    # holds this step's outputs); optimizer step done (nothing new: states exist already)
    components["after_forward"] = base + memory.end_of_forward
    components["after_backward"] = base + memory.held_outputs + memory.step_gradients
    components["after_step"] = components["after_backward"]
    held = (
        "the last logits and loss, as memory_allocated does"
        if not setup.precision.is_mixed
        else "the last logits and loss, as memory_allocated does; the logits as forward returns "
        + (
            "them under accelerate (convert_outputs_to_fp32: an fp32 copy)"
            if converts_outputs(setup.engine_config or {})
            else "them in a plain loop (16-bit; under accelerate or transformers' Trainer, "
            "convert_outputs_to_fp32: true counts its fp32 copy)"
        )
    )
    notes.append(
        f"peak at {memory.peak_moment}; resident and peak count the cuBLAS workspaces, the "
        f"batch and (holds_outputs) {held}"
    )
    notes.append(ACTIVATION_BLOCKS_NOTE)
    return StageEstimate(
        stage=stage,
        device=device,
        cpu=cpu,
        nvme=Placement(),
        resident=base + memory.held_outputs,
        activations=memory.activations,
        temporary_buffers=memory.above_states - memory.activations
        if memory.peak_moment != "optimizer_step"
        else memory.above_states,
        peak=base + memory.above_states,
        components=components,
        notes=tuple(notes),
        cpu_activations=memory.offloaded,
    )


def _allocator_blocks(setup: TrainingSetup, d: Dtypes, n_states: int) -> tuple[Excess | None, str]:
    """The bytes the caching allocator hands the shards and the optimizer states beyond their
    requests, and a note (``calculators.engines.torch.allocator``); ``None`` without the
    tensors."""
    ts = param_tensors(setup)
    cached = (setup.engine_config or {}).get("caching_allocator", True)
    if not isinstance(cached, bool):
        raise InputError("engine_config.caching_allocator", "must be true or false")
    if ts is None or not cached:  # false: memory counted as the tensors ask (the CPU)
        return None, ""
    arch = setup.architecture
    modelling = arch.modelling if arch is not None else None
    tied = modelling is not None and arch is not None and arch.tied_embeddings
    build = Build(
        element=d.parameter,
        cast=d.parameter != FP32_BYTES,
        tied_head=(arch.vocab_size, arch.hidden) if tied and arch is not None else None,
        out_proj_first=modelling is not None and modelling.out_proj_first,
        states=n_states,
    )
    excess = block_excess(ts, setup.dp, build)
    if excess is None:
        rounded = rounding_only(ts, setup.dp, d.parameter)
        return Excess(rounded, n_states * rounded), (
            "allocator_shard_blocks, allocator_state_blocks: the 512-byte rounding only: the "
            f"model has more than {MAX_REPLAYED_TENSORS:,} parameter tensors, so the cached "
            "blocks handed out whole (up to 1 MiB more each) are not replayed"
        )
    return excess, (
        "allocator_shard_blocks, allocator_state_blocks: what the caching allocator hands the "
        "shards and the optimizer states beyond their requests (512-byte rounding and cached "
        "blocks up to 1 MiB larger handed out whole), replayed for the model built on the "
        "device in fp32, sharded unit by unit, then its states created at the first step; the "
        "blocks forward and backward leave cached are not replayed, nor other ways of building: "
        "accelerate moves a model loaded on the CPU unit by unit, or with "
        "fsdp_cpu_ram_efficient_loading fills the shards of a model sharded on the meta device"
    )


def _step(
    setup: TrainingSetup, stage: Stage, share: Shares, d: Dtypes, n_states: int
) -> tuple[StepMemory, int] | None:
    """The step's moments when the architecture and batch are known (else no peak)."""
    arch, batch = setup.architecture, setup.batch
    if arch is None or batch is None or setup.tp != 1 or setup.pp != 1:
        return None
    config = setup.engine_config or {}
    offload = offloads(setup.offload)
    if setup.precision is Precision.FP32:
        regime = Regime.FP32
    elif setup.precision is Precision.BF16 or stage >= Stage.GRADIENTS:
        regime = Regime.HALF  # FSDP2 MixedPrecisionPolicy: bf16 parameters and activations
    else:
        regime = Regime.AUTOCAST  # DDP: fp32 parameters under torch.autocast
    unsharded = gathered_for_loss = root_copy_out = 0
    if stage is Stage.GRADIENTS:
        # reshard_after_forward=False: every unit stays gathered (N × padded shard) until its
        # backward ends (_fsdp_param_group.py post_forward).
        unsharded = setup.dp * share.params * d.compute
    elif stage is Stage.PARAMETERS:
        root, last_block = _root_and_last_block(setup, d.compute)
        if not config.get("fsdp_root_reshard_after_forward", True):
            unsharded = root
        if arch.modelling is not None:
            # transformers computes the loss inside the root module (``model(input_ids,
            # labels=...)``), so FSDP2's pre-backward hook sits on the loss itself
            # (_fsdp_state.py _register_pre_backward_hook on the root's outputs): before the
            # loss's own backward the root unit is gathered again and the default backward
            # prefetch gathers the last block (_fsdp_param_group.py pre_backward,
            # _backward_prefetch). Both stay alive through the loss gradients.
            # One rank alone gathers nothing: a prefetched block's unshard only records the
            # sharded data as its all-gather result, and its parameters are made when the
            # block's own pre-backward waits for it (_fsdp_param_group.py unshard and
            # wait_for_unshard, world_size == 1)
            prefetched = last_block if setup.dp > 1 else 0
            gathered_for_loss = (0 if unsharded else root) + prefetched
        if not unsharded:
            # the root's pre-backward copies its parameters out of the flat all-gather output
            # (wait_for_unshard, foreach_all_gather_copy_out): both alive together; one rank
            # alone copies its shards straight into the parameters' storage
            root_copy_out = 2 * root if setup.dp > 1 else root
            if offload and setup.dp > 1:
                # then it prefetches the last block: under CPUOffloadPolicy its shards are
                # copied up and cast (the all-gather inputs) before its flat output is made
                root_copy_out = max(root_copy_out, root + last_block + last_block // setup.dp)
    # DDP: each param.grad is its own tensor besides the bucket (gradient_as_bucket_view=False);
    # FSDP2: the sharded fp32 gradients (in host memory under CPUOffloadPolicy).
    step_grads = 0 if offload else share.grads * d.gradient
    root_reduction = 0
    fsdp_backward = None
    if stage >= Stage.GRADIENTS:
        # FSDP2 reduces the root unit last, from the final callback of backward (its inputs are
        # token ids, so no post-backward hook fires earlier): its unsharded 16-bit gradients
        # are alive while chunk_cat writes them into the reduce_dtype reduce-scatter input,
        # then freed before the (smaller) output is allocated (_fsdp_collectives.py
        # foreach_reduce: unsharded_grads.clear()), beside every block's reduced shard. With
        # gradient accumulation a later micro-batch also finds every shard of the earlier ones,
        # the root's own included (step_memory adds them as accumulated_gradients).
        ts = param_tensors(setup) or []
        root_tensors, _ = root_and_last_block(ts)
        root_shard = fsdp_shard_total(root_tensors, setup.dp)
        root_input = setup.dp * root_shard * d.reduce
        root_reduction = sum(t.numel for t in root_tensors) * d.compute + root_input
        if d.reduce != d.gradient:
            # after the copy-in the unsharded gradients are freed; the 16-bit output is cast
            # to the fp32 shard while both are alive
            root_reduction = max(root_reduction, root_input + root_shard * (d.reduce + d.gradient))
        if batch.grad_accumulation_steps == 1 and not offload:
            root_reduction += step_grads - root_shard * d.gradient
        fsdp_backward = _fsdp_backward(setup, stage, d, ts)
    last_gather = forward_gathered = in_last_block = first_gather = 0
    if stage >= Stage.GRADIENTS:
        root, block = _root_and_last_block(setup, d.compute)
        # every unit is resharded when backward ends, so forward gathers the root again, then
        # block 0: at block 0's copy-out the root's flat all-gather output is still kept (the
        # same rule as below), beside the root's parameters and block 0's flat output and
        # parameters (N × padded shard each)
        first = setup.dp * fsdp_shard_total(first_block(param_tensors(setup) or []), setup.dp)
        # (one rank alone makes no flat all-gather output: wait_for_unshard, world_size == 1)
        flat = 2 if setup.dp > 1 else 1
        first_gather = flat * (root + first * d.compute)
        # FSDP2 in forward keeps each all-gather's flat output (N × padded shard) until the
        # next unit's copy-out is done, and the last one until the root's post-forward
        # (_fsdp_param_group.py wait_for_unshard, _fsdp_state.py _post_forward): at the last
        # block's copy-out two flat outputs live beside the gathered parameters, and a loss
        # computed inside the root (transformers) still sees the last block's. With one block
        # the flat output kept beside the last block's is the root's.
        gathered = unsharded if stage is Stage.GRADIENTS else root + block
        previous = _before_last_block(setup, d.compute) or root
        in_last_block = gathered + (block if setup.dp > 1 else 0)
        forward_gathered = in_last_block + (previous if setup.dp > 1 else 0)
        last_gather = block if arch.modelling is not None and setup.dp > 1 else 0
    # foreach Adam/AdamW (the CUDA default): one temporary list the size of the local params
    # (torch/optim/adam.py _multi_tensor_adam, torch._foreach_sqrt(exp_avg_sqs)); SGD's foreach
    # updates in place.
    # Under CPUOffloadPolicy the optimizer steps the shards in host memory.
    adam = n_states == STATE_TENSORS[Optimizer.ADAM]
    temporary = share.states * d.parameter if adam and not offload else 0
    ddp_grads = None
    if stage < Stage.GRADIENTS and arch.modelling is not None:
        ddp_grads = _ddp_backward_grads(setup, d.gradient)
    memory = step_memory(
        arch,
        batch,
        regime,
        ddp_grads=ddp_grads,
        unsharded_after_forward=unsharded,
        step_gradients=step_grads,
        optimizer_temporary=temporary,
        accumulated_gradients=step_grads if batch.grad_accumulation_steps > 1 else 0,
        gathered_for_loss=gathered_for_loss,
        root_copy_out=root_copy_out,
        root_reduction=root_reduction,
        fsdp_backward=fsdp_backward,
        forward_gathered=forward_gathered,
        in_last_block=in_last_block,
        last_gather=last_gather,
        first_gather=first_gather,
        # accelerate wraps forward only under mixed precision (Accelerator's native_amp)
        fp32_outputs=converts_outputs(config) and setup.precision.is_mixed,
        config=config,
    )
    # input ids and targets (int64) of every micro-batch the loop holds
    runtime = 2 * INDEX_BYTES * batch.tokens * batch.grad_accumulation_steps
    return memory, runtime


# a decoder layer's parameters whose gradients its attention core's backward comes before:
# the input norm and the q/k/v projections (DeepSeek's latent ones) with their norms, by the
# module's names (a measured model's parameter list) and by the architecture's own
_BEFORE_ATTENTION = (
    "ln1",
    "q",
    "k",
    "v",
    "qkv",
    "q_a",
    "q_b",
    "q_a_norm",
    "kv_a",
    "kv_a_norm",
    "kv_b",
    "input_layernorm",
    "q_proj",
    "k_proj",
    "v_proj",
    "qkv_proj",
    "q_norm",
    "k_norm",
    "q_a_proj",
    "q_b_proj",
    "q_a_layernorm",
    "kv_a_proj_with_mqa",
    "kv_a_layernorm",
    "kv_b_proj",
)


def _ddp_backward_grads(setup: TrainingSetup, grad_bytes: int) -> DdpBackwardGrads | None:
    """The ``param.grad`` tensors autograd has made by each block's backward under DDP.

    With ``gradient_as_bucket_view=False`` (the default) each gradient is its own tensor,
    allocated when its ``AccumulateGrad`` runs (the Reducer copies it into its bucket): when
    block ``i``'s backward starts, the head's and the final norm's exist (a tied head's sits in
    the shared weight's input buffer until the embedding's backward) and those of every block
    after ``i``; by its attention core's backward, also its MLP's, its output projection's and
    its post-attention norms'. The token embedding's comes last."""
    ts = param_tensors(setup)
    arch = setup.architecture
    if not ts or arch is None:
        return None
    root, block = root_and_last_block(ts)
    embedding = 0 if arch.tied_embeddings else arch.vocab_size * arch.hidden
    return DdpBackwardGrads(
        grad_bytes * (sum(t.numel for t in root) - embedding),
        grad_bytes * sum(t.numel for t in block),
        grad_bytes * _before_attention(block),
        grad_bytes,
    )


def _before_attention(block: Sequence[ParamTensor]) -> int:
    """Elements of a block's gradients autograd makes before its attention core's backward:
    its MLP's or experts', its output projection's and its post-attention norms'."""
    return sum(t.numel for t in block if t.name.split(".")[-2] not in _BEFORE_ATTENTION)


def root_and_last_block(
    ts: Sequence[ParamTensor],
) -> tuple[list[ParamTensor], list[ParamTensor]]:
    """The tensors of FSDP2's root unit (everything outside the blocks) and of the last block.

    A :class:`ParamList`'s are read from its template without naming every tensor: the root
    tensors occur once each, and the last block is shaped as the first block of its kind, each
    expert's tensors once per expert (named as that block's expert 0).
    """
    if not isinstance(ts, ParamList):
        root = [t for t in ts if t.group == ROOT_GROUP]
        return root, _block(ts, -1)
    root = [t for t in ts.template.tensors if t.group == ROOT_GROUP]
    return root, _block(ts, -1)


def first_block(ts: Sequence[ParamTensor]) -> list[ParamTensor]:
    """The tensors of the first block, the unit forward gathers after the root (shaped as
    :func:`root_and_last_block` shapes the last)."""
    return _block(ts, 0)


def _block(ts: Sequence[ParamTensor], which: int) -> list[ParamTensor]:
    """The tensors of the first (``which`` 0) or last (-1) block: a :class:`ParamList`'s as the
    first block of that kind in its template, each expert's tensors once per expert."""
    if not isinstance(ts, ParamList):
        groups = [t.group for t in ts if t.group != ROOT_GROUP]
        return [t for t in ts if groups and t.group == groups[which]]
    if not ts.template.kinds:
        return []
    return _kind_tensors(ts, which % len(ts.template.kinds))


def _kind_tensors(ts: ParamList, k: int) -> list[ParamTensor]:
    """The tensors of a block of the template's ``k``-th kind, each expert's once per expert."""
    template = ts.template
    kind = template.kinds[k]
    start = template.first + sum(x.pre + x.expert + x.post for x in template.kinds[:k])
    pre, expert = start + kind.pre, start + kind.pre + kind.expert
    tensors = template.tensors
    return [
        *tensors[start:pre],
        *tensors[pre:expert] * template.experts,
        *tensors[expert : expert + kind.post],
    ]


def block_runs(ts: Sequence[ParamTensor]) -> list[tuple[int, list[ParamTensor]]]:
    """The blocks in forward order, as ``(how many, one block's tensors)``: a
    :class:`ParamList`'s one per kind of its template (each expert's tensors once per expert),
    another list's one per block."""
    if isinstance(ts, ParamList):
        template = ts.template
        return [(kind.blocks, _kind_tensors(ts, k)) for k, kind in enumerate(template.kinds)]
    groups: dict[str, list[ParamTensor]] = {}
    for t in ts:
        if t.group != ROOT_GROUP:
            groups.setdefault(t.group, []).append(t)
    return [(1, tensors) for tensors in groups.values()]


def _root_and_last_block(setup: TrainingSetup, compute_bytes: int) -> tuple[int, int]:
    """Bytes of the root unit and of the last block when FSDP2 gathers them (N × padded shard
    in the compute dtype); the last block is the one forward ran last, which backward prefetches
    first."""
    root_tensors, last_tensors = root_and_last_block(param_tensors(setup) or [])
    root = fsdp_shard_total(root_tensors, setup.dp)
    last = fsdp_shard_total(last_tensors, setup.dp)
    return setup.dp * root * compute_bytes, setup.dp * last * compute_bytes


def _before_last_block(setup: TrainingSetup, compute_bytes: int) -> int:
    """Bytes of the block before the last when FSDP2 gathers it (N × padded shard in the
    compute dtype; 0 with one block)."""
    runs = block_runs(param_tensors(setup) or [])
    if sum(count for count, _ in runs) < 2:
        return 0
    count, tensors = runs[-1]
    if count == 1:
        _, tensors = runs[-2]
    return setup.dp * fsdp_shard_total(tensors, setup.dp) * compute_bytes


def _fsdp_backward(
    setup: TrainingSetup, stage: Stage, d: Dtypes, ts: Sequence[ParamTensor]
) -> FsdpBackward:
    """What FSDP2 holds during the blocks' backward (``peak.FsdpBackward``), from the padded
    shards of the root and of each kind of block in ``ts`` and the parameters after the
    blocks."""
    arch = setup.architecture
    assert arch is not None  # _step has an architecture
    n = setup.dp
    offload = offloads(setup.offload)
    root, _ = root_and_last_block(ts)
    root_shard = fsdp_shard_total(root, n)
    # the final norm and head (the embedding's gradient, when the head is tied to it), whose
    # backward runs before the blocks'
    after_blocks = sum(t.numel * c for t, c in tensor_counts(arch) if t.stage_hint == "last")
    embedding = arch.vocab_size * (arch.embed_proj_dim or arch.hidden)
    # the embedding's dense gradient; tied, also the sum with the head's (autograd.InputBuffer)
    embedding_grads = embedding * (2 if arch.tied_embeddings else 1)
    if arch.tied_embeddings:
        after_blocks += embedding

    def block(tensors: Sequence[ParamTensor]) -> FsdpBlock:
        shard = fsdp_shard_total(tensors, n)
        return FsdpBlock(
            gathered=n * shard * d.compute,
            grads=sum(t.numel for t in tensors) * d.compute,
            reduce_input=n * shard * d.reduce,
            shard_grad=shard * d.gradient,
            cast_output=shard * d.reduce if d.reduce != d.gradient else 0,
            gather_inputs=shard * d.compute if offload and stage is Stage.PARAMETERS else 0,
            grads_before_attention=d.compute * _before_attention(tensors),
        )

    runs: list[tuple[int, FsdpBlock]] = []
    for count, tensors in block_runs(ts):
        b = block(tensors)
        if runs and runs[-1][1] == b:
            runs[-1] = (runs[-1][0] + count, b)
        else:
            runs.append((count, b))
    return FsdpBackward(
        blocks=tuple(runs),
        root_gathered=n * root_shard * d.compute,
        root_grads=after_blocks * d.compute,
        prefetch=stage is Stage.PARAMETERS,
        embedding_grads=embedding_grads * d.compute,
        keeps_shards=not offload,
        grad_element_bytes=d.compute,
        across_ranks=n > 1,
    )
