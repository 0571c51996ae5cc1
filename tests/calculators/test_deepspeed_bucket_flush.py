"""Stages 1/2 reducing buckets from the gradient hooks: what backward still holds at each flush.

DeepSpeed reduces a bucket when the next gradient would overflow it, so the flush happens inside
the backward of that gradient's block. The layout counts, for each flush, the activations of
the blocks backward has not finished; a walk over the named tensors, one gradient at a time,
finds the same block for every flush.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from calculators.architecture import Architecture
from calculators.batch import Batch, Checkpointing
from calculators.conventions import Precision, Stage
from calculators.engines.deepspeed import layouts
from calculators.engines.deepspeed.config import Knobs
from calculators.hf_config import architecture_from_hf_config
from calculators.model_states import TrainingSetup
from calculators.parameters import architecture_params, implied_params, shape_at
from measure.hf_families import family_config


def _flushes(arch: Architecture, bucket: int) -> list[tuple[int | None, tuple[int, ...]]]:
    """For each bucket reduced during backward, the block whose gradient overflowed it (None:
    outside the blocks) and that parameter's shape, walked gradient by gradient as the hooks
    see them."""
    tensors = list(architecture_params(arch))
    held, out = 0, []
    for i in range(len(tensors) - 1, -1, -1):
        n = tensors[i].numel
        if n == 0:
            continue
        if held and held + n > bucket:
            group = tensors[i].group
            block = int(group.split(".")[1]) if group.startswith("blocks.") else None
            out.append((block, tensors[i].shape))
            held = 0
        held += n
    return out


def _expected(
    shape: layouts.StepShape,
    arch: Architecture,
    block: int | None,
    dims: tuple[int, ...],
    below_embedding: bool,
) -> int:
    acts = shape.acts
    assert acts is not None
    if block is None:
        if below_embedding:
            return acts.embedding + shape.block_input
        return shape.end_of_forward - shape.log_softmax_out - shape.logits_path_freed
    # a linear's weight gradient: its output's and its input's gradients alive beside it
    linear = shape.token_bytes * sum(dims) if len(dims) == 2 else 0
    return (
        acts.embedding
        + -(-acts.layers * (block + 1) // arch.layers)
        + acts.recompute
        + max(2 * shape.block_input, linear)
    )


@pytest.mark.parametrize("family", ["llama", "qwen2_moe", "deepseek_v3", "gemma2"])
@pytest.mark.parametrize("checkpointing", [Checkpointing.NONE, Checkpointing.FULL])
@pytest.mark.parametrize("bucket", [300_000, 2_000_000, 40_000_000])
def test_each_flush_counts_the_blocks_backward_has_not_finished(
    family: str, checkpointing: Checkpointing, bucket: int
) -> None:
    arch = architecture_from_hf_config(family_config(family, "small"))
    batch = Batch(2, 256, checkpointing)
    setup = TrainingSetup(
        params=1, dp=4, architecture=arch, batch=batch, precision=Precision.MIXED_BF16
    )
    knobs = replace(Knobs(), reduce_bucket_size=bucket)
    shape = layouts.step_shape(setup, knobs)
    facts = layouts.ParamFacts(architecture_params(arch))
    stage = layouts.Stage12(facts, Stage.GRADIENTS, knobs, 2, shape, True, 1)
    flushes = _flushes(arch, bucket)
    assert len(stage.flush_activations) == len(flushes)
    first_block = facts.block_bounds[0]
    for (lo, *_), (block, dims), got in zip(
        stage.extents, flushes, stage.flush_activations, strict=False
    ):
        assert got == _expected(shape, arch, block, dims, lo - 1 < first_block)


@pytest.mark.parametrize(
    "model",
    [
        *(family_config(f, "tiny") for f in ("llama", "qwen2_moe", "deepseek_v3", "phi3")),
        7_500_000_123,  # a bare count: the implied decoder, its first block grown
    ],
)
def test_shapes_read_from_the_template_are_the_listed_ones(model: dict[str, Any] | int) -> None:
    params = (
        implied_params(model)
        if isinstance(model, int)
        else architecture_params(architecture_from_hf_config(model))
    )
    assert params is not None
    facts = layouts.ParamFacts(params)
    listed = layouts.ParamFacts(tuple(params))
    assert [shape_at(params, i) for i in range(len(params))] == [t.shape for t in params]
    assert facts.block_bounds == listed.block_bounds


def test_a_flush_mid_backward_can_set_the_peak() -> None:
    # a ~0.9B model at Nd 4 with DeepSpeed's default 5e8-element buckets: every bucket spans
    # partitions, so the first flush flattens a 1 GB copy while most blocks still hold their
    # checkpointed inputs (measured: bench/results/hf_nccl_nd4_deepspeed_medium_stage2_full.json)
    arch = architecture_from_hf_config(family_config("llama", "medium"))
    batch = Batch(2, 1024, Checkpointing.FULL)
    setup = TrainingSetup(
        params=1, dp=4, architecture=arch, batch=batch, precision=Precision.MIXED_BF16
    )
    knobs = Knobs()
    shape = layouts.step_shape(setup, knobs)
    layout = layouts.stage12(
        architecture_params(arch), 4, Stage.GRADIENTS, knobs, 2, shape, True, 1
    )
    moment = layout.moments["gradient_reduction"]
    assert moment.activations > 0
    assert moment.total == max(m.total for m in layout.moments.values())
