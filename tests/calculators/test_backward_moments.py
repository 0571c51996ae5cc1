"""The moments inside a layer's backward (``calculators/transformers_activations.py``) and the
torch engines' peak moments built on them (``calculators/engines/torch/peak.py``)."""

from __future__ import annotations

import dataclasses

import pytest

from calculators.architecture import count_params, tensor_counts
from calculators.batch import Batch, Checkpointing
from calculators.conventions import Engine, Precision, Stage
from calculators.hf_config import architecture_from_hf_config
from calculators.memory import estimate
from calculators.model_states import TrainingSetup
from calculators.transformers_activations import final_norm_held, norms_backward
from measure.hf_families import FAMILIES, family_config

MLP_PARTS = {"mlp", "experts", "router", "shared_expert", "shared_expert_gate"}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_gradients_kept_are_the_mlp_weights(family: str) -> None:
    # what the pre-MLP norm's moment adds per byte of gradient is the MLP's parameter count as
    # the parameter list has it (router, experts, shared expert and its gate included)
    arch = architecture_from_hf_config(family_config(family))
    batch = Batch(2, 64)
    # the parameter list names one block of each kind (DeepSeek's dense first, then experts)
    blocks: dict[str, list[str]] = {}
    for t, _ in tensor_counts(arch):
        if t.name.startswith("blocks."):
            blocks.setdefault(".".join(t.name.split(".")[:2]), []).append(t.name)
    for block, names in blocks.items():
        dense = not any(n.split(".")[2] == "experts" for n in names)
        mlp = sum(
            t.numel
            for t, _ in tensor_counts(arch)
            if t.name in names and t.name.split(".")[2] in MLP_PARTS
        )
        # (bytes per element large enough that both lie above the moment's floor of 0)
        grown = norms_backward(arch, batch, "half", 102, dense) - norms_backward(
            arch, batch, "half", 100, dense
        )
        assert grown == 2 * mlp, (family, block)


def _setup(family: str, precision: Precision, micro: int, seq: int, dp: int = 1) -> TrainingSetup:
    arch = architecture_from_hf_config(family_config(family))
    return TrainingSetup(
        params=count_params(arch),
        dp=dp,
        precision=precision,
        engine=Engine.TORCH,
        architecture=arch,
        batch=Batch(micro, seq, Checkpointing.NONE),
    )


def _moments(setup: TrainingSetup, stage: Stage) -> dict[str, int]:
    est = estimate(setup, [stage]).stages[0]
    return {
        k.removeprefix("peak_candidate_"): v
        for k, v in est.components.items()
        if k.startswith("peak_candidate_")
    }


def test_the_final_norm_outlasts_the_loss_where_the_vocabulary_is_small() -> None:
    # a wide model with a small vocabulary in pure bf16 under DDP: the final norm's fp32
    # temporaries, every layer still saved, outweigh the loss's tokens x vocabulary gradients
    # (bench/results/step_fuzz: Mistral 2 x 512, vocabulary 100, read -3.83 % without them)
    config = {**family_config("mistral"), "vocab_size": 128, "hidden_size": 1024}
    arch = architecture_from_hf_config(config)
    setup = dataclasses.replace(
        _setup("mistral", Precision.BF16, 2, 512), params=count_params(arch), architecture=arch
    )
    moments = _moments(setup, Stage.OPTIMIZER)
    assert moments["final_norm_backward"] > moments["loss_backward"]
    # the same moment of a real vocabulary stays below the loss's
    real = _moments(_setup("llama", Precision.BF16, 2, 512), Stage.OPTIMIZER)
    assert real["final_norm_backward"] < real["loss_backward"]


def test_final_norm_held_counts_the_norms_fp32_temporaries() -> None:
    # in pure bf16 the norm's backward holds up to five fp32 tensors of its input's size beside
    # what it saved: its held bytes grow with the hidden size at 4 bytes x 5 per element at least
    arch = architecture_from_hf_config(family_config("llama"))
    wide = architecture_from_hf_config({**family_config("llama"), "hidden_size": 2 * arch.hidden})
    batch = Batch(2, 64)
    per_element = (final_norm_held(wide, batch, "half") - final_norm_held(arch, batch, "half")) / (
        batch.tokens * arch.hidden
    )
    assert per_element >= 5 * 4
