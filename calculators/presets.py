"""Well-known models bundled with the service, each with its published parameter count."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from calculators.architecture import (
    Activation,
    Architecture,
    Norm,
    PositionEmbedding,
    TransformersModelling,
    count_params,
)
from calculators.errors import InputError


@dataclass(frozen=True)
class Preset:
    """A bundled model.

    Attributes:
        name: the key clients pass as ``{"preset": name}``.
        architecture: its decoder architecture.
        published_params: the count its authors publish.
        source: where that count is published.
        note: anything a user should know (e.g. MoE expert counts).
    """

    name: str
    architecture: Architecture
    published_params: int
    source: str
    note: str = ""

    @cached_property
    def params(self) -> int:
        """``count_params`` of the architecture, counted once (every question about the preset
        reads it)."""
        return count_params(self.architecture)


def _gpt2(layers: int, hidden: int, heads: int) -> Architecture:
    # HF GPT2Model: learned positions (1024), LayerNorm, biased Conv1D linears, tied head.
    return Architecture(
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab_size=50257,
        max_seq_len=1024,
        tied_embeddings=True,
    )


def _llama(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    vocab: int,
    seq: int,
    experts: int = 1,
    active: int = 1,
    family: str = "llama",
    sliding_window: int | None = None,
) -> Architecture:
    # HF LlamaForCausalLM / MistralForCausalLM: RMSNorm, RoPE, bias-free SwiGLU, untied head,
    # trained as transformers' modelling code builds it (its activations and peak)
    return Architecture(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn_hidden=ffn,
        vocab_size=vocab,
        max_seq_len=seq,
        bias=False,
        norm=Norm.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        gated_mlp=True,
        activation=Activation.SILU,
        num_experts=experts,
        experts_per_token=active,
        modelling=TransformersModelling(
            family=family,
            sliding_window=sliding_window,
            sliding_layers=layers if sliding_window else 0,
        ),
    )


_PRESETS = [
    Preset("gpt2", _gpt2(12, 768, 12), 124_439_808, "Hugging Face gpt2 model card (124M)"),
    Preset("gpt2-medium", _gpt2(24, 1024, 16), 354_823_168, "Hugging Face gpt2-medium (355M)"),
    Preset("gpt2-large", _gpt2(36, 1280, 20), 774_030_080, "Hugging Face gpt2-large (774M)"),
    Preset("gpt2-xl", _gpt2(48, 1600, 25), 1_557_611_200, "Hugging Face gpt2-xl (1.5B)"),
    Preset(
        "gpt3-175b",
        Architecture(
            layers=96,
            hidden=12288,
            heads=96,
            vocab_size=50257,
            max_seq_len=2048,
            tied_embeddings=True,
        ),
        175_000_000_000,
        "Brown et al. 2020, Table 2.1 (nominal 175.0B; the architecture counts 174.6B)",
    ),
    Preset(
        "bloom-176b",
        Architecture(
            layers=70,
            hidden=14336,
            heads=112,
            vocab_size=250880,
            tied_embeddings=True,
            position_embedding=PositionEmbedding.ALIBI,
            embedding_norm=True,
        ),
        176_247_271_424,
        "bigscience/bloom model card (176,247,271,424 parameters)",
    ),
    Preset(
        "llama2-7b",
        _llama(32, 4096, 32, 32, 11008, 32000, 4096),
        6_738_415_616,
        "meta-llama/Llama-2-7b-hf safetensors index (6.74B)",
    ),
    Preset(
        "llama2-13b",
        _llama(40, 5120, 40, 40, 13824, 32000, 4096),
        13_015_864_320,
        "meta-llama/Llama-2-13b-hf safetensors index (13.0B)",
    ),
    Preset(
        "llama2-70b",
        _llama(80, 8192, 64, 8, 28672, 32000, 4096),
        68_976_648_192,
        "meta-llama/Llama-2-70b-hf safetensors index (69.0B)",
    ),
    Preset(
        "llama3-8b",
        _llama(32, 4096, 32, 8, 14336, 128256, 8192),
        8_030_261_248,
        "meta-llama/Meta-Llama-3-8B safetensors index (8.03B)",
    ),
    Preset(
        "llama3-70b",
        _llama(80, 8192, 64, 8, 28672, 128256, 8192),
        70_553_706_496,
        "meta-llama/Meta-Llama-3-70B safetensors index (70.6B)",
    ),
    Preset(
        "mistral-7b",
        # config.json: "sliding_window": 4096 (every layer)
        _llama(32, 4096, 32, 8, 14336, 32000, 32768, family="mistral", sliding_window=4096),
        7_241_732_096,
        "mistralai/Mistral-7B-v0.1 safetensors index (7.24B)",
    ),
    Preset(
        "mixtral-8x7b",
        _llama(32, 4096, 32, 8, 14336, 32000, 32768, experts=8, active=2, family="mixtral"),
        46_702_792_704,
        "mistralai/Mixtral-8x7B-v0.1 safetensors index (46.7B)",
        note="8 experts per layer, 2 active per token (12.9B active parameters)",
    ),
]

PRESETS: dict[str, Preset] = {p.name: p for p in _PRESETS}


def get_preset(name: str) -> Preset:
    """The bundled preset called ``name``; :class:`InputError` on ``model.preset`` otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise InputError("model.preset", f"unknown preset {name!r}; known: {known}") from None
