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
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.architecture import Architecture, Norm, PositionEmbedding
from calculators.batch import Batch, Checkpointing
from calculators.caching_allocator import BLOCK, K_SMALL_SIZE, block
from calculators.conventions import Precision, Stage
from calculators.engines.deepspeed import layouts, stage3
from calculators.engines.deepspeed.allocator import (
    replay_mallocs,
    stage0_unsplit_bytes,
)
from calculators.engines.deepspeed.buckets import fallback_buckets, ipg_walk, partition_share
from calculators.engines.deepspeed.config import Knobs, model_steps
from calculators.engines.deepspeed.stage3 import (
    Stage3Trace,
    _Run,
    _stage3_trace,
    _trace_by_template,
    gathered_numels,
    persistent_flags,
    reduce_scatter_buffer,
    stage3_plan,
    sub_groups,
)
from calculators.engines.deepspeed.stage3 import (
    _set as set_lane,
)
from calculators.engines.torch import memory as torch_memory
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
    ] + [numels[i] for i in trace.root_backward if i != last]


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
    assert stage0_unsplit_bytes(tuple(numels), n_states, adam) == replay_mallocs(
        large, n_states, adam
    )


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
    # transformers' parameterless modules, as the engine reads them from the architecture
    knobs = replace(knobs, steps=model_steps(arch))
    numels = [p.numel for p in listed]
    assert list(param_numels(runs)) == numels
    assert tally(param_numels(runs)) == Counter(numels)
    trace_knobs = (
        knobs.param_persistence_threshold,
        knobs.model_persistence_threshold,
        knobs.max_live_parameters,
        knobs.prefetch_bucket_size,
        knobs.max_reuse_distance,
        frozenset(),
        knobs.steps,
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


def _widest_moe(**changes: int) -> Architecture:
    from bench.calc_bench import MANY_EXPERTS

    fields: dict[str, Any] = {**MANY_EXPERTS, **changes}
    fields["norm"] = Norm(fields["norm"])
    fields["position_embedding"] = PositionEmbedding(fields["position_embedding"])
    return Architecture(**fields)


def test_the_widest_moe_trace_is_one_stretch_per_block_part() -> None:
    # 16 × 4,096 experts of persistent tensors: the routers are the only fetches that own a
    # tensor that can be released, so the 16 blocks are one run each way (a block's experts
    # one stretch in it) and the trace is short however many experts there are
    arch = _widest_moe()
    runs = architecture_params(arch)
    numel = param_numels(runs)
    flags, _ = persistent_flags(numel, Knobs().param_persistence_threshold, 2**63 - 1)
    forward, backward, _ = _trace_by_template(runs, numel, flags, True, frozenset())
    blocks = [s for s in forward + backward if isinstance(s, _Run)]
    assert [s.copies for s in blocks] == [arch.layers] * 2
    assert [len([b for b in s.body if b.params is not None]) for s in blocks] == [1, 1]
    assert len(forward) + len(backward) < 16
    assert "tensors" not in vars(runs)  # no tensor was named


def test_released_experts_are_one_run_per_block() -> None:
    # hidden 512: each expert's tensors (262,144 elements) are over the persistence
    # threshold, so each block's 4,096 experts are one run of released copies each way
    arch = _widest_moe(hidden=512, ffn_hidden=512)
    runs = architecture_params(arch)
    numel = param_numels(runs)
    flags, _ = persistent_flags(numel, Knobs().param_persistence_threshold, 2**63 - 1)
    forward, backward, _ = _trace_by_template(runs, numel, flags, True, frozenset())
    experts = [s for s in forward + backward if isinstance(s, _Run)]
    assert [s.copies for s in experts] == [arch.num_experts] * (2 * arch.layers)
    assert len(forward) + len(backward) < 20 * arch.layers


# --- released copies played at once --------------------------------------------------------------


@st.composite
def released_copies(draw: st.DrawFn) -> Architecture:
    """Many identical experts (or blocks) of a few small tensors, for knobs drawn on their
    scale: the prefetch head, the live-element cap and the reuse distance cross runs of copies
    in every way."""
    experts = draw(st.sampled_from([1, 5, 24, 40]))
    return Architecture(
        layers=draw(st.integers(1, 3)) if experts > 1 else draw(st.integers(2, 30)),
        hidden=draw(st.sampled_from([4, 8, 16])),
        heads=2,
        vocab_size=draw(st.sampled_from([7, 300])),
        ffn_hidden=draw(st.sampled_from([None, 6, 24])),
        num_experts=experts,
        experts_per_token=min(experts, 2),
        gated_mlp=draw(st.booleans()),
        bias=draw(st.booleans()),
        tied_embeddings=draw(st.booleans()),
        norm=draw(st.sampled_from(list(Norm))),
        position_embedding=PositionEmbedding.ROPE,
    )


def _scaled(top: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([0, 10**9]), st.integers(1, top))


trace_knobs_drawn = st.tuples(
    st.sampled_from([0, 5, 20, 63, 64, 100, 400, 100_000]),  # parameter persistence
    st.sampled_from([2**63 - 1, 2**63 - 1, 0, 2_000]),  # model persistence
    _scaled(40_000),  # max live parameters
    _scaled(4_000),  # prefetch bucket
    _scaled(300_000),  # max reuse distance
)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(arch=released_copies(), knobs=trace_knobs_drawn)
def test_released_copies_walk_as_the_tensors_do(
    arch: Architecture, knobs: tuple[int, int, int, int, int]
) -> None:
    runs = architecture_params(arch)
    listed = tuple(runs.tensors)
    assert _stage3_trace(runs, *knobs) == reference_trace(listed, *knobs)


def _played_at_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many copies each run of copies played at once covered (one entry per parameter
    of the pattern copy whose gathered flag was set)."""
    played: list[int] = []

    def counted(values: list[Any], x: int, dx: int, lo: int, hi: int, new: list[Any]) -> None:
        if new and type(new[0]) is bool:
            played.append(hi - lo)
        set_lane(values, x, dx, lo, hi, new)

    monkeypatch.setattr(stage3, "_set", counted)
    return played


@pytest.mark.parametrize(
    ("knobs", "at_once"),
    [
        # persistence, model persistence, max live, prefetch bucket, max reuse distance
        ((1_000, 2**63 - 1, 1_000_000, 50_000, 1_000_000), True),  # the reuse decision flips
        ((1_000, 2**63 - 1, 1_000_000, 50_000, 10**12), True),  # all kept into backward
        ((1_000, 2**63 - 1, 0, 50_000, 0), True),  # no prefetch: fetched on demand
        ((0, 2**63 - 1, 300_000, 10_000, 500_000), True),  # biases and norms released too
        # the first prefetch gathers everything: the queue is exhausted at once and each
        # tensor's uses play out on their own
        ((1_000, 2**63 - 1, 10**12, 10**12, 3_000_000), False),
    ],
)
def test_a_wide_moe_plays_its_released_experts_at_once(
    knobs: tuple[int, int, int, int, int], at_once: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    arch = Architecture(
        layers=2,
        hidden=64,
        heads=4,
        vocab_size=1000,
        ffn_hidden=64,
        num_experts=512,
        experts_per_token=2,
        bias=True,
        position_embedding=PositionEmbedding.ROPE,
    )
    runs = architecture_params(arch)
    listed = tuple(runs.tensors)
    played = _played_at_once(monkeypatch)
    _stage3_trace.cache_clear()
    assert _stage3_trace(runs, *knobs) == reference_trace(listed, *knobs)
    # forward and backward walk each block's experts: most of them played at once
    assert (sum(played) >= 2 * arch.layers * arch.num_experts * 0.8) is at_once


@st.composite
def blocks_of_few_experts(draw: st.DrawFn) -> Architecture:
    """Many blocks, each a few experts: a block's experts are written out step by step, so
    the blocks make one run of copies each way."""
    experts = draw(st.integers(2, 6))
    return Architecture(
        layers=draw(st.integers(2, 24)),
        hidden=draw(st.sampled_from([4, 8])),
        heads=2,
        vocab_size=draw(st.sampled_from([7, 300])),
        ffn_hidden=draw(st.sampled_from([None, 6])),
        num_experts=experts,
        experts_per_token=2,
        gated_mlp=draw(st.booleans()),
        bias=draw(st.booleans()),
        tied_embeddings=draw(st.booleans()),
        position_embedding=PositionEmbedding.ROPE,
    )


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(arch=blocks_of_few_experts(), knobs=trace_knobs_drawn)
def test_blocks_of_few_experts_walk_as_the_tensors_do(
    arch: Architecture, knobs: tuple[int, int, int, int, int]
) -> None:
    runs = architecture_params(arch)
    assert _stage3_trace(runs, *knobs) == reference_trace(tuple(runs.tensors), *knobs)


def test_many_blocks_of_few_experts_are_one_run_played_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 120 blocks of 4 experts, every tensor released: the blocks are one run each way (their
    # experts written out in the run's body), and over half of them are played at once
    arch = Architecture(
        layers=120,
        hidden=16,
        heads=2,
        vocab_size=300,
        ffn_hidden=12,
        num_experts=4,
        experts_per_token=2,
        bias=True,
        position_embedding=PositionEmbedding.ROPE,
    )
    runs = architecture_params(arch)
    numel = param_numels(runs)
    flags, _ = persistent_flags(numel, 0, 2**63 - 1)
    forward, backward, _ = _trace_by_template(runs, numel, flags, True, frozenset())
    blocks = [s for s in forward + backward if isinstance(s, _Run)]
    assert [s.copies for s in blocks] == [arch.layers] * 2
    knobs = (0, 2**63 - 1, 300_000, 10_000, 500_000)
    played = _played_at_once(monkeypatch)
    _stage3_trace.cache_clear()
    assert _stage3_trace(runs, *knobs) == reference_trace(tuple(runs.tensors), *knobs)
    assert max(played) >= arch.layers // 2


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(arch=architectures())
def test_torch_reads_of_a_param_list_are_the_named_tensors(arch: Architecture) -> None:
    """What the torch engines read from an architecture's ParamList (shapes, sizes, the root
    FSDP group, the number of FSDP groups, each block's tensors) equals the same read over its
    named tensors."""
    params = architecture_params(arch)
    named = tuple(params.tensors)
    assert shape_counts(params) == Counter(p.shape for p in named)
    assert elements(params, 0) == [p.numel for p in named]
    assert torch_traffic._root_params(params) == torch_traffic._root_params(named)
    assert torch_traffic._fsdp_groups(params) == torch_traffic._fsdp_groups(named)
    root, last = torch_memory.root_and_last_block(params)
    named_root, named_last = torch_memory.root_and_last_block(named)
    assert root == named_root
    assert Counter(p.shape for p in last) == Counter(p.shape for p in named_last)
    # block by block: each kind's block of the list, repeated, is the named blocks' shapes
    runs = [
        Counter(p.shape for p in tensors)
        for count, tensors in torch_memory.block_runs(params)
        for _ in range(count)
    ]
    named_runs = [
        Counter(p.shape for p in tensors) for _, tensors in torch_memory.block_runs(named)
    ]
    assert runs == named_runs
