"""The aggregated views of an architecture's tensors equal the tensor list they stand for."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.activations import linear_weight_elements
from calculators.architecture import (
    Activation,
    Architecture,
    Norm,
    PositionEmbedding,
    Tensor,
    count_params,
    tensor_counts,
    tensors,
)
from calculators.caching_allocator import block
from calculators.engines.deepspeed.allocator import blocks
from calculators.hf_config import architecture_from_hf_config
from calculators.parameters import (
    ROOT_GROUP,
    ParamTensor,
    architecture_params,
    fsdp_padded_total,
    fsdp_shard_total,
)
from calculators.presets import PRESETS
from measure.hf_families import FAMILIES, family_config


@st.composite
def architectures(draw: st.DrawFn) -> Architecture:
    heads = draw(st.sampled_from([1, 2, 4]))
    learned = draw(st.booleans())
    experts = draw(st.sampled_from([1, 2, 5, 12]))
    return Architecture(
        layers=draw(st.integers(1, 5)),
        hidden=heads * draw(st.sampled_from([1, 8, 16])),
        heads=heads,
        vocab_size=draw(st.integers(1, 999)),
        ffn_hidden=draw(st.sampled_from([None, 7, 33])),
        max_seq_len=draw(st.integers(1, 99)) if learned else None,
        kv_heads=draw(st.sampled_from([None, 1])),
        tied_embeddings=draw(st.booleans()),
        bias=draw(st.booleans()),
        qkv_bias=draw(st.sampled_from([None, True, False])),
        lm_head_bias=draw(st.booleans()),
        norm=draw(st.sampled_from(list(Norm))),
        position_embedding=PositionEmbedding.LEARNED
        if learned
        else draw(st.sampled_from([PositionEmbedding.ROPE, PositionEmbedding.NONE])),
        position_offset=draw(st.integers(0, 3)),
        gated_mlp=draw(st.booleans()),
        activation=draw(st.sampled_from(list(Activation))),
        num_experts=experts,
        experts_per_token=draw(st.integers(1, experts)),
        embedding_norm=draw(st.booleans()),
        final_norm=draw(st.booleans()),
        embed_proj_dim=draw(st.sampled_from([None, 3, 8])),
    )


def _key(t: Tensor) -> tuple[object, ...]:
    return (
        t.shape,
        t.tp_split,
        t.stage_hint,
        t.layer is None,
        t.name.startswith(("embed.", "pos.")),
    )


def _check(arch: Architecture) -> None:
    listed = tensors(arch)
    weighted: Counter[tuple[object, ...]] = Counter()
    for t, count in tensor_counts(arch):
        weighted[_key(t)] += count
    assert weighted == Counter(_key(t) for t in listed)
    assert count_params(arch) == sum(t.numel for t in listed)
    direct = tuple(
        ParamTensor(t.name, t.shape, ROOT_GROUP if t.layer is None else f"blocks.{t.layer}")
        for t in listed
    )
    built = architecture_params(arch)
    assert built == direct
    assert [vars(p) for p in built] == [vars(p) for p in direct]
    weights = 0
    for t in listed:
        if len(t.shape) >= 2 and not t.name.startswith(("embed.", "pos.")):
            weights += t.numel // 2 if t.tp_split else t.numel
    if arch.tied_embeddings:
        weights += arch.vocab_size * (arch.embed_proj_dim or arch.hidden) // 2
    assert linear_weight_elements(arch, tp=2) == weights
    for world in (1, 3, 8):
        assert fsdp_shard_total(built, world) == sum(p.fsdp_shard_numel(world) for p in built)
        assert fsdp_padded_total(built, world) == sum(
            -(-p.shape[0] // world) * world * (p.numel // p.shape[0]) for p in built
        )
    numels = [p.numel for p in built]
    assert blocks(2, numels) == sum(block(2 * n) for n in numels)


def test_presets_aggregate_to_their_tensor_lists() -> None:
    for preset in PRESETS.values():
        _check(preset.architecture)


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(architectures())
def test_generated_architectures_aggregate_to_their_tensor_lists(arch: Architecture) -> None:
    _check(arch)


def test_transformers_families_aggregate_to_their_tensor_lists() -> None:
    # norms after the MLP (gemma2/3) and a shared expert (qwen2_moe) sit outside the routed MLP
    for family in FAMILIES:
        arch = architecture_from_hf_config(family_config(family, "small"))
        listed = tensors(arch)
        weighted: Counter[tuple[object, ...]] = Counter()
        for t, count in tensor_counts(arch):
            weighted[_key(t)] += count
        assert weighted == Counter(_key(t) for t in listed), family
        assert count_params(arch) == sum(t.numel for t in listed), family


@pytest.mark.parametrize(
    "family", ["gemma2", "gemma3_text", "qwen2_moe", "mixtral", "qwen3", "deepseek_v3"]
)
def test_counted_tensors_match_the_listed_ones_for_transformers_blocks(family: str) -> None:
    # Gemma-2/3 put a norm after the MLP; Qwen2-MoE adds a shared expert after the experts;
    # DeepSeek-V3 has latent attention and dense blocks before its MoE blocks
    from calculators.hf_config import architecture_from_hf_config
    from measure.hf_families import family_config

    _check(architecture_from_hf_config(family_config(family, "small")))


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"])
def test_expert_tensors_are_the_ones_transformers_registers(family: str) -> None:
    # transformers ≥ 5 keeps every expert of a layer in two 3-D parameters; FSDP2 shards them
    # on the expert dimension, so their shapes decide each rank's shard and padding
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    body = family_config(family, "small")
    config = transformers.AutoConfig.for_model(**body)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    built = Counter(tuple(p.shape) for p in model.parameters() if p.dim() >= 3)
    arch = architecture_from_hf_config(body)
    listed = Counter(p.shape for p in architecture_params(arch) if len(p.shape) >= 3)
    assert built and listed == built
    assert sum(p.numel for p in architecture_params(arch)) == sum(
        p.numel() for p in model.parameters()
    )


def test_fsdp2_says_when_experts_are_fewer_than_ranks() -> None:
    # 4 experts over 64 ranks: every rank's shard is one padded row, so the 3-D expert tensors
    # gather 16 × their size; the answer says so, and says nothing where dim 0 covers the ranks
    from calculators.conventions import Engine, Precision, Stage
    from calculators.engines.torch.memory import estimate
    from calculators.model_states import TrainingSetup

    arch = architecture_from_hf_config(family_config("mixtral", "small"))

    def notes(dp: int) -> str:
        setup = TrainingSetup(
            params=count_params(arch),
            dp=dp,
            precision=Precision.MIXED_BF16,
            engine=Engine.TORCH,
            architecture=arch,
        )
        return " ".join(estimate(setup, Stage.PARAMETERS).notes)

    assert "experts.gate_up_proj, 4 rows" in notes(64) and "16× their size" in notes(64)
    assert "fewer rows on dim 0" not in notes(4)
