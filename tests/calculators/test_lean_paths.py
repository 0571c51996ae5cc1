"""The lean paths of the memory answers give what the paths they replaced give.

The frozen dataclasses built with their fields set at once equal the constructor's; the model
states' placements and totals equal ``model_state_memory``'s (refusals included); the DeepSpeed
layouts' searches on prefix sums, their running largest and their copies under an Nd that
divides every size equal the walks as first written (the oracles here); a setup under another
Nd equals ``dataclasses.replace``'s."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.caching_allocator import block
from calculators.conventions import (
    GradientConvention,
    OffloadDevice,
    Optimizer,
    Precision,
    Stage,
)
from calculators.engines.deepspeed import layouts
from calculators.engines.deepspeed.allocator import blocks
from calculators.engines.deepspeed.config import Knobs, knobs_with
from calculators.errors import InputError
from calculators.memory import with_dp
from calculators.model_states import (
    Offload,
    Placement,
    TrainingSetup,
    model_state_memory,
    model_state_placements,
    model_state_placements_each,
    model_state_total,
    placement,
)
from calculators.parameters import ParamTensor
from tests.calculators.test_aggregated_walks import groups_walk

HALF = 2

# --- the walks as first written ----------------------------------------------------------------


def copies_walk(plan: layouts.Stage3, world: int) -> int:
    """The largest padded copy of a stage-3 bucket, every bucket's sizes partitioned."""
    return max(
        (
            0
            if single is not None and single % world == 0
            else block(HALF * world * sum(count * -(-n // world) for n, count in sizes))
        )
        for single, sizes in plan.buckets
    )


# --- generated element counts: runs of equal sizes and empty tensors ---------------------------

sizes = st.one_of(st.just(0), st.integers(1, 40), st.integers(1, 3000))
runs = st.lists(st.tuples(sizes, st.integers(1, 6)), max_size=12).map(
    lambda rs: [n for n, count in rs for _ in range(count)]
)
long_runs = st.lists(st.tuples(sizes, st.integers(1, 60)), max_size=12).map(
    lambda rs: [n for n, count in rs for _ in range(count)]
)


def tensors(numels: list[int]) -> list[ParamTensor]:
    return [ParamTensor(f"p{i}", (n,)) for i, n in enumerate(numels)]


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(
    numels=runs.filter(any),
    world=st.integers(1, 9),
    size=st.integers(1, 6000),
    divisible=st.booleans(),
)
def test_sub_groups_are_the_walk(numels: list[int], world: int, size: int, divisible: bool) -> None:
    if divisible:  # every size a multiple of Nd: the search on the flat group's offsets
        numels = [n * world for n in numels]
    facts = layouts.ParamFacts(tensors(numels))
    local = sum(-(-n // world) for n in numels)
    assert layouts._sub_groups(facts, world, local, size) == groups_walk(numels, world, size)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    numels=runs.filter(any),
    world=st.integers(1, 9),
    bucket=st.sampled_from([1, 40, 300, 5_000, 500_000_000]),
    divisible=st.booleans(),
)
def test_stage3_copies_are_the_walk(
    numels: list[int], world: int, bucket: int, divisible: bool
) -> None:
    if divisible:  # the largest copy worked out once for every such Nd
        numels = [n * world for n in numels]
    knobs = Knobs(reduce_bucket_size=bucket)
    shape = layouts.StepShape(None, 0, 0, 0)
    plan = layouts.Stage3(layouts.ParamFacts(tensors(numels)), knobs, 2, shape, True, True)
    moment = plan.layout(world).moments["gradient_reduction"]
    assert moment.buffers["reduce_scatter_buffer"] == copies_walk(plan, world)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(numels=runs.filter(any), bucket=st.integers(1, 6000))
def test_bucket_allocations_are_the_walk(numels: list[int], bucket: int) -> None:
    facts = layouts.ParamFacts(tensors(numels))
    extents = facts.bucket_extents(bucket, backward=False)
    ranges = facts.ranges(bucket, backward=False)
    assert [e[2] for e in extents] == [blocks(HALF, numels[a:b]) for a, b in ranges]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(numels=long_runs.filter(any))
def test_largest_of_first_is_the_walk(numels: list[int]) -> None:
    facts = layouts.ParamFacts(tensors(numels))
    for count in range(len(numels) + 1):
        assert facts.largest_of_first(count) == max(numels[:count], default=0)


# --- frozen dataclasses built at once ------------------------------------------------------------


def test_placement_is_the_constructors() -> None:
    built = placement(2, 3, 5)
    assert built == Placement(2, 3, 5)
    assert vars(built) == vars(Placement(2, 3, 5))
    assert built.total == 10
    with pytest.raises(FrozenInstanceError):
        built.parameters = 0  # type: ignore[misc]


def test_moment_and_layout_are_frozen_dataclasses() -> None:
    moment = layouts.Moment(3, {"a": 4, "b": -1})
    assert moment.total == 6
    assert moment == layouts.Moment(3, {"a": 4, "b": -1})
    assert moment != layouts.Moment(3, {"a": 5, "b": -1})
    assert replace(moment, activations=5).total == 8
    with pytest.raises(FrozenInstanceError):
        moment.total = 0  # type: ignore[misc]
    kept = {"resident_parts": {"x": 1}, "device": placement(1, 0, 0), "cpu": Placement()}
    rest = {"cpu_buffers": 0, "moments": {"m": moment}, "notes": ["n"]}
    layout = layouts.Layout(**kept, **rest)  # type: ignore[arg-type]
    assert layout == layouts.Layout(**kept, **rest)  # type: ignore[arg-type]
    assert vars(layout) == {**kept, **rest}
    with pytest.raises(FrozenInstanceError):
        layout.notes = []  # type: ignore[misc]


# --- the model states ------------------------------------------------------------------------

setups = st.builds(
    TrainingSetup,
    params=st.integers(1, 10**13),
    dp=st.integers(1, 5000),
    tp=st.sampled_from([1, 2, 8]),
    precision=st.sampled_from(list(Precision)),
    optimizer=st.sampled_from(list(Optimizer)),
    k=st.one_of(st.none(), st.fractions(0, 40, max_denominator=7)),
    gradients=st.sampled_from(list(GradientConvention)),
    master_weights=st.booleans(),
    offload=st.builds(
        Offload,
        optimizer=st.sampled_from(list(OffloadDevice)),
        params=st.sampled_from(list(OffloadDevice)),
    ),
)


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(setup=setups, stage=st.sampled_from(list(Stage)))
def test_placements_and_total_are_model_state_memorys(setup: TrainingSetup, stage: Stage) -> None:
    try:
        states = model_state_memory(setup, stage)
    except InputError as refused:
        for lean in (model_state_placements, model_state_total):
            with pytest.raises(InputError) as caught:
                lean(setup, stage)
            assert (caught.value.field, caught.value.message) == (refused.field, refused.message)
        return
    assert model_state_placements(setup, stage) == (states.device, states.cpu, states.nvme)
    assert model_state_total(setup, stage) == states.device.total


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(setup=setups, stages=st.lists(st.sampled_from(list(Stage)), min_size=1, max_size=4))
def test_each_stages_placements_are_model_state_placements(
    setup: TrainingSetup, stages: list[Stage]
) -> None:
    """One look-up of Ψ and the bytes per parameter for all the stages: each stage's
    placements, and the first refusal where the stage-by-stage walk meets it."""
    walked: list[tuple[Placement, Placement, Placement] | tuple[str, str]] = []
    for stage in stages:
        try:
            walked.append(model_state_placements(setup, stage))
        except InputError as refused:
            walked.append((refused.field, refused.message))
            break
    each: list[tuple[Placement, Placement, Placement] | tuple[str, str]] = []
    try:
        each.extend(model_state_placements_each(setup, stages))
    except InputError as refused:
        each.append((refused.field, refused.message))
    assert each == walked


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"offload_optimizer": OffloadDevice.CPU, "offload_param": None},
        {"leaves": frozenset({0, 3}), "steps": None, "recompute": True},
        {"qwz": True, "qgz": False, "hpz": 8},
    ],
)
def test_knobs_with_is_replace(changes: dict[str, object]) -> None:
    knobs = Knobs(reduce_bucket_size=7, extra={"optimizer": {"type": "Adam"}})
    lean = knobs_with(knobs, **changes)
    assert lean == replace(knobs, **changes)  # type: ignore[arg-type]
    assert vars(lean) == vars(replace(knobs, **changes))  # type: ignore[arg-type]
    assert knobs.reduce_bucket_size == 7 and knobs.leaves == frozenset()  # the original untouched
    with pytest.raises(FrozenInstanceError):
        lean.qwz = True  # type: ignore[misc]


def test_knobs_with_refuses_a_name_as_replace() -> None:
    with pytest.raises(TypeError):
        replace(Knobs(), no_such_knob=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        knobs_with(Knobs(), no_such_knob=1)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(setup=setups, dp=st.integers(1, 10**6))
def test_with_dp_is_replace(setup: TrainingSetup, dp: int) -> None:
    moved = with_dp(setup, dp)
    assert moved == replace(setup, dp=dp)
    assert vars(moved) == vars(replace(setup, dp=dp))
    assert setup.dp == vars(setup)["dp"]  # the original untouched


@pytest.mark.parametrize("dp", [0, -3])
def test_with_dp_refuses_as_the_constructor(dp: int) -> None:
    setup = TrainingSetup(params=10, dp=4, k=Fraction(12))
    with pytest.raises(InputError) as caught:
        replace(setup, dp=dp)
    with pytest.raises(InputError) as lean:
        with_dp(setup, dp)
    assert (lean.value.field, lean.value.message) == (caught.value.field, caught.value.message)


# --- one model's parameter facts, shared by the requests about it -------------------------------


def test_one_architectures_facts_serve_every_request_about_it() -> None:
    from calculators.parameters import architecture_params
    from calculators.presets import get_preset

    llama, gpt2 = get_preset("llama3-8b").architecture, get_preset("gpt2").architecture
    facts = layouts.param_facts(architecture_params(llama))
    assert layouts.param_facts(architecture_params(llama)) is facts
    assert layouts.param_facts(architecture_params(gpt2)) is not facts
    # a bare count's one-tensor list is not kept
    bare = (ParamTensor("model", (1000,)),)
    assert layouts.param_facts(bare) is not layouts.param_facts(bare)


def test_shared_facts_remember_a_bounded_number_of_bucket_sizes() -> None:
    facts = layouts.ParamFacts(tensors([7, 5, 9, 3, 11, 2]))
    fresh = layouts.ParamFacts(tensors([7, 5, 9, 3, 11, 2]))
    for bucket in range(1, 3 * layouts._REMEMBERED):
        assert facts.bucket_extents(bucket, backward=True) == fresh.bucket_extents(bucket, True)
        assert facts.backward_buckets(bucket) == layouts.ParamFacts(
            tensors([7, 5, 9, 3, 11, 2])
        ).backward_buckets(bucket)
    for cache in (facts._ranges, facts._extents, facts._buckets):
        assert 0 < len(cache) <= layouts._REMEMBERED


def test_stage3_kept_is_remembered_per_equal_config() -> None:
    facts = layouts.ParamFacts(tensors([7, 5, 9, 3, 11, 2]))
    first = facts.stage3_kept(Knobs(reduce_bucket_size=10), True)
    # an equal config read from another request: the same outcome, worked out once
    assert facts.stage3_kept(Knobs(reduce_bucket_size=10), True) is first
    other = facts.stage3_kept(Knobs(reduce_bucket_size=10, param_persistence_threshold=8), True)
    assert other == layouts.ParamFacts(tensors([7, 5, 9, 3, 11, 2])).stage3_kept(
        Knobs(reduce_bucket_size=10, param_persistence_threshold=8), True
    )
    assert facts.stage3_kept(Knobs(reduce_bucket_size=10), True, views=False) is not first
