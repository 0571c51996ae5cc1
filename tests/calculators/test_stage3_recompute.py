"""Stage 3 with every decoder layer recomputed in backward (transformers' gradient
checkpointing): the coordinator simulation gives what the entry-by-entry walk gives on runs of
identical copies, and a layer's backward fetches come in the order DeepSpeed traced them (the
canonical decoder and every family with its MoE blocks as leaves or not are drawn in
``test_stage3_trace.py`` and ``test_stage3_leaf_modules.py``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.architecture import Architecture
from calculators.engines.deepspeed.config import model_steps
from calculators.engines.deepspeed.stage3 import _stage3_trace, fetch_order
from calculators.hf_config import architecture_from_hf_config
from calculators.parameters import architecture_params
from measure.hf_families import family_config
from tests.calculators.test_aggregated_walks import (
    blocks_of_few_experts,
    released_copies,
    trace_knobs_drawn,
)
from tests.calculators.test_stage3_trace import reference_trace

RECOMPUTED = (frozenset(), None, True)  # no leaf module, the canonical module, recomputed


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(arch=st.one_of(released_copies(), blocks_of_few_experts()), knobs=trace_knobs_drawn)
def test_recomputed_copies_walk_as_the_tensors_do(
    arch: Architecture, knobs: tuple[int, int, int, int, int]
) -> None:
    runs = architecture_params(arch)
    full = (*knobs, *RECOMPUTED)
    assert _stage3_trace(runs, *full) == reference_trace(tuple(runs.tensors), *full)


def test_a_recomputed_layer_is_fetched_again_after_its_last_modules() -> None:
    # Qwen2's layer, as DeepSpeed 0.19.8 traced it on the CPU under transformers' gradient
    # checkpointing (python3 -m bench.ds_cpu_gathers --families qwen2 --checkpointing full
    # --order): the layer, its MLP and down_proj (whose backward first reads what the
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
