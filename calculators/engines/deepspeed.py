"""DeepSpeed 0.19.8 ZeRO, modelled from its source: what rank 0 really allocates.

Paths are relative to ``deepspeed/runtime/`` of the 0.19.8 sdist; docs/engines/deepspeed.md walks
through them. The training loop modelled is the plain one a DeepSpeed user writes, with a client
``torch.optim.Adam`` (foreach) and the fp16 or bf16 section enabled::

    logits = engine(x)
    loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
    engine.backward(loss); engine.step()

Which wrapper runs (engine.py ``_configure_optimizer``): stage 0 ``FP16_UnfusedOptimizer``
(fp16/unfused_optimizer.py, for fp16 and bf16 alike with a torch optimizer), stages 1/2
``DeepSpeedZeroOptimizer`` (zero/stage_1_and_2.py), stage 3 ``DeepSpeedZeroOptimizer_Stage3``
(zero/stage3.py) with the parameter coordinator (zero/partitioned_param_coordinator.py).

``resident`` is ``torch.cuda.memory_allocated`` between steps (after ``engine.step()``, which
ends with ``zero_grad``); ``peak`` the highest allocation within a step. Both include what the
loop still references between steps (``logits``, ``loss``, the batch; ``holds_outputs``) and the
cuBLAS workspaces the caching allocator holds after the first step (see
``calculators.engines.torch_peak``). Every tensor is rounded up to the caching allocator's
512-byte blocks (c10/cuda/CUDACachingAllocator.cpp ``round_size``, ``kMinBlockSize = 512``).
The peak is the largest of a few moments of the step, each a sum of tensors alive together.

``device`` places the model states: ``parameters`` the 16-bit copy (flat group, partition, plus
persistent gathered ones), ``optimizer_states`` the fp32 master and the optimizer's states,
``gradients`` the gradient copy the optimizer reads, alive from backward to the step and
resident only in stage 3 (its partition buffer). ``components`` names every resident part and,
prefixed ``peak.``, what the peak moment adds.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from calculators.activations import ActivationBreakdown, Regime, activations
from calculators.architecture import Architecture, tensors
from calculators.conventions import (
    FP32_BYTES,
    HALF_BYTES,
    OffloadDevice,
    Optimizer,
    Precision,
    Stage,
)
from calculators.engines.torch_peak import cublas_workspace_bytes, holds_outputs
from calculators.errors import InputError
from calculators.memory import StageEstimate
from calculators.model_states import Placement, TrainingSetup

CONVENTION = (
    "deepspeed: what DeepSpeed 0.19.8 allocates on rank 0 (stage 0 FP16_UnfusedOptimizer, "
    "stages 1/2 DeepSpeedZeroOptimizer, stage 3 DeepSpeedZeroOptimizer_Stage3) with a client "
    "torch.optim.Adam, fp16/bf16 parameters, fp32 master; resident = allocated between steps "
    "(cuBLAS workspaces and the loop's logits included), peak = highest allocation in a step"
)

BLOCK = 512  # CUDACachingAllocator kMinBlockSize: every allocation is a multiple of it
FP64_BYTES = 8  # gradient norms run in float64 (zero/utils.py get_norm_dtype)
INDEX_BYTES = 8  # int64 token ids and targets

# torch.optim state tensors per parameter (zeros_like the fp32 master).
STATE_TENSORS: dict[Optimizer, int] = {
    Optimizer.ADAM: 2,
    Optimizer.ADAMW: 2,
    Optimizer.SGD_MOMENTUM: 1,
    Optimizer.SGD: 0,
}


def block(nbytes: int) -> int:
    """Bytes the caching allocator hands out for a request of ``nbytes`` (0 stays 0)."""
    return -(-nbytes // BLOCK) * BLOCK if nbytes > 0 else 0


def blocks(element_bytes: int, numels: Sequence[int]) -> int:
    """One allocation per tensor."""
    return sum(block(element_bytes * n) for n in numels)


# --- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Knobs:
    """The DeepSpeed config values the memory model reads (zero/config.py defaults)."""

    reduce_bucket_size: int = 500_000_000  # zero/config.py:113
    allgather_bucket_size: int = 500_000_000  # :132 (unused: all_gather_into_tensor, utils.py)
    overlap_comm: bool | None = None  # :138, None -> True only for stage 3 (:384-387)
    contiguous_gradients: bool = True  # :102
    reduce_scatter: bool = True  # :108
    use_multi_rank_bucket_allreduce: bool = True  # :119
    memory_efficient_linear: bool = True  # :346
    sub_group_size: int = 1_000_000_000  # :182
    prefetch_bucket_size: int = 50_000_000  # :222
    param_persistence_threshold: int = 100_000  # :228
    model_persistence_threshold: int = 2**63 - 1  # :235 (sys.maxsize)
    max_live_parameters: int = 1_000_000_000  # :245
    max_reuse_distance: int = 1_000_000_000  # :251
    hpz: int = 1  # zero_hpz_partition_size :324 (0 and 1 both mean off)
    qwz: bool = False  # zero_quantized_weights :328
    qgz: bool = False  # zero_quantized_gradients :340
    communication_bytes: int | None = None  # runtime/config.py get_communication_data_type
    offload_optimizer: OffloadDevice | None = None
    offload_param: OffloadDevice | None = None
    pin_memory: bool = True  # offload_config.py:45, :75
    force_ds_cpu_optimizer: bool = True  # constants.py:42
    fp16: bool | None = None
    bf16: bool | None = None
    micro_batch: int | None = None
    grad_accumulation: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def overlap(self, stage: Stage) -> bool:
        return self.overlap_comm if self.overlap_comm is not None else stage is Stage.PARAMETERS


_INT_KNOBS = {
    "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size",
    "sub_group_size": "sub_group_size",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_model_persistence_threshold": "model_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "zero_hpz_partition_size": "hpz",
}
_BOOL_KNOBS = {
    "overlap_comm": "overlap_comm",
    "contiguous_gradients": "contiguous_gradients",
    "reduce_scatter": "reduce_scatter",
    "use_multi_rank_bucket_allreduce": "use_multi_rank_bucket_allreduce",
    "memory_efficient_linear": "memory_efficient_linear",
    "zero_quantized_weights": "qwz",
    "zero_quantized_gradients": "qgz",
}
# runtime/config.py:119-130 _REMOVED_ZERO_CONFIG_KEYS, rejected by _reject_removed_config_keys
# (:133-141) with a DeepSpeedConfigError.
_REMOVED_ZERO_KEYS = {
    "mics_shard_size": "MiCS",
    "mics_hierarchical_params_gather": "MiCS",
    "zeropp_loco_param": "LoCo-Zero++",
}
# runtime/config.py:216-230 get_communication_data_type: lower-cased, these three only.
_COMMUNICATION_BYTES = {"fp16": HALF_BYTES, "bf16": HALF_BYTES, "fp32": FP32_BYTES}


def _whole(value: Any, where: str, minimum: int = 0) -> int:
    finite = isinstance(value, int) or isinstance(value, float) and math.isfinite(value)
    if isinstance(value, bool) or not finite or value < minimum or value != int(value):
        raise InputError(where, f"must be a whole number >= {minimum}")
    return int(value)


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(where, "must be true or false")
    return value


def _section(config: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = config.get(key, {})
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(where, "must be an object")
    return value


def _offload_device(section: Mapping[str, Any], where: str) -> OffloadDevice | None:
    device = section.get("device", "none")
    try:
        parsed = OffloadDevice(device)
    except ValueError:
        raise InputError(f"{where}.device", "must be none, cpu or nvme") from None
    return None if parsed is OffloadDevice.NONE else parsed


def parse_config(config: Mapping[str, Any] | None) -> Knobs:
    """Read a DeepSpeed config body; unknown keys are ignored as DeepSpeed ignores them."""
    config = config or {}
    prefix = "engine_config"
    zero = _section(config, "zero_optimization", f"{prefix}.zero_optimization")
    values: dict[str, Any] = {}
    zp = f"{prefix}.zero_optimization"
    for key, feature in _REMOVED_ZERO_KEYS.items():
        if key in zero:
            raise InputError(
                f"{zp}.{key}",
                f"{feature} was removed in DeepSpeed 0.19.8 "
                "(runtime/config.py _REMOVED_ZERO_CONFIG_KEYS)",
            )
    for key, attr in _INT_KNOBS.items():
        if key in zero:
            least = 1 if key == "reduce_bucket_size" else 0
            values[attr] = _whole(zero[key], f"{zp}.{key}", least)
    for key, attr in _BOOL_KNOBS.items():
        if key in zero and zero[key] is not None:
            values[attr] = _flag(zero[key], f"{zp}.{key}")
    pin = True
    for key in ("offload_optimizer", "offload_param"):
        section = _section(zero, key, f"{zp}.{key}")
        if section:
            values[key] = _offload_device(section, f"{zp}.{key}")
            if "pin_memory" in section:
                pin = pin and _flag(section["pin_memory"], f"{zp}.{key}.pin_memory")
    values["pin_memory"] = pin
    if "zero_force_ds_cpu_optimizer" in config:
        values["force_ds_cpu_optimizer"] = _flag(
            config["zero_force_ds_cpu_optimizer"], f"{prefix}.zero_force_ds_cpu_optimizer"
        )
    for key in ("fp16", "bf16"):
        section = _section(config, key, f"{prefix}.{key}")
        if "enabled" in section:
            values[key] = _flag(section["enabled"], f"{prefix}.{key}.enabled")
    comm = config.get("communication_data_type")
    if comm is not None:
        if not isinstance(comm, str) or comm.lower() not in _COMMUNICATION_BYTES:
            raise InputError(
                f"{prefix}.communication_data_type",
                f"must be one of {', '.join(_COMMUNICATION_BYTES)}",
            )
        values["communication_bytes"] = _COMMUNICATION_BYTES[comm.lower()]
    if "train_micro_batch_size_per_gpu" in config:
        values["micro_batch"] = _whole(
            config["train_micro_batch_size_per_gpu"], f"{prefix}.train_micro_batch_size_per_gpu", 1
        )
    if "gradient_accumulation_steps" in config:
        values["grad_accumulation"] = _whole(
            config["gradient_accumulation_steps"], f"{prefix}.gradient_accumulation_steps", 1
        )
    return Knobs(**values, extra=config)


# --- the parameters as DeepSpeed sees them ----------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One parameter: its module (name without ``.weight``/``.bias``), elements, block index."""

    module: str
    numel: int
    layer: int | None


