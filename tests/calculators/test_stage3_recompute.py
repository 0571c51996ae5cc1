"""Stage 3 with every decoder layer recomputed in backward (transformers' gradient
checkpointing): the coordinator simulation gives what the entry-by-entry walk gives on the same
module trace, the recomputation's fetches included, for the canonical decoder and every
transformers family, with MoE blocks as leaf modules or not."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.architecture import Architecture, dense_layers
from calculators.engines.deepspeed.config import Knobs, model_steps
from calculators.engines.deepspeed.stage3 import _stage3_trace, fetch_order, stage3_trace
from calculators.hf_config import architecture_from_hf_config
from calculators.parameters import architecture_params
from measure.hf_families import FAMILIES, family_config
from tests.calculators.test_aggregated_walks import (
    blocks_of_few_experts,
    released_copies,
    trace_knobs_drawn,
)
from tests.calculators.test_stage3_trace import architectures, reference_trace

RECOMPUTED = (frozenset(), None, True)  # no leaf module, the canonical module, recomputed


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    arch=architectures(),
    persistence=st.sampled_from([0, 50, 200, 5_000, 100_000]),
    model_persistence=st.sampled_from([0, 1_000, 2**63 - 1]),
    max_live=st.sampled_from([0, 100, 5_000, 50_000, 10**9]),
    prefetch=st.sampled_from([0, 1, 300, 20_000, 5 * 10**7]),
    reuse=st.sampled_from([0, 100, 10_000, 10**9]),
)
def test_recomputed_trace_equals_the_entry_by_entry_walk(
    arch: Architecture,
    persistence: int,
    model_persistence: int,
    max_live: int,
    prefetch: int,
    reuse: int,
) -> None:
    params = architecture_params(arch)
    knobs = (persistence, model_persistence, max_live, prefetch, reuse, *RECOMPUTED)
    assert _stage3_trace(params, *knobs) == reference_trace(tuple(params), *knobs)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(arch=st.one_of(released_copies(), blocks_of_few_experts()), knobs=trace_knobs_drawn)
def test_recomputed_copies_walk_as_the_tensors_do(
    arch: Architecture, knobs: tuple[int, int, int, int, int]
) -> None:
    runs = architecture_params(arch)
    full = (*knobs, *RECOMPUTED)
    assert _stage3_trace(runs, *full) == reference_trace(tuple(runs.tensors), *full)


@st.composite
def families(draw: st.DrawFn) -> tuple[Architecture, frozenset[int]]:
    body = family_config(draw(st.sampled_from(FAMILIES)), "tiny")
    body.update(num_hidden_layers=draw(st.integers(1, 4)))
    arch = architecture_from_hf_config(body)
    moe = range(dense_layers(arch), arch.layers) if arch.num_experts > 1 else range(0)
    return arch, frozenset(moe) if draw(st.booleans()) else frozenset()


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    case=families(),
    persistence=st.sampled_from([0, 200, 5_000, 100_000]),
    max_live=st.sampled_from([0, 5_000, 50_000, 10**9]),
    prefetch=st.sampled_from([0, 300, 20_000, 5 * 10**7]),
    reuse=st.sampled_from([0, 1_000, 30_000, 150_000, 10**9]),
)
def test_recomputed_families_walk_as_the_coordinator_does(
    case: tuple[Architecture, frozenset[int]],
    persistence: int,
    max_live: int,
    prefetch: int,
    reuse: int,
) -> None:
    arch, leaves = case
    params = architecture_params(arch)
    knobs = Knobs(
        param_persistence_threshold=persistence,
        max_live_parameters=max_live,
        prefetch_bucket_size=prefetch,
        max_reuse_distance=reuse,
        leaves=leaves,
        steps=model_steps(arch),
        recompute=True,
    )
    listed = tuple(params)
    walked = reference_trace(
        listed, persistence, 2**63 - 1, max_live, prefetch, reuse, leaves, knobs.steps, True
    )
    assert stage3_trace(params, knobs) == walked
    assert stage3_trace(listed, knobs) == walked


def test_a_recomputed_layer_is_fetched_again_after_its_last_modules() -> None:
    # Qwen2's layer, as DeepSpeed 0.19.8 traced it on the CPU under transformers' gradient
    # checkpointing: the layer, its MLP and down_proj (whose backward first reads what the
    # layer saved), the layer's whole forward again, then the rest of its backward
    body = family_config("qwen2", "tiny")
    body.update(num_hidden_layers=1)
    arch = architecture_from_hf_config(body)
    _, backward = fetch_order(architecture_params(arch), steps=model_steps(arch), recompute=True)
    layer = [m for m in backward if m.startswith("blocks.0")]
    forward = [
        "blocks.0",
        "blocks.0.ln1",
        "blocks.0.attn",
        "blocks.0.attn.q",
        "blocks.0.attn.k",
        "blocks.0.attn.v",
        "blocks.0.attn.proj",
        "blocks.0.ln2",
        "blocks.0.mlp",
        "blocks.0.mlp.gate",
        "blocks.0.mlp.act_fn",
        "blocks.0.mlp.up",
        "blocks.0.mlp.down",
    ]
    rest = ["blocks.0.mlp.up", "blocks.0.mlp.act_fn", "blocks.0.mlp.gate", "blocks.0.ln2"]
    rest += ["blocks.0.attn", "blocks.0.attn.proj", "blocks.0.attn.v", "blocks.0.attn.k"]
    rest += ["blocks.0.attn.q", "blocks.0.ln1"]
    assert layer == ["blocks.0", "blocks.0.mlp", "blocks.0.mlp.down", *forward, *rest]
