"""Inference memory: weights and KV cache."""

from __future__ import annotations

import pytest

from calculators.errors import InputError
from calculators.inference import InferenceSetup, WeightDtype, inference_memory
from calculators.presets import PRESETS


def test_llama2_7b_kv_cache_is_half_a_megabyte_per_token() -> None:
    # 2 (k, v) × 32 layers × 4096 (32 heads × 128) × 2 bytes = 524,288 bytes per token
    mem = inference_memory(
        InferenceSetup(params=0, architecture=PRESETS["llama2-7b"].architecture, context=4096)
    )
    assert mem.kv_cache == 4096 * 524_288
    assert mem.weights == 2 * 6_738_415_616


def test_gqa_and_tensor_parallel_shrink_the_cache() -> None:
    arch = PRESETS["llama3-8b"].architecture  # 8 kv heads of 128
    one = inference_memory(InferenceSetup(params=0, architecture=arch, context=8192))
    two = inference_memory(InferenceSetup(params=0, architecture=arch, context=8192, tp=2))
    assert one.kv_cache == 2 * 32 * 8192 * 8 * 128 * 2
    assert two.kv_cache == one.kv_cache // 2


def test_deepseek_v3_caches_its_latent() -> None:
    # transformers' DynamicCache for DeepseekV3Attention: the 512-wide latent and the 64-wide
    # rotary key per token and layer (61 × 576 × 2 bytes = 70,272 bytes per token), whole on
    # every tensor-parallel rank
    from calculators.hf_config import architecture_from_hf_config
    from tests.calculators.test_architecture import HF_CONFIGS

    arch = architecture_from_hf_config(HF_CONFIGS["deepseek-v3"])
    one = inference_memory(InferenceSetup(params=0, architecture=arch, context=4096))
    eight = inference_memory(InferenceSetup(params=0, architecture=arch, context=4096, tp=8))
    assert one.kv_cache == eight.kv_cache == 4096 * 70_272


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [(WeightDtype.FP32, 40 * 10**9), (WeightDtype.FP16, 20 * 10**9), (WeightDtype.INT4, 5 * 10**9)],
)
def test_10b_weights(dtype: WeightDtype, expected: int) -> None:
    mem = inference_memory(InferenceSetup(params=10**10, architecture=None, weights=dtype))
    assert (mem.weights, mem.kv_cache, mem.total) == (expected, None, None)


def test_tp_must_split_kv_heads() -> None:
    arch = PRESETS["llama3-8b"].architecture
    with pytest.raises(InputError) as err:
        inference_memory(InferenceSetup(params=0, architecture=arch, tp=3))
    assert err.value.field == "tp"