def param_list(setup: TrainingSetup) -> tuple[list[Param], bool]:
    """Parameters in ``named_parameters`` order, and whether they are exact.

    Without an architecture Ψ is one tensor (padding, persistence and per-tensor rounding are
    then approximate).
    """
    if setup.architecture is not None:
        return list(_architecture_params(setup.architecture)), True
    return [Param("model", setup.params, None)], False


@lru_cache(maxsize=16)  # few: a MoE model's list runs to ~50k tensors
def _architecture_params(arch: Architecture) -> tuple[Param, ...]:
    """Once per architecture: a sweep asks for the same list per Nd and stage."""
    return tuple(Param(t.name.rsplit(".", 1)[0], t.numel, t.layer) for t in tensors(arch))


# --- the moments of a step ---------------------------------------------------------------------


@dataclass(frozen=True)
class Moment:
    """Bytes alive together at one point of the step, beyond the resident model states."""

    activations: int
    buffers: Mapping[str, int]

    @property
    def total(self) -> int:
        return self.activations + sum(self.buffers.values())


@dataclass(frozen=True)
class StepShape:
    """The workload terms every stage shares (bytes, allocator-rounded)."""

    acts: ActivationBreakdown | None
    held: int  # logits, loss and the batch the loop keeps between steps
    loss_grads: int  # nll_loss and log_softmax fp32 gradients (tokens x vocab each)
    log_softmax_out: int  # the saved fp32 log-softmax output, freed in the loss backward

    @property
    def end_of_forward(self) -> int:
        return self.acts.end_of_forward if self.acts is not None else 0

    @property
    def known(self) -> bool:
        return self.acts is not None


def step_shape(setup: TrainingSetup, knobs: Knobs) -> StepShape:
    arch, batch = setup.architecture, setup.batch
    if arch is None or batch is None:
        return StepShape(None, 0, 0, 0)
    acts = activations(arch, batch, Regime.HALF)
    t, v = batch.tokens, arch.vocab_size
    held = 0
    if holds_outputs(knobs.extra):
        # logits (16-bit), the loss scalar, token ids and targets (int64)
        held = block(HALF_BYTES * t * v) + block(FP32_BYTES) + 2 * block(INDEX_BYTES * t)
    fp32_logits = block(FP32_BYTES * t * v)
    return StepShape(acts, held, 2 * fp32_logits, fp32_logits)


