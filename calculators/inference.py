"""Inference memory per device: the weights and the KV cache of a batch at a context length.

Weights take ``Ψ × bytes`` (split over TP and PP as training splits them); the KV cache keeps
one key and one value vector per layer, token and KV head: ``2 · L · b · s · kv_heads · d_head``
elements (grouped-query attention shrinks it by heads / kv_heads). Activations of a decode step
are transient and small next to both; the figure says so rather than guessing them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from calculators.architecture import Architecture, split_for_model_parallel
from calculators.errors import InputError
from calculators.model_states import ceil_div


class WeightDtype(StrEnum):
    """Storage of the weights (and of the KV cache) at inference."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"


# Bytes per element; int4 packs two weights a byte (quantization scales not counted).
DTYPE_BYTES = {
    WeightDtype.FP32: Fraction(4),
    WeightDtype.BF16: Fraction(2),
    WeightDtype.FP16: Fraction(2),
    WeightDtype.FP8: Fraction(1),
    WeightDtype.INT8: Fraction(1),
    WeightDtype.INT4: Fraction(1, 2),
}


@dataclass(frozen=True)
class InferenceSetup:
    """One serving configuration.

    Attributes:
        params: Ψ of the whole model.
        architecture: the decoder (needed for the KV cache).
        weights: weight storage dtype.
        kv_cache: KV cache dtype.
        batch_size: sequences decoded together.
        context: tokens per sequence held in the cache (prompt + generated).
        tp: tensor-parallel degree (splits weights and KV heads).
        pp: pipeline-parallel degree (splits layers).
    """

    params: int
    architecture: Architecture | None
    weights: WeightDtype = WeightDtype.BF16
    kv_cache: WeightDtype = WeightDtype.BF16
    batch_size: int = 1
    context: int = 2048
    tp: int = 1
    pp: int = 1


@dataclass(frozen=True)
class InferenceMemory:
    """Bytes on one device."""

    weights: int
    kv_cache: int | None

    @property
    def total(self) -> int | None:
        return None if self.kv_cache is None else self.weights + self.kv_cache


def inference_memory(setup: InferenceSetup) -> InferenceMemory:
    """Weights and KV cache on the most loaded device."""
    arch = setup.architecture
    if arch is not None:
        params = split_for_model_parallel(arch, setup.tp, setup.pp).params
    else:
        params = ceil_div(setup.params, setup.tp * setup.pp)
    weight_bytes = ceil_div(DTYPE_BYTES[setup.weights] * params)
    if arch is None:
        return InferenceMemory(weight_bytes, None)
    m = arch.modelling
    if m is not None and m.latent_attention is not None:
        # DeepseekV3Attention caches the normed latent and the rotary key, one of each per token
        # and layer, shared by all heads (every tensor-parallel rank holds it whole)
        mla = m.latent_attention
        width = mla.kv_lora_rank + mla.qk_rope_head_dim
        elements = (arch.layers // setup.pp) * setup.batch_size * setup.context * width
        return InferenceMemory(weight_bytes, ceil_div(DTYPE_BYTES[setup.kv_cache] * elements))
    if arch.n_kv_heads % setup.tp and setup.tp % arch.n_kv_heads:
        raise InputError("tp", f"{setup.tp} does not split {arch.n_kv_heads} kv heads")
    kv_heads_here = max(1, arch.n_kv_heads // setup.tp)  # replicated when tp > kv heads
    elements = (
        2
        * (arch.layers // setup.pp)
        * setup.batch_size
        * setup.context
        * kv_heads_here
        * arch.d_head
    )
    cache = ceil_div(DTYPE_BYTES[setup.kv_cache] * elements)
    return InferenceMemory(weight_bytes, cache)
