"""The DeepSpeed walks read an architecture's identical tensors in runs: element counts laid out
from the first block and expert (``ParamList``), size tallies, prefix-sum searches, and a
stage-3 trace whose persistent fetches and identical experts are stretches. Each gives exactly
what the tensor-by-tensor walk it replaced gives: the loops as first written are the oracles
here, and every layout, plan and trace of an architecture's ``ParamList`` equals the one of the
same tensors listed one by one."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from itertools import accumulate

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.architecture import Architecture, Norm, PositionEmbedding
from calculators.batch import Batch, Checkpointing
from calculators.conventions import Precision, Stage
from calculators.engines.deepspeed import layouts
from calculators.engines.deepspeed.allocator import (
    BLOCK,
    K_SMALL_SIZE,
    _replay,
    block,
    stage0_unsplit_bytes,
)
from calculators.engines.deepspeed.buckets import fallback_buckets, ipg_walk, partition_share
from calculators.engines.deepspeed.config import Knobs
from calculators.engines.deepspeed.stage3 import (
    Stage3Trace,
    _stage3_trace,
    gathered_numels,
    persistent_flags,
    reduce_scatter_buffer,
    stage3_plan,
    sub_groups,
)
from calculators.engines.torch import traffic as torch_traffic
from calculators.hf_config import architecture_from_hf_config
from calculators.model_states import TrainingSetup
from calculators.parameters import (
    ROOT_GROUP,
    ParamList,
    ParamTensor,
    architecture_params,
    param_numels,
    shape_counts,
    tally,
)
from calculators.traffic import elements
from measure.hf_families import FAMILIES, family_config
from tests.calculators.test_stage3_trace import reference_trace

HALF = 2

# --- the loops as first written ----------------------------------------------------------------


def share_walk(numels: list[int], part: int) -> tuple[int, int]:
    g_p, start, max_slice = 0, 0, 0
    for n in numels:
        if start < part:
            g_p += n
            max_slice = max(max_slice, min(n, part - start))
        start += n
    return g_p, max_slice


def groups_walk(numels: list[int], world: int, size: int) -> list[int]:
    groups: list[int] = []
    current = 0
    for n in numels:
        current += -(-n // world)
        if current >= size:
            groups.append(current)
            current = 0
    if current:
        groups.append(current)
    return groups


def fallback_walk(numels: list[int], bucket: int) -> list[int]:
    out: list[int] = []
    current = 0
    for n in numels:
        current += n
        if current > bucket:
            out.append(current)
            current = 0
    if current:
        out.append(current)
    return out


def persistent_walk(numels: list[int], persistence: int, model: int) -> tuple[bool, ...]:
    flags, total = [], 0
    for n in numels:
        flag = n <= persistence and (total + n <= model)
        total += n if flag else 0
        flags.append(flag)
    return tuple(flags)


def reduce_scatter_walk(numels: list[int], bucket: int, world: int) -> int:
    order = numels[::-1]
    buckets = [[order[m] for m in b] for b in ipg_walk(order, bucket)]
    return max(
        (
            0
            if len(b) == 1 and b[0] % world == 0
            else block(HALF * sum(-(-n // world) * world for n in b))
        )
        for b in buckets
    )


def gathered_walk(numels: list[int], trace: Stage3Trace) -> list[int]:
    last = len(numels) - 1
    return [
        n
        for i, (n, f, k) in enumerate(zip(numels, trace.persistent, trace.kept, strict=True))
        if not f and (k or i == last)
    ]


# --- generated element counts: runs of equal sizes and empty tensors ------------------------------

sizes = st.one_of(st.just(0), st.integers(1, 40), st.integers(1, 3000))
runs = st.lists(st.tuples(sizes, st.integers(1, 6)), max_size=12).map(
    lambda rs: [n for n, count in rs for _ in range(count)]
)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(numels=runs, part=st.integers(0, 5000))
def test_partition_share_is_the_walk(numels: list[int], part: int) -> None:
    offsets = [0, *accumulate(numels)]
    assert partition_share(numels, offsets, part) == share_walk(numels, part)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(numels=runs, world=st.integers(1, 9), size=st.integers(1, 6000))
def test_sub_groups_are_the_walk(numels: list[int], world: int, size: int) -> None:
    assert sub_groups(numels, world, size) == groups_walk(numels, world, size)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(numels=runs, bucket=st.integers(0, 6000))
def test_fallback_buckets_are_the_walk(numels: list[int], bucket: int) -> None:
    assert fallback_buckets(numels, bucket, whole_run=False) == fallback_walk(numels, bucket)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(numels=runs.filter(any), bucket=st.integers(0, 6000), world=st.integers(1, 9))
def test_reduce_scatter_buffer_is_the_walk(numels: list[int], bucket: int, world: int) -> None:
    assert reduce_scatter_buffer(numels, bucket, world) == reduce_scatter_walk(
        numels, bucket, world
    )


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(
    numels=runs,
    persistence=st.integers(0, 3000),
    model=st.sampled_from([0, 50, 2_000, 20_000, 2**63 - 1]),
)
def test_persistence_is_the_walk(numels: list[int], persistence: int, model: int) -> None:
    flags, by_size = persistent_flags(numels, persistence, model)
    assert flags == persistent_walk(numels, persistence, model)
    if by_size:
        assert flags == tuple(n <= persistence for n in numels)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    numels=st.lists(
        st.sampled_from([1, 1000, 262_144, 262_145, 300_000, 2_621_440, 5_000_000]), max_size=12
    ),
    n_states=st.integers(0, 2),
    adam=st.booleans(),
)
def test_allocator_replays_the_large_pool_alone(
    numels: list[int], n_states: int, adam: bool
) -> None:
    # the replay as first written filtered the tensors one by one by their fp32 block
    large = tuple(n for n in numels if max(block(4 * n), BLOCK) > K_SMALL_SIZE)
    assert stage0_unsplit_bytes(tuple(numels), n_states, adam) == _replay(large, n_states, adam)


# --- architectures: the runs against the tensors listed one by one -------------------------------


@st.composite
def architectures(draw: st.DrawFn) -> Architecture:
    heads = draw(st.sampled_from([1, 2, 4]))
    experts = draw(st.sampled_from([1, 2, 3, 8]))
    learned = draw(st.booleans())
    return Architecture(
        layers=draw(st.integers(1, 4)),
        hidden=heads * draw(st.sampled_from([2, 8, 32])),
        heads=heads,
        vocab_size=draw(st.sampled_from([7, 100, 1000])),
        ffn_hidden=draw(st.sampled_from([None, 12, 96])),
        num_experts=experts,
        experts_per_token=min(experts, 2),
        gated_mlp=draw(st.booleans()),
        bias=draw(st.booleans()),
        tied_embeddings=draw(st.booleans()),
        norm=draw(st.sampled_from(list(Norm))),
        position_embedding=PositionEmbedding.LEARNED
        if learned
        else draw(st.sampled_from([PositionEmbedding.ROPE, PositionEmbedding.NONE])),
        max_seq_len=16 if learned else None,
        embedding_norm=draw(st.booleans()),
        final_norm=draw(st.booleans()),
        kv_heads=draw(st.sampled_from([None, 1])),
        qkv_bias=draw(st.sampled_from([None, True, False])),
        lm_head_bias=draw(st.booleans()),
        embed_proj_dim=draw(st.sampled_from([None, 3, 8])),
    )


def _family(family: str) -> Architecture:
    # transformers' blocks: norms after the MLP, shared experts, fused experts, latent
    # attention and dense blocks before the MoE ones (DeepSeek-V3)
    arch = architecture_from_hf_config(family_config(family, "small"))
    return replace(arch, layers=min(arch.layers, 4)) if arch.modelling is None else arch


knobs_drawn = st.builds(
    Knobs,
    reduce_bucket_size=st.sampled_from([1, 300, 20_000, 500_000_000]),
    overlap_comm=st.sampled_from([None, True, False]),
    contiguous_gradients=st.booleans(),
    sub_group_size=st.sampled_from([1, 500, 1_000_000_000]),
    prefetch_bucket_size=st.sampled_from([0, 300, 20_000, 50_000_000]),
    param_persistence_threshold=st.sampled_from([0, 50, 200, 5_000, 100_000]),
    model_persistence_threshold=st.sampled_from([0, 1_000, 2**63 - 1]),
    max_live_parameters=st.sampled_from([0, 5_000, 50_000, 10**9]),
    max_reuse_distance=st.sampled_from([0, 100, 10_000, 10**9]),
)


def late_gradients_walk(params: tuple[ParamTensor, ...], tied: bool, accumulation: int) -> int:
    """First-block backward's gradients, as first written: every tensor's bar block 0's and
    those before it (a tied head's aside)."""
    first_block = next((i for i, p in enumerate(params) if p.group != ROOT_GROUP), len(params))
    late = {i for i, p in enumerate(params) if p.group == "blocks.0"}
    late |= {i for i in range(first_block) if not (tied and i == 0)}
    return sum(
        block(HALF * p.numel) for i, p in enumerate(params) if accumulation > 1 or i not in late
    )


def _same_walks(
    arch: Architecture, knobs: Knobs, world: int, batch: Batch | None, accumulation: int = 1
) -> None:
    runs = architecture_params(arch)
    assert isinstance(runs, ParamList)
    listed = tuple(runs.tensors)  # the same tensors, walked one by one
    numels = [p.numel for p in listed]
    assert list(param_numels(runs)) == numels
    assert tally(param_numels(runs)) == Counter(numels)
    trace_knobs = (
        knobs.param_persistence_threshold,
        knobs.model_persistence_threshold,
        knobs.max_live_parameters,
        knobs.prefetch_bucket_size,
        knobs.max_reuse_distance,
    )
    trace = _stage3_trace(runs, *trace_knobs)
    assert trace == _stage3_trace(listed, *trace_knobs) == reference_trace(listed, *trace_knobs)
    assert gathered_numels(param_numels(runs), trace) == gathered_walk(numels, trace)
    assert stage3_plan(runs, world, knobs) == stage3_plan(listed, world, knobs)
    setup = TrainingSetup(
        params=sum(numels),
        dp=world,
        architecture=arch,
        batch=batch,
        precision=Precision.MIXED_BF16,
    )
    shape = layouts.step_shape(setup, knobs)
    assert runs == listed
    acc = accumulation
    assert layouts.stage0(runs, 2, shape, True, acc) == layouts.stage0(listed, 2, shape, True, acc)
    for stage in (Stage.OPTIMIZER, Stage.GRADIENTS):
        assert layouts.stage12(runs, world, stage, knobs, 2, shape, True, acc) == layouts.stage12(
            listed, world, stage, knobs, 2, shape, True, acc
        )
    late = layouts.first_block_backward(shape, runs, acc, {})
    if late:
        grads = late["first_block_backward"].buffers["gradients"]
        assert grads == late_gradients_walk(listed, arch.tied_embeddings, acc)
    assert layouts.stage3(runs, world, knobs, 2, shape, True, True) == layouts.stage3(
        listed, world, knobs, 2, shape, True, True
    )


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    arch=architectures(),
    knobs=knobs_drawn,
    world=st.sampled_from([1, 2, 3, 8]),
    batch=st.sampled_from(
        [
            None,
            Batch(micro_batch_size=1, seq_len=8),
            Batch(1, 8, activation_checkpointing=Checkpointing.FULL),
        ]
    ),
    accumulation=st.sampled_from([1, 2]),
)
def test_runs_walk_as_the_tensors_do(
    arch: Architecture, knobs: Knobs, world: int, batch: Batch | None, accumulation: int
) -> None:
    _same_walks(arch, knobs, world, batch, accumulation)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(knobs=knobs_drawn, world=st.sampled_from([1, 3, 8]))