def forward_moments(
    shape: StepShape, first_grad: int, gathered: int = 0, bucket_first_hook: int = 0
) -> dict[str, Moment]:
    """Moments of the loss and the start of backward, common to every stage.

    - ``loss_backward``: everything forward saved, and the two fp32 tokens × vocab gradients
      of ``cross_entropy(logits.float())`` (nll_loss's grad input and log_softmax's).
    - ``first_gradient``: the log-softmax output is freed, the head's weight gradient exists and
      (stages 1/2) the first gradient hook allocates the IPG bucket
      (stage_1_and_2.py ``setup_buckets``).
    """
    if not shape.known:
        return {}
    eof = shape.end_of_forward
    out = {
        "loss_backward": Moment(
            eof, {"loss_gradients": shape.loss_grads, "gathered_parameters": gathered}
        ),
        "first_gradient": Moment(
            eof - shape.log_softmax_out,
            {
                "first_gradient": first_grad,
                "ipg_buckets": bucket_first_hook,
                "gathered_parameters": gathered,
            },
        ),
    }
    assert shape.acts is not None  # shape.known
    if shape.acts.recompute:
        # activation checkpointing: the last block's forward runs again at the start of
        # backward (torch.utils.checkpoint); not validated against DeepSpeed runs
        out["recompute"] = Moment(
            eof - shape.log_softmax_out + shape.acts.recompute,
            {
                "first_gradient": first_grad,
                "ipg_buckets": bucket_first_hook,
                "gathered_parameters": gathered,
            },
        )
    return out


def later_micro_steps(
    moments: dict[str, Moment], accumulation: int, carried: Mapping[str, int], names: Sequence[str]
) -> None:
    """With gradient accumulation, micro-steps 2..k repeat ``names`` with ``carried`` alive."""
    if accumulation <= 1:
        return
    for name in names:
        if name in moments:
            m = moments[name]
            buffers = dict(m.buffers)
            for k, v in carried.items():
                buffers[k] = (
                    max(buffers.get(k, 0), v) if k == "ipg_buckets" else (buffers.get(k, 0) + v)
                )
            moments[f"{name}_later_micro_step"] = Moment(m.activations, buffers)


# --- stages -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """What one stage keeps and what each moment adds."""

    resident_parts: dict[str, int]
    device: Placement
    cpu: Placement
    cpu_buffers: int
    moments: dict[str, Moment]
    notes: list[str]


