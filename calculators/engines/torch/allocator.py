"""The blocks the caching allocator hands FSDP2's sharded parameters and optimizer states.

The model is built on the device in fp32, then sharded, as ``measure/`` runs it and as a script
that builds on the GPU before ``fully_shard`` does:

1. every parameter is allocated in registration order (``AutoModelForCausalLM.from_config``
   under ``torch.device``); transformers then ties a tied head to the embedding
   (``tie_weights``), so the head's own weight is allocated and freed;
2. in bf16 precision ``model.to(torch.bfloat16)`` (``nn.Module._apply``) allocates each 16-bit
   copy and frees its fp32 tensor in turn;
3. ``fully_shard`` on each block, then on the root, allocates each parameter's padded shard
   (``_fsdp_param.py`` ``_init_sharded_param``: ``param_data.new_zeros(padded_sharded_size)``),
   and the unit's unsharded parameters are freed when the call returns;
4. the first optimizer step creates each parameter's states in turn (``torch.optim.adam``
   ``_init_group``: ``zeros_like`` of the local shard, ``exp_avg`` then ``exp_avg_sq``), cut
   here from the blocks the build left free and from new segments. By then forward and
   backward have left their own blocks in the cache, which the replay does not know: a state
   that one of them fits better is handed less than replayed, one that fits a block at most
   1 MiB too big more.

From the second unit on, the shards are carved from the blocks the earlier units freed; where a
cached block is at most 1 MiB larger than a shard it is handed out whole
(``calculators.caching_allocator``) and ``memory_allocated`` counts all of it, from then on, in
every figure. Other ways of building hand out other blocks and are not replayed: accelerate's
``fsdp2_prepare_model`` lets ``fully_shard`` move a model loaded on the CPU unit by unit, or with
``fsdp_cpu_ram_efficient_loading`` shards the model on the meta device and then loads each
parameter's shard.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from calculators.caching_allocator import K_SMALL_SIZE, Block, CachingAllocator, block
from calculators.parameters import ROOT_GROUP, ParamTensor, shape_counts

SHARD_BLOCKS = "allocator_shard_blocks"
STATE_BLOCKS = "allocator_state_blocks"
BLOCK_COMPONENTS = (SHARD_BLOCKS, STATE_BLOCKS)
"""The estimate components holding ``Excess.shards`` and ``Excess.states``: bytes the allocator
hands out beyond what the tensors ask for."""

MAX_REPLAYED_TENSORS = 8_000
"""Above this many parameter tensors (a MoE with every expert its own tensors) the replay is not
run: its cost grows with them (about 0.2 s at this many), and the figures say so in a note."""


@dataclass(frozen=True)
class Build:
    """How the model is built before ``fully_shard``.

    Attributes:
        element: bytes of one element of the sharded parameters (fp32, or 2 in bf16 precision).
        cast: the model is cast from fp32 to ``element`` bytes before sharding.
        tied_head: the shape of the head weight transformers allocates and then ties away.
        out_proj_first: each attention registers its output projection before its ``qkv``
            projection (Phi-3).
        states: the optimizer's state tensors per parameter (Adam: 2).
    """

    element: int
    cast: bool
    tied_head: tuple[int, ...] | None
    out_proj_first: bool
    states: int = 0


@dataclass(frozen=True)
class Excess:
    """Bytes handed out beyond the requests: to the shards and to the optimizer's states."""

    shards: int
    states: int


def _registration_order(ts: Sequence[ParamTensor], out_proj_first: bool) -> list[ParamTensor]:
    """``ts`` in the order the modules register them."""
    if not out_proj_first:
        return list(ts)
    out: list[ParamTensor] = []
    held: list[ParamTensor] = []  # a block's qkv projection, until its output projection
    for t in ts:
        if held and t.group != held[0].group:  # a block without an output projection
            out += held
            held = []
        if ".attn.qkv." in t.name:
            held.append(t)
            continue
        out.append(t)
        if held and ".attn.proj." in t.name:
            out += held
            held = []
    return out + held


def _shard_bytes(t: ParamTensor, world: int, element: int) -> int:
    return t.fsdp_shard_numel(world) * element


def _large(nbytes: int) -> bool:
    return block(nbytes) > K_SMALL_SIZE


@lru_cache(maxsize=64)
def block_excess(ts: Sequence[ParamTensor], world: int, build: Build) -> Excess | None:
    """Bytes the allocator hands rank 0's padded shards, and then its optimizer states, beyond
    what they ask for (module docstring), or ``None`` past ``MAX_REPLAYED_TENSORS``.

    The two pools share no block, so only the large pool is replayed; a small-pool shard or
    state is handed its request rounded to 512 bytes (``rounding_only``)."""
    if len(ts) > MAX_REPLAYED_TENSORS:
        return None
    large = [t for t in ts if _large(4 * t.numel)]
    order = _registration_order(large, build.out_proj_first)
    alloc = CachingAllocator()
    built: list[Block | None] = [alloc.malloc(4 * t.numel) for t in order]
    if build.tied_head is not None and _large(4 * math.prod(build.tied_head)):
        alloc.free(alloc.malloc(4 * math.prod(build.tied_head)))
    if build.cast:
        for i, t in enumerate(order):
            nbytes = build.element * t.numel
            copy = alloc.malloc(nbytes) if _large(nbytes) else None
            b = built[i]
            assert b is not None
            alloc.free(b)
            built[i] = copy
    units: dict[str, list[int]] = {}
    for i, t in enumerate(order):
        units.setdefault(t.group, []).append(i)
    root = units.pop(ROOT_GROUP, [])
    rounding = rounding_only(ts, world, build.element, small_only=True)
    shards = rounding
    for members in [*units.values(), root]:  # blocks in order, the root last
        for i in members:
            asked = _shard_bytes(order[i], world, build.element)
            if _large(asked):
                shards += alloc.malloc(asked).size - asked
        for i in members:
            b = built[i]
            if b is not None:
                alloc.free(b)
    # the first step's ``_init_group``: each parameter's states in turn (``zeros_like``), in
    # ``model.parameters()`` order, from what the build left free and from new segments
    states = build.states * rounding
    for t in order:
        asked = _shard_bytes(t, world, build.element)
        if _large(asked):
            for _ in range(build.states):
                states += alloc.malloc(asked).size - asked
    return Excess(shards, states)


def rounding_only(
    ts: Sequence[ParamTensor], world: int, element: int, small_only: bool = False
) -> int:
    """The shards' 512-byte rounding (``block``), the least the allocator adds; with
    ``small_only`` that of the shards the small pool serves."""
    total = 0
    for shape, count in shape_counts(ts).items():
        asked = ParamTensor("", shape).fsdp_shard_numel(world) * element
        if not (small_only and _large(asked)):
            total += count * (block(asked) - asked)
    return total