def test_transformers_blocks_walk_as_their_tensors_do(
    family: str, knobs: Knobs, world: int
) -> None:
    _same_walks(_family(family), knobs, world, Batch(1, 8, Checkpointing.FULL))


def test_the_widest_moe_trace_is_one_stretch_per_block_part() -> None:
    # 16 × 4,096 experts of persistent tensors: the routers are the only fetches walked one by
    # one, so the trace is short however many experts there are
    from bench.calc_bench import MANY_EXPERTS
    from calculators.engines.deepspeed.stage3 import _trace_by_template

    arch = Architecture(
        **{k: v for k, v in MANY_EXPERTS.items() if k not in ("norm", "position_embedding")},
        norm=Norm(MANY_EXPERTS["norm"]),
        position_embedding=PositionEmbedding(MANY_EXPERTS["position_embedding"]),
    )
    runs = architecture_params(arch)
    numel = param_numels(runs)
    flags, _ = persistent_flags(numel, Knobs().param_persistence_threshold, 2**63 - 1)
    forward, backward = _trace_by_template(runs, numel, flags)
    walked = [s for s in forward + backward if s.params is not None]
    assert len(walked) == 2 * arch.layers  # each block's router, forward and backward
    assert len(forward) + len(backward) < 8 * arch.layers
    assert "tensors" not in vars(runs)  # no tensor was named


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(arch=architectures())
def test_torch_reads_of_a_param_list_are_the_named_tensors(arch: Architecture) -> None:
    """What the torch engines read from an architecture's ParamList (shapes, sizes, the root
    FSDP group, the number of FSDP groups) equals the same read over its named tensors."""
    params = architecture_params(arch)
    named = tuple(params.tensors)
    assert shape_counts(params) == Counter(p.shape for p in named)
    assert elements(params, 0) == [p.numel for p in named]
    assert torch_traffic._root_params(params) == torch_traffic._root_params(named)
    assert torch_traffic._fsdp_groups(params) == torch_traffic._fsdp_groups(named)
