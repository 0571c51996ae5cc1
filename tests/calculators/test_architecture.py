"""Exact parameter counts: architectures, bundled presets and Hugging Face configs."""

from __future__ import annotations

from typing import Any

import pytest

from calculators.architecture import (
    Architecture,
    count_active_params,
    count_params,
    split_for_model_parallel,
)
from calculators.errors import InputError
from calculators.hf_config import architecture_from_hf_config
from calculators.presets import PRESETS, get_preset

GPT_12L = Architecture(
    layers=12, hidden=1024, heads=16, vocab_size=32000, ffn_hidden=4096, max_seq_len=512
)


def test_gpt_decoder_counts_as_pytorch_does() -> None:
    # GPT-2 style: learned positions, LayerNorm, biased qkv/proj/fc1/fc2, untied bias-free head.
    assert count_params(GPT_12L) == 217_217_024


@pytest.mark.parametrize("name", sorted(n for n in PRESETS if n != "gpt3-175b"))
def test_preset_matches_published_count(name: str) -> None:
    preset = PRESETS[name]
    assert preset.params == preset.published_params


def test_gpt3_matches_its_nominal_175b() -> None:
    # Brown et al. publish "175.0B"; the architecture of Table 2.1 counts 174.6B.
    assert abs(PRESETS["gpt3-175b"].params - 175e9) / 175e9 < 0.003


def test_mixtral_experts_and_active_params() -> None:
    arch = PRESETS["mixtral-8x7b"].architecture
    assert (arch.num_experts, arch.experts_per_token) == (8, 2)
    assert count_active_params(arch) == 12_879_925_248  # "12.9B active" (Mistral AI)


def test_unknown_preset_names_field() -> None:
    with pytest.raises(InputError) as err:
        get_preset("gpt5")
    assert err.value.field == "model.preset"


# Hugging Face config.json bodies (trimmed to the keys the modelling files read) and the
# parameter counts transformers reports for them.
HF_CASES: list[tuple[str, dict[str, Any], int]] = [
    (
        "gpt2",
        {
            "model_type": "gpt2",
            "n_embd": 768,
            "n_layer": 12,
            "n_head": 12,
            "vocab_size": 50257,
            "n_positions": 1024,
        },
        124_439_808,
    ),
    (
        "pythia-160m",
        {
            "model_type": "gpt_neox",
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "vocab_size": 50304,
            "max_position_embeddings": 2048,
        },
        162_322_944,
    ),
    (
        "opt-125m",
        {
            "model_type": "opt",
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "ffn_dim": 3072,
            "vocab_size": 50272,
            "max_position_embeddings": 2048,
            "word_embed_proj_dim": 768,
            "do_layer_norm_before": True,
        },
        125_239_296,
    ),
    (
        "opt-350m",
        {
            "model_type": "opt",
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "ffn_dim": 4096,
            "vocab_size": 50272,
            "max_position_embeddings": 2048,
            "word_embed_proj_dim": 512,
            "do_layer_norm_before": False,
        },
        331_196_416,
    ),
    (
        "llama-2-7b",
        {
            "model_type": "llama",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "intermediate_size": 11008,
            "vocab_size": 32000,
        },
        6_738_415_616,
    ),
    (
        "mistral-7b",
        {
            "model_type": "mistral",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "vocab_size": 32000,
        },
        7_241_732_096,
    ),
    (
        "qwen2-0.5b",
        {
            "model_type": "qwen2",
            "hidden_size": 896,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "intermediate_size": 4864,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
        },
        494_032_768,
    ),
]


@pytest.mark.parametrize(("name", "cfg", "expected"), HF_CASES, ids=[c[0] for c in HF_CASES])
def test_hf_config_counts(
    name: str,  # noqa: ARG001 (the id)
    cfg: dict[str, Any],
    expected: int,
) -> None:
    assert count_params(architecture_from_hf_config(cfg)) == expected


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        ({}, "model.hf_config.model_type"),
        ({"model_type": "t5"}, "model.hf_config.model_type"),
        ({"model_type": "llama", "hidden_size": 64}, "model.hf_config.num_attention_heads"),
        ({"model_type": "gpt2", "n_embd": "768"}, "model.hf_config.n_embd"),
    ],
)
def test_hf_config_errors_name_the_key(cfg: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as err:
        architecture_from_hf_config(cfg)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"heads": 7}, "model.architecture.heads"),
        ({"kv_heads": 5}, "model.architecture.kv_heads"),
        ({"max_seq_len": None}, "model.architecture.max_seq_len"),
        ({"experts_per_token": 2}, "model.architecture.experts_per_token"),
    ],
)
def test_impossible_architecture_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    base: dict[str, Any] = {
        "layers": 4,
        "hidden": 256,
        "heads": 8,
        "vocab_size": 1000,
        "max_seq_len": 128,
    }
    with pytest.raises(InputError) as err:
        Architecture(**(base | kwargs))
    assert err.value.field == field


def test_pipeline_split_puts_embeddings_first_and_head_last() -> None:
    split = split_for_model_parallel(GPT_12L, tp=1, pp=4)
    per_layer = 12_596_224
    assert split.stage_params[1] == split.stage_params[2] == 3 * per_layer
    assert split.stage_params[0] == 32_768_000 + 524_288 + 3 * per_layer
    assert split.stage_params[3] == 3 * per_layer + 2048 + 32_768_000
    assert sum(split.stage_params) == count_params(GPT_12L)


def test_tensor_split_replicates_norms_and_row_biases() -> None:
    split = split_for_model_parallel(GPT_12L, tp=2, pp=1)
    # Replicated per layer: 2 LayerNorms (4 × 1024) + proj and fc2 biases (2 × 1024).
    replicated = 12 * 6 * 1024 + 2048 + 524_288
    assert split.params == (count_params(GPT_12L) - replicated) // 2 + replicated


@pytest.mark.parametrize(("tp", "pp", "field"), [(3, 1, "tp"), (1, 5, "pp")])
def test_model_parallel_must_divide(tp: int, pp: int, field: str) -> None:
    with pytest.raises(InputError) as err:
        split_for_model_parallel(GPT_12L, tp=tp, pp=pp)
    assert err.value.field == field