def _partition_elems(n: int, world: int) -> int:
    """Stage 3 partition of one parameter: ceil(n / N) (partition_parameters.py:1816-1817)."""
    return -(-n // world)


# --- the caching allocator, for stage 0's per-tensor state ------------------------------------
# c10/cuda/CUDACachingAllocator.cpp: requests up to kSmallSize go to the small pool (2 MiB
# segments), larger ones to the large pool (20 MiB segments below kMinLargeAlloc, else rounded
# to kRoundLarge); the smallest cached block that fits is taken (best fit) and split only if
# the rest is >= kMinBlockSize (small pool) or > kSmallSize (large pool), so a cached block
# up to 1 MiB too big is handed out whole; freed blocks merge with free neighbours.
K_SMALL_SIZE = 1024 * 1024
K_SMALL_BUFFER = 2 * 1024 * 1024
K_LARGE_BUFFER = 20 * 1024 * 1024
K_MIN_LARGE_ALLOC = 10 * 1024 * 1024
K_ROUND_LARGE = 2 * 1024 * 1024


class _Block:
    __slots__ = ("free", "key", "next", "prev", "size", "small")

    def __init__(self, key: tuple[int, int], size: int, small: bool) -> None:
        self.key = key  # (segment, offset): the allocator's address order
        self.size = size
        self.small = small
        self.free = True
        self.prev: _Block | None = None
        self.next: _Block | None = None


class CachingAllocator:
    """Enough of the caching allocator to tell the block each request is handed."""

    def __init__(self) -> None:
        self.pools: dict[bool, list[tuple[int, int, int, _Block]]] = {True: [], False: []}
        self.segments = 0

    def _insert(self, b: _Block) -> None:
        insort(self.pools[b.small], (b.size, *b.key, b), key=lambda e: e[:3])

    def _remove(self, b: _Block) -> None:
        pool = self.pools[b.small]
        i = bisect_left(pool, (b.size, *b.key), key=lambda e: e[:3])
        pool.pop(i)

    def malloc(self, nbytes: int) -> _Block:
        size = max(block(nbytes), BLOCK)
        small = size <= K_SMALL_SIZE
        pool = self.pools[small]
        i = bisect_left(pool, (size, -1, -1), key=lambda e: e[:3])
        if i < len(pool):
            b = pool.pop(i)[3]
        else:
            if small:
                segment = K_SMALL_BUFFER
            elif size < K_MIN_LARGE_ALLOC:
                segment = K_LARGE_BUFFER
            else:
                segment = -(-size // K_ROUND_LARGE) * K_ROUND_LARGE
            self.segments += 1
            b = _Block((self.segments, 0), segment, small)
        rest = b.size - size
        if rest >= BLOCK if small else rest > K_SMALL_SIZE:
            r = _Block((b.key[0], b.key[1] + size), rest, small)
            r.prev, r.next = b, b.next
            if b.next is not None:
                b.next.prev = r
            b.next, b.size = r, size
            self._insert(r)
        b.free = False
        return b

    def free(self, b: _Block) -> None:
        b.free = True
        prev, nxt = b.prev, b.next
        if prev is not None and prev.free:
            self._remove(prev)
            prev.size += b.size
            prev.next = nxt
            if nxt is not None:
                nxt.prev = prev
            b = prev
        nxt = b.next
        if nxt is not None and nxt.free:
            self._remove(nxt)
            b.size += nxt.size
            b.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = b
        self._insert(b)


@lru_cache(maxsize=32)
def stage0_unsplit_bytes(numels: tuple[int, ...], n_states: int, adam: bool) -> tuple[int, int]:
    """Bytes the allocator hands out beyond the rounded requests of stage 0's tensors.

    Replays DeepSpeed's allocation order on a fresh device: the module is cast on the host and
    moved tensor by tensor (engine.py ``_configure_distributed_model``); each fp32 master is
    ``p.clone().float()`` (the 16-bit clone freed, unfused_optimizer.py:72-77);
    ``initialize_optimizer_states`` (:413-433) makes zero 16-bit then fp32 gradients and runs one
    Adam step, whose ``_init_group`` creates each parameter's states in turn and whose foreach
    path allocates the ``_foreach_sqrt`` temporaries, then frees them and the gradients.

    Returns:
        (persistent, step): the excess on the 16-bit weights, masters and states, and on the
        step's gradients and temporaries at the init step (used for the training step, whose
        cache also holds activation blocks: an estimate).
    """
    alloc = CachingAllocator()

    def get(nbytes: int) -> tuple[_Block, int]:
        return alloc.malloc(nbytes), block(nbytes)

    kept = [get(HALF_BYTES * n) for n in numels if n]
    for n in (n for n in numels if n):
        clone = get(HALF_BYTES * n)
        kept.append(get(FP32_BYTES * n))
        alloc.free(clone[0])
    g16 = [get(HALF_BYTES * n) for n in numels if n]
    g32 = [get(FP32_BYTES * n) for n in numels if n]
    for n in (n for n in numels if n):
        kept += [get(FP32_BYTES * n) for _ in range(n_states)]
    temps = [get(FP32_BYTES * n) for n in numels if n] if adam else []
    persistent = sum(b.size - want for b, want in kept)
    step = sum(b.size - want for b, want in g16 + g32 + temps)
    return persistent, step


def _stage0(
    params: list[Param], n_states: int, shape: StepShape, adam: bool, accumulation: int
) -> Layout:
    numels = [p.numel for p in params]
    p16 = blocks(HALF_BYTES, numels)  # module cast to 16-bit, per tensor (engine.py)
    master = blocks(FP32_BYTES, numels)  # p.clone().float() per tensor (unfused_optimizer.py:72-77)
    states = n_states * master  # created eagerly: initialize_optimizer_states (:413-433)
    g16 = blocks(HALF_BYTES, numels)  # autograd's param.grad, freed by zero_grad after step
    g32 = blocks(FP32_BYTES, numels)  # fp16_param.grad.to(fp32) per tensor in step (:217-222)
    foreach = master if adam else 0  # torch _multi_tensor_adam: _foreach_sqrt(exp_avg_sqs)
    # engine.py allreduce_no_retain: buckets close once past 5e8 elements
    # (MEMORY_OPT_ALLREDUCE_SIZE) and are flattened into a new 16-bit tensor (allreduce_bucket)
    bucket, largest = 0, 0
    for n in numels:
        bucket += n
        if bucket > 500_000_000:
            largest, bucket = max(largest, bucket), 0
    largest = max(largest, bucket)
    flat = block(HALF_BYTES * largest) if len(numels) > 1 else 0
    moments = forward_moments(shape, block(HALF_BYTES * numels[-1]))
    # autograd accumulates into param.grad; the all-reduce runs at the boundary only
    later_micro_steps(
        moments, accumulation, {"accumulated_gradients": g16}, ("loss_backward", "first_gradient")
    )
    moments["gradient_allreduce"] = Moment(
        0, {"held_outputs": shape.held, "gradients": g16, "allreduce_flatten": flat}
    )
    # get_weight_norm: p.grad.float().norm() one tensor at a time (runtime/utils.py:578)
    moments["grad_norm"] = Moment(
        0,
        {
            "held_outputs": shape.held,
            "gradients": g16,
            "norm_fp32_copy": block(FP32_BYTES * max(numels)),
        },
    )
    moments["optimizer_step"] = Moment(
        0,
        {
            "held_outputs": shape.held,
            "gradients": g16,
            "fp32_gradients": g32,
            "adam_foreach_temp": foreach,
        },
    )
    unsplit, unsplit_step = stage0_unsplit_bytes(tuple(numels), n_states, adam)
    moments["optimizer_step"] = Moment(
        0, {**moments["optimizer_step"].buffers, "allocator_unsplit_transients": unsplit_step}
    )
    return Layout(
        resident_parts={
            "params_16bit": p16,
            "fp32_master": master,
            "optimizer_states": states,
            "allocator_unsplit_blocks": unsplit,
        },
        device=Placement(parameters=p16, gradients=g16, optimizer_states=master + states),
        cpu=Placement(),
        cpu_buffers=0,
        moments=moments,
        notes=[
            "stage 0: FP16_UnfusedOptimizer keeps per-tensor fp32 masters and creates Adam "
            "states at construction; fp32 gradients exist only inside step()",
            "stage 0 allocates one tensor per parameter and state: allocator_unsplit_blocks "
            "replays DeepSpeed's initialisation on the caching allocator (cached blocks up "
            "to 1 MiB too big are handed out whole); the step's share is replayed on the "
            "init-time step, an estimate",
        ],
    )


def _stage12(
    params: list[Param],
    world: int,
    stage: Stage,
    knobs: Knobs,
    n_states: int,
    shape: StepShape,
    adam: bool,
    accumulation: int,
) -> Layout:
    numels = [p.numel for p in params]
    psi = sum(numels)
    # stage_1_and_2.py:387, 446: the flat group is padded to a multiple of 2 x N
    # (nccl_start_alignment_factor = 2); each rank owns len / N elements.
    align = 2 * world
    padded = -(-psi // align) * align
    part = padded // world
    flat16 = block(HALF_BYTES * padded)  # bit16_groups_flat (:497-503)
    offload = knobs.offload_optimizer is not None
    rbs = knobs.reduce_bucket_size
    overlap = knobs.overlap(stage) or False
    # setup_buckets (:3256-3280): one reduce_bucket_size buffer, two with overlap_comm
    ipg = (2 if overlap else 1) * block(HALF_BYTES * rbs) if knobs.contiguous_gradients else 0
    # rank 0's partition is [0, part): whole parameters that start inside it
    # (params_in_partition), and the largest slice of one of them
    g_p, start, max_slice = 0, 0, 0
    for n in numels:
        if start < part:
            g_p += n
            max_slice = max(max_slice, min(n, part - start))
        start += n
    gip = block(HALF_BYTES * g_p)  # grads_in_partition (copy_grads_in_partition :2183-2197)
    notes = [
        f"stage {int(stage)}: flat 16-bit group padded to {padded} elements, partition "
        f"{part}; IPG bucket {rbs} elements x {2 if overlap else 1}"
    ]

    # reduction: walk the gradients in bucket order; a bucket is reduced when the next gradient
    # would overflow it (:1422-1428) and flattened into a new 16-bit tensor when it spans more
    # than one partition (allreduce_bucket -> self.flatten, no copy for a single slice).
    order = list(range(len(numels)))
    # stage 2 (and stage 1 with overlap_comm) reduces from the hooks, in backward order;
    # stage 1 otherwise walks the parameters at the boundary (reduce_gradients :958-982)
    in_hooks = stage is Stage.GRADIENTS or overlap
    if in_hooks:
        order.reverse()
    if in_hooks and psi > rbs:
        notes.append(
            "buckets reduced during backward are counted without the activations "
            "still alive at that point"
        )
    offsets = []
    pos = 0
    for n in numels:
        offsets.append(pos)
        pos += n

    def spans(first: int, last_end: int) -> bool:
        return world > 1 and first // part != (last_end - 1) // part

    reduce_peak = 0
    bucket_elems, bucket_lo, bucket_hi = 0, padded, 0
    grads_left = 0 if in_hooks else blocks(HALF_BYTES, numels)
    partition_allocated = False
    for i in order:
        n = numels[i]
        if bucket_elems and bucket_elems + n > rbs:
            copy = block(HALF_BYTES * bucket_elems) if spans(bucket_lo, bucket_hi) else 0
            reduce_peak = max(reduce_peak, grads_left + copy + (gip if partition_allocated else 0))
            partition_allocated = partition_allocated or bucket_lo < part
            bucket_elems, bucket_lo, bucket_hi = 0, padded, 0
        bucket_elems += n
        bucket_lo, bucket_hi = min(bucket_lo, offsets[i]), max(bucket_hi, offsets[i] + n)
        if not in_hooks:
            grads_left -= block(HALF_BYTES * n)  # moved into the bucket, autograd's freed
    if bucket_elems:
        copy = block(HALF_BYTES * bucket_elems) if spans(bucket_lo, bucket_hi) else 0
        reduce_peak = max(reduce_peak, copy + (gip if partition_allocated else 0))
    if offload:
        gip = 0  # offload copies each in-partition slice straight to the pinned fp32 buffer
    reduce_peak = max(reduce_peak, gip)

    moments = forward_moments(shape, block(HALF_BYTES * numels[-1]), 0, ipg)
    if not in_hooks:
        # overlap_comm off: hooks only set up the bucket; autograd keeps every gradient until
        # engine.allreduce_gradients -> reduce_gradients walks them (engine.py:3088-3092)
        moments["end_of_backward"] = Moment(
            0,
            {
                "held_outputs": shape.held,
                "gradients": blocks(HALF_BYTES, numels),
                "ipg_buckets": ipg,
            },
        )
    if stage is Stage.OPTIMIZER:
        # stage 1 reduces only at the boundary (reduce_ready_partitions_and_remove_grads
        # :2293): the gradients and the bucket (allocated by the first hook, released only by
        # the boundary epilogue) stay into the next micro-step
        later_micro_steps(
            moments,
            accumulation,
            {"accumulated_gradients": blocks(HALF_BYTES, numels), "ipg_buckets": ipg},
            ("loss_backward", "first_gradient"),
        )
    moments["gradient_reduction"] = Moment(
        0, {"held_outputs": shape.held, "ipg_buckets": ipg, "reduction_buffers": reduce_peak}
    )
    if stage is Stage.GRADIENTS and not offload:
        # each micro-step's epilogue keeps the partition's gradients in all_grad_tensors
        # (views of that step's grads_in_partition) and adds the next ones to it (:1041-1051)
        later_micro_steps(
            moments,
            accumulation,
            {"accumulated_gradients": gip},
            ("loss_backward", "first_gradient", "gradient_reduction"),
        )

    master = block(FP32_BYTES * part)
    states = n_states * master
    cpu = Placement()
    cpu_buffers = 0
    resident = {"flat_16bit_params": flat16}
    if offload:
        # temp_grad_buffer_for_gpu_offload (:659-661) stays on the device
        resident["offload_grad_staging"] = block(HALF_BYTES * max(numels))
        # host: fp32 master, fp32 grad partition (kept), 16-bit staging, Adam states
        cpu = Placement(
            parameters=0,
            gradients=FP32_BYTES * part,
            optimizer_states=FP32_BYTES * part * (1 + n_states),
        )
        cpu_buffers = HALF_BYTES * part + HALF_BYTES * max(numels) if knobs.pin_memory else 0
        # per in-partition gradient: fp64 norm copy and an fp32 copy before the host copy
        # (set_norm_for_param_grad_in_gpu, async_inplace_copy_grad_to_fp32_buffer_from_gpu)
        moments["gradient_reduction"] = Moment(
            0,
            {
                "held_outputs": shape.held,
                "ipg_buckets": ipg,
                "reduction_buffers": reduce_peak,
                "offload_norm_copy": block(FP64_BYTES * max_slice),
            },
        )
        device = Placement(parameters=flat16, gradients=0, optimizer_states=0)
        notes.append(
            "optimizer offload: fp32 master, fp32 gradient partition and optimizer "
            "states live in host memory; the step runs on the CPU"
        )
    else:
        resident["fp32_master_partition"] = master
        resident["optimizer_states"] = states
        flat_grad = block(HALF_BYTES * part)
        g32 = block(FP32_BYTES * part)
        base = {"held_outputs": shape.held}
        # step() (:3013-3169): fp64 per-gradient norms, flatten + .to(fp32), Adam
        moments["grad_norm"] = Moment(
            0, {**base, "grads_in_partition": gip, "norm_fp64_copy": block(FP64_BYTES * max_slice)}
        )
        moments["fp32_gradient"] = Moment(
            0,
            {
                **base,
                "grads_in_partition": gip,
                "flat_16bit_gradient": flat_grad,
                "fp32_gradient": g32,
            },
        )
        moments["optimizer_step"] = Moment(
            0, {**base, "fp32_gradient": g32, "adam_foreach_temp": master if adam else 0}
        )
        device = Placement(parameters=flat16, gradients=gip, optimizer_states=master + states)
    return Layout(resident, device, cpu, cpu_buffers, moments, notes)


@dataclass(frozen=True)
class Stage3Trace:
    """Stage-3 parameter fetching in steady state (trace complete), per parameter.

    Attributes:
        persistent: never released (numel <= stage3_param_persistence_threshold).
        kept: still gathered (or in flight) when forward ends.
        forward_gathered: elements all-gathered during forward (re-gathers counted again).
        backward_gathered: elements all-gathered during backward.
        forward_gathers: per parameter, how often it is all-gathered during forward.
        backward_gathers: per parameter, how often it is all-gathered during backward.
        forward_calls: all-gather batches issued during forward: one per module fetch and one
            per prefetch that finds something to gather (partitioned_param_coordinator.py
            ``__all_gather_params`` -> one ``all_gather_coalesced``).
        backward_calls: the same during backward.
    """

    persistent: tuple[bool, ...]
    kept: tuple[bool, ...]
    forward_gathered: int = 0
    backward_gathered: int = 0
    forward_gathers: tuple[int, ...] = ()
    backward_gathers: tuple[int, ...] = ()
    forward_calls: int = 0
    backward_calls: int = 0


def _fetch_order(params: Sequence[Param]) -> tuple[list[str], list[str]]:
    """Modules in the order DeepSpeed's hooks fetch them, forward then backward.

    Every module whose ``forward`` runs is fetched (parameter_offload.py pre-forward hook), the
    root and containers included (they own no parameters but take a step of the trace);
    ``ModuleList``s are never called. Backward fetches come from the hooks on each module's
    outputs, so a container comes before its children and children run in reverse.
    """
    children: dict[str, list[str]] = {"": []}
    for p in params:
        parts = p.module.split(".")
        parent = ""
        for i in range(len(parts)):
            path = ".".join(parts[: i + 1])
            if i + 1 < len(parts) and parts[i + 1].isdigit():
                continue  # a ModuleList: its items hang under the module above it
            if path not in children:
                children[path] = []
                children[parent].append(path)
            parent = path

    def walk(node: str, reverse: bool) -> list[str]:
        kids = children[node]
        out = [node]
        for k in reversed(kids) if reverse else kids:
            out += walk(k, reverse)
        return out

    return walk("", False), walk("", True)


def stage3_trace(params: Sequence[Param], knobs: Knobs) -> Stage3Trace:
    """The coordinator simulation, cached per parameter list and the knobs it reads."""
    return _stage3_trace(
        tuple(params),
        knobs.param_persistence_threshold,
        knobs.model_persistence_threshold,
        knobs.max_live_parameters,
        knobs.prefetch_bucket_size,
        knobs.max_reuse_distance,
    )


@lru_cache(maxsize=64)
def _stage3_trace(
    params: tuple[Param, ...],
    persistence: int,
    model_persistence: int,
    max_live: int,
    prefetch: int,
    reuse: int,
) -> Stage3Trace:
    """Simulate the parameter coordinator for one steady-state forward and backward.

    - parameter_offload.py ``mark_persistent_parameters``: numel <= param threshold while the
      running total stays within the model threshold; persistent parameters stay gathered.
    - partitioned_param_coordinator.py ``fetch_sub_module``: gather the module's parameters,
      pop their entries off the trace queue, then prefetch: pop entries until
      ``min(max_live - available, prefetch_bucket_size)`` not-yet-gathered elements are
      requested; gathered ones are popped without counting, and every popped entry records the
      step of that use (``__most_recent_step_id_param_fetched_for``).
    - ``release_sub_module`` / ``__params_to_release``: after the module runs, its parameters
      are released unless persistent, unless a prefetch already recorded a later use, and unless
      they reappear in the trace before ``stage3_max_reuse_distance`` elements.

    The prefetcher outruns the forward (it skips what is gathered), reaches the backward half of
    the queue a few modules in and records every backward use, so on models that fit
    ``stage3_max_live_parameters`` nearly every parameter stays gathered into backward.
    """
    persistent, total = [], 0
    for p in params:
        flag = p.numel <= persistence and (total + p.numel <= model_persistence)
        total += p.numel if flag else 0
        persistent.append(flag)
    owned: dict[str, list[int]] = {}
    for i, p in enumerate(params):
        owned.setdefault(p.module, []).append(i)
    forward, backward = _fetch_order(params)
    trace = forward + backward
    at_step = [owned.get(m, []) for m in trace]
    # elements traversed before each step, and each parameter's uses, for the reuse walk
    before = [0]
    for mine in at_step:
        before.append(before[-1] + sum(params[i].numel for i in mine))
    uses: list[list[int]] = [[] for _ in params]
    for step, mine in enumerate(at_step):
        for i in mine:
            uses[i].append(step)
    queue = [(i, step) for step, mine in enumerate(at_step) for i in mine]
    head = 0
    available = list(persistent)
    recent = [-(10**18)] * len(params)
    n_available = 0
    gathered = [0, 0]
    gathers = [[0] * len(params), [0] * len(params)]
    calls = [0, 0]

    def gather(i: int, phase: int) -> int:
        nonlocal n_available
        if available[i]:
            return 0
        available[i] = True
        n_available += params[i].numel
        gathered[phase] += params[i].numel
        gathers[phase][i] += 1
        return 1

    for step, mine in enumerate(at_step):
        phase = 0 if step < len(forward) else 1
        # the module's own parameters: one __all_gather_params call (:381)
        if sum(gather(i, phase) for i in mine):
            calls[phase] += 1
        not_fetched = {i for i in mine if recent[i] < step}
        popped: set[int] = set()
        while head < len(queue) and len(popped) < len(not_fetched):
            i, use = queue[head]
            head += 1
            recent[i] = use
            popped.add(i)
        budget = min(max_live - n_available, prefetch)
        requested = 0
        batch = 0
        while head < len(queue) and requested < budget:
            i, use = queue[head]
            head += 1
            recent[i] = max(recent[i], use)
            if not available[i]:
                batch += gather(i, phase)
                requested += params[i].numel
        if batch:  # the prefetched set: one __all_gather_params call (:484)
            calls[phase] += 1
        after = step + 1
        release = {i for i in mine if not persistent[i] and recent[i] <= after}
        # the walk from `after` keeps i if its next use comes before the elements traversed
        # reach the distance (checked before each module: strictly fewer than it)
        for i in list(release):
            k = bisect_left(uses[i], after)
            if k < len(uses[i]) and before[uses[i][k]] - before[after] < reuse:
                release.discard(i)
        for i in release:
            if available[i]:
                available[i] = False
                n_available -= params[i].numel
        if step == len(forward) - 1:
            kept = list(available)
    return Stage3Trace(
        tuple(persistent),
        tuple(kept),
        gathered[0],
        gathered[1],
        tuple(gathers[0]),
        tuple(gathers[1]),
        calls[0],
        calls[1],
    )


def _stage3(
    params: list[Param],
    world: int,
    knobs: Knobs,
    n_states: int,
    shape: StepShape,
    adam: bool,
    exact: bool,
) -> Layout:
    numels = [p.numel for p in params]
    parts = [_partition_elems(n, world) for n in numels]
    local = sum(parts)
    trace = stage3_trace(params, knobs) if exact else Stage3Trace((False,), (True,))
    lp = block(HALF_BYTES * local)  # lp_param_buffer after defragment (stage3.py:972)
    rbs = knobs.reduce_bucket_size
    ipg = block(HALF_BYTES * rbs) if knobs.contiguous_gradients else 0  # stage3.py:779-784
    gradbuf = block(HALF_BYTES * local)  # grad_partitions_flat_buffer (:791-802)
    # sub-groups close once they reach sub_group_size (_create_fp16_sub_groups :1210-1233)
    groups: list[int] = []
    current = 0
    for n in parts:
        current += n
        if current >= knobs.sub_group_size:
            groups.append(current)
            current = 0
    if current:
        groups.append(current)
    largest = max(groups)
    master = sum(block(FP32_BYTES * s) for s in groups)
    states = n_states * master
    # A gathered parameter is a whole 16-bit copy (all_gather_coalesced -> torch.cat per
    # parameter); persistent ones stay gathered for good. With one rank nothing is gathered:
    # NoGatherHandle points param.data at the partition itself (partition_parameters.py
    # _no_gather_coalesced).
    gathers = world > 1
    persist = (
        sum(block(HALF_BYTES * n) for n, f in zip(numels, trace.persistent, strict=True) if f)
        if gathers
        else 0
    )
    # gathered at the end of forward: what the coordinator keeps (stage3_trace), plus the head
    gathered = (
        sum(
            block(HALF_BYTES * n)
            for i, (n, f, k) in enumerate(zip(numels, trace.persistent, trace.kept, strict=True))
            if not f and (k or i == len(numels) - 1)
        )
        if gathers
        else 0
    )
    offload = knobs.offload_optimizer is not None
    offload_params = knobs.offload_param is not None
    notes = [
        f"stage 3: {sum(trace.persistent)} persistent parameters ({persist} bytes gathered "
        f"for good), {sum(trace.kept)} of {len(params)} parameters stay gathered from "
        "forward to backward (simulated parameter coordinator: prefetch records their "
        "backward use)",
        "parameters still in flight at the end of forward count as gathered copies",
    ]
    if not exact:
        notes.append("approximate: no architecture, Ψ taken as one tensor kept gathered")
    # the IPG bucket is persistent here; the head's gradient is copied into it and freed
    moments = forward_moments(shape, block(HALF_BYTES * numels[-1]), gathered, 0)
    # backward: gradients land in the persistent IPG bucket; reduce_scatter_coalesced builds a
    # padded, interleaved copy of the bucket (torch.cat) unless it is one divisible tensor
    buckets: list[list[int]] = [[]]
    fill = 0
    for n in reversed(numels):
        if fill and fill + n > rbs:
            buckets.append([])
            fill = 0
        buckets[-1].append(n)
        fill += n
    cat = max(
        (
            0
            if len(b) == 1 and b[0] % world == 0
            else block(HALF_BYTES * sum(_partition_elems(n, world) * world for n in b))
        )
        for b in buckets
    )
    moments["gradient_reduction"] = Moment(
        0, {"held_outputs": shape.held, "reduce_scatter_buffer": cat}
    )
    resident = {
        "partitioned_16bit_params": 0 if offload_params else lp,
        "ipg_bucket": ipg,
        "persistent_parameters": persist,
    }
    cpu = Placement()
    cpu_buffers = 0
    if offload_params:
        cpu_buffers += HALF_BYTES * local  # pinned unconditionally (:888-911)
        notes.append("parameter offload: 16-bit partitions in pinned host memory (not validated)")
    if offload:
        cpu = Placement(
            parameters=HALF_BYTES * local if offload_params else 0,
            gradients=(FP32_BYTES + HALF_BYTES) * local,
            optimizer_states=FP32_BYTES * local * (1 + n_states),
        )
        if knobs.pin_memory:
            cpu_buffers += (FP32_BYTES + HALF_BYTES) * local  # fp32 grads, 16-bit grad buffer
        # partition_grads: each reduced partition goes to the pinned buffer and back to the
        # device (grad_buffer.to(device)), then .float() before the host copy (:2028, :1457)
        moments["gradient_reduction"] = Moment(
            0,
            {
                "held_outputs": shape.held,
                "reduce_scatter_buffer": cat,
                "offload_partition_copies": block((HALF_BYTES + FP32_BYTES) * max(parts)),
            },
        )
        device = Placement(
            parameters=resident["partitioned_16bit_params"] + persist,
            gradients=0,
            optimizer_states=0,
        )
        notes.append(
            "optimizer offload: fp32 master, gradients and optimizer states in host "
            "memory; the step runs on the CPU"
        )
    else:
        resident["gradient_partitions"] = gradbuf
        resident["fp32_master_partition"] = master
        resident["optimizer_states"] = states
        g32 = block(FP32_BYTES * largest)
        base = {"held_outputs": shape.held}
        # step (:2873-2949): gathered parameters are released first (_partition_all_parameters)
        norm = block(FP64_BYTES * max(parts))
        moments["grad_norm"] = Moment(0, {**base, "norm_fp64_copy": norm})
        moments["fp32_gradient"] = Moment(
            0, {**base, "flat_16bit_gradient": block(HALF_BYTES * largest), "fp32_gradient": g32}
        )
        moments["optimizer_step"] = Moment(
            0, {**base, "fp32_gradient": g32, "adam_foreach_temp": g32 if adam else 0}
        )
        device = Placement(
            parameters=resident["partitioned_16bit_params"] + persist,
            gradients=gradbuf,
            optimizer_states=master + states,
        )
    # _post_step re-gathers the persistent parameters: a padded flat buffer, then the copies
    persist_flat = (
        sum(
            block(HALF_BYTES * _partition_elems(n, world) * world)
            for n, f in zip(numels, trace.persistent, strict=True)
            if f
        )
        if gathers
        else 0
    )
    moments["persistent_gather"] = Moment(
        0, {"held_outputs": shape.held, "persistent_gather_buffer": persist_flat}
    )
    # the persistent parameters are freed at the start of step and gathered again after it
    for name in ("grad_norm", "fp32_gradient", "optimizer_step"):
        if name in moments:
            b = dict(moments[name].buffers)
            b["released_persistent"] = -persist
            moments[name] = Moment(0, b)
    return Layout(resident, device, cpu, cpu_buffers, moments, notes)


# --- runtime workspaces -------------------------------------------------------------------------

# torch's cuBLASLt workspace, CUBLASLT_WORKSPACE_SIZE default 1024 KiB
# (aten/src/ATen/cuda/CublasHandlePool.cpp parseCUDABlasLtWorkspaceSize). It is allocated
# through the caching allocator by the first addmm with a bias epilogue (gemm_and_bias), which
# is what F.linear on a biased nn.Linear runs in forward.
CUBLASLT_WORKSPACE = 1024 * 1024


def cublaslt_workspace_bytes(setup: TrainingSetup, stage: Stage, knobs: Knobs) -> int:
    """The cuBLASLt workspace, when forward runs a biased linear through addmm.

    Stage 3 does not: DeepSpeedZeRoOffload wraps the module with ``zero.Init(module=...)``
    (parameter_offload.py:270), which replaces ``torch.nn.functional.linear`` with
    ``zero3_linear_wrap`` when ``memory_efficient_linear`` is on (partition_parameters.py:1090,
    :412-419; zero/config.py:346). For 3-D inputs that runs ``input.matmul(weight.t())`` and
    ``output += bias`` (zero/linear.py), a plain cuBLAS GEMM. The replacement is global and
    stays for the rest of the process.
    """
    value = knobs.extra.get("cublaslt_workspace_bytes")
    if value is not None:
        return _whole(value, "engine_config.cublaslt_workspace_bytes")
    arch = setup.architecture
    if arch is None:
        return 0
    if stage is Stage.PARAMETERS and knobs.memory_efficient_linear:
        return 0
    biased = arch.bias or arch.has_qkv_bias or arch.lm_head_bias
    return CUBLASLT_WORKSPACE if biased else 0


# --- the model ----------------------------------------------------------------------------------


def _check(setup: TrainingSetup, stage: Stage, knobs: Knobs) -> int:
    if setup.k is not None:
        raise InputError("k", "the deepspeed engine derives optimizer states from the optimizer")
    if setup.optimizer not in STATE_TENSORS:
        known = ", ".join(o.value for o in STATE_TENSORS)
        raise InputError("optimizer", f"the deepspeed engine models the torch optimizers {known}")
    if setup.precision not in (Precision.MIXED_FP16, Precision.MIXED_BF16):
        raise InputError(
            "precision",
            "the deepspeed engine models its fp16 and bf16 sections "
            "(mixed_fp16, mixed_bf16: 16-bit parameters with an fp32 master)",
        )
    want_fp16 = setup.precision is Precision.MIXED_FP16
    if (knobs.fp16 is True and not want_fp16) or (knobs.bf16 is True and want_fp16):
        raise InputError(
            "engine_config", f"its fp16/bf16 section contradicts precision {setup.precision.value}"
        )
    if setup.tp * setup.pp != 1:
        raise InputError("tp", "the deepspeed engine profile models plain data parallelism")
    optimizer_off = knobs.offload_optimizer or (
        setup.offload.optimizer if setup.offload.optimizer is not OffloadDevice.NONE else None
    )
    param_off = knobs.offload_param or (
        setup.offload.params if setup.offload.params is not OffloadDevice.NONE else None
    )
    if OffloadDevice.NVME in (optimizer_off, param_off):
        raise InputError("offload", "NVMe offload is not modelled by the deepspeed profile")
    if optimizer_off is not None and stage is Stage.NONE:
        raise InputError("offload.optimizer", "optimizer offload needs ZeRO stage 1 or higher")
    if param_off is not None and stage is not Stage.PARAMETERS:
        raise InputError("offload.params", "parameter offload needs ZeRO stage 3")
    if (
        knobs.grad_accumulation is not None
        and setup.batch is not None
        and knobs.grad_accumulation != setup.batch.grad_accumulation_steps
    ):
        raise InputError(
            "engine_config.gradient_accumulation_steps",
            "differs from batch.grad_accumulation_steps",
        )
    if (
        setup.batch is not None
        and knobs.micro_batch is not None
        and knobs.micro_batch != setup.batch.micro_batch_size
    ):
        raise InputError(
            "engine_config.train_micro_batch_size_per_gpu", "differs from batch.micro_batch_size"
        )
    return STATE_TENSORS[setup.optimizer]


def _with_offload(setup: TrainingSetup, knobs: Knobs) -> Knobs:
    from dataclasses import replace

    opt = knobs.offload_optimizer
    if opt is None and setup.offload.optimizer is not OffloadDevice.NONE:
        opt = setup.offload.optimizer
    par = knobs.offload_param
    if par is None and setup.offload.params is not OffloadDevice.NONE:
        par = setup.offload.params
    return replace(knobs, offload_optimizer=opt, offload_param=par)


@dataclass(frozen=True)
class DeepSpeedModel:
    convention: str = CONVENTION

    def estimate(self, setup: TrainingSetup, stage: Stage) -> StageEstimate:
        knobs = _with_offload(setup, parse_config(setup.engine_config))
        n_states = _check(setup, stage, knobs)
        adam = setup.optimizer in (Optimizer.ADAM, Optimizer.ADAMW)
        params, exact = param_list(setup)
        shape = step_shape(setup, knobs)
        world = setup.dp
        accumulation = knobs.grad_accumulation or (
            setup.batch.grad_accumulation_steps if setup.batch is not None else 1
        )
        if stage is Stage.NONE:
            layout = _stage0(params, n_states, shape, adam, accumulation)
        elif stage is Stage.PARAMETERS:
            # gradients accumulate in place in the persistent partition buffer (partition_grads)
            layout = _stage3(params, world, knobs, n_states, shape, adam, exact)
        else:
            layout = _stage12(params, world, stage, knobs, n_states, shape, adam, accumulation)
        cublaslt = cublaslt_workspace_bytes(setup, stage, knobs)
        workspaces = cublas_workspace_bytes(knobs.extra) + cublaslt
        states = sum(layout.resident_parts.values())
        components = dict(layout.resident_parts)
        components["cublas_workspaces"] = workspaces - cublaslt
        components["cublaslt_workspace"] = cublaslt
        components["held_outputs"] = shape.held
        resident = states + workspaces + shape.held
        notes = list(layout.notes)
        if knobs.offload_optimizer is not None and knobs.force_ds_cpu_optimizer:
            notes.append(
                "DeepSpeed refuses a client torch optimizer with optimizer offload "
                "unless zero_force_ds_cpu_optimizer is false (engine.py:2341-2346)"
            )
        peak = activations_at_peak = buffers_at_peak = None
        if shape.known:
            name, moment = max(layout.moments.items(), key=lambda kv: kv[1].total)
            peak = states + workspaces + moment.total
            activations_at_peak = moment.activations
            buffers_at_peak = sum(v for k, v in moment.buffers.items() if k != "held_outputs")
            for k, v in moment.buffers.items():
                components[f"peak.{k}"] = v
            components["peak.activations"] = moment.activations
            notes.append(f"peak moment: {name}")
        else:
            notes.append("peak needs model.architecture and batch")
        return StageEstimate(
            stage=stage,
            device=layout.device,
            cpu=layout.cpu,
            nvme=Placement(),
            resident=resident,
            activations=activations_at_peak,
            temporary_buffers=buffers_at_peak,
            peak=peak,
            components=components,
            cpu_buffers=layout.cpu_buffers,
            notes=tuple(notes),
        )


MODEL = DeepSpeedModel()
