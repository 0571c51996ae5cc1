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


def test_deepseek_v3_active_params() -> None:
    # 3 dense layers, 58 MoE layers running 8 of 256 experts plus the shared one: "37B
    # activated" (DeepSeek-V3 technical report)
    arch = architecture_from_hf_config(HF_CONFIGS["deepseek-v3"])
    assert count_active_params(arch) == 37_552_282_624


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
    # Qwen/Qwen3-0.6B config.json; transformers 5.17 builds 596,049,920 parameters
    (
        "qwen3-0.6b",
        {
            "model_type": "qwen3",
            "hidden_size": 1024,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 3072,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
        },
        596_049_920,
    ),
    # google/gemma-2b config.json; transformers 5.17 builds 2,506,172,416 parameters
    (
        "gemma-2b",
        {
            "model_type": "gemma",
            "hidden_size": 2048,
            "num_hidden_layers": 18,
            "num_attention_heads": 8,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "intermediate_size": 16384,
            "vocab_size": 256000,
        },
        2_506_172_416,
    ),
    # google/gemma-2-2b config.json; transformers 5.17 builds 2,614,341,888 parameters
    (
        "gemma-2-2b",
        {
            "model_type": "gemma2",
            "hidden_size": 2304,
            "num_hidden_layers": 26,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "intermediate_size": 9216,
            "vocab_size": 256000,
        },
        2_614_341_888,
    ),
    # google/gemma-3-1b-pt config.json; transformers 5.17 builds 999,885,952 parameters
    (
        "gemma-3-1b",
        {
            "model_type": "gemma3_text",
            "hidden_size": 1152,
            "num_hidden_layers": 26,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "intermediate_size": 6912,
            "vocab_size": 262144,
        },
        999_885_952,
    ),
    # microsoft/Phi-3-mini-4k-instruct config.json; transformers 5.17 builds 3,821,079,552
    (
        "phi-3-mini",
        {
            "model_type": "phi3",
            "hidden_size": 3072,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "intermediate_size": 8192,
            "vocab_size": 32064,
        },
        3_821_079_552,
    ),
    # Qwen/Qwen1.5-MoE-A2.7B config.json; transformers 5.17 builds 14,315,784,192 parameters
    (
        "qwen1.5-moe-a2.7b",
        {
            "model_type": "qwen2_moe",
            "hidden_size": 2048,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "intermediate_size": 5632,
            "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632,
            "num_experts": 60,
            "num_experts_per_tok": 4,
            "vocab_size": 151936,
        },
        14_315_784_192,
    ),
    # Qwen/Qwen3-30B-A3B config.json; transformers 5.17 builds 30,532,122,624 parameters
    (
        "qwen3-30b-a3b",
        {
            "model_type": "qwen3_moe",
            "hidden_size": 2048,
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "vocab_size": 151936,
        },
        30_532_122_624,
    ),
    # deepseek-ai/DeepSeek-V3 config.json (bench/hf_configs/deepseek-v3.json, without the
    # multi-token-prediction layer, which DeepseekV3ForCausalLM does not build); transformers
    # 5.17 builds 671,026,404,352 parameters, 37.6B active per token
    (
        "deepseek-v3",
        {
            "model_type": "deepseek_v3",
            "hidden_size": 7168,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "num_hidden_layers": 61,
            "first_k_dense_replace": 3,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "q_lora_rank": 1536,
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "num_experts_per_tok": 8,
            "n_group": 8,
            "topk_group": 4,
            "vocab_size": 129280,
        },
        671_026_404_352,
    ),
]


HF_CONFIGS = {name: cfg for name, cfg, _ in HF_CASES}


_SMALL = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
}
_MINISTRAL = {**_SMALL, "model_type": "ministral", "head_dim": 16, "sliding_window": 16}
_SMOLLM3 = {**_SMALL, "model_type": "smollm3"}


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
        ({"model_type": "deepseek_v2"}, "model.hf_config.model_type"),
        (
            {**HF_CONFIGS["deepseek-v3"], "num_key_value_heads": 8},
            "model.hf_config.num_key_value_heads",
        ),
        ({**HF_CONFIGS["deepseek-v3"], "n_group": 3}, "model.hf_config.n_group"),
        ({**HF_CONFIGS["deepseek-v3"], "topk_group": 9}, "model.hf_config.topk_group"),
        ({**HF_CONFIGS["deepseek-v3"], "n_shared_experts": 0}, "model.hf_config.n_shared_experts"),
        ({**HF_CONFIGS["deepseek-v3"], "q_lora_rank": 0}, "model.hf_config.q_lora_rank"),
        (
            {**HF_CONFIGS["qwen1.5-moe-a2.7b"], "mlp_only_layers": [0, 3]},
            "model.hf_config.mlp_only_layers",
        ),
        (
            {**HF_CONFIGS["phi-3-mini"], "partial_rotary_factor": 1.5},
            "model.hf_config.partial_rotary_factor",
        ),
        ({**_MINISTRAL, "head_dim": None}, "model.hf_config.head_dim"),
        ({**_MINISTRAL, "sliding_window": None}, "model.hf_config.sliding_window"),
        ({**_SMOLLM3, "no_rope_layers": [1, 0]}, "model.hf_config.no_rope_layers"),
        ({**_SMOLLM3, "no_rope_layers": [1, 2, 1, 0]}, "model.hf_config.no_rope_layers"),
        ({**_SMOLLM3, "no_rope_layer_interval": 0}, "model.hf_config.no_rope_layer_interval"),
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
