"""Read a Hugging Face ``config.json`` body into an :class:`Architecture` (nothing downloaded).

Each family maps its keys the way its ``transformers`` modelling file builds the module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from calculators.architecture import Activation, Architecture, Norm, PositionEmbedding
from calculators.errors import InputError

_FIELD = "model.hf_config"


def _get(cfg: Mapping[str, Any], *keys: str, default: Any = None, required: bool = True) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            value = cfg[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(f"{_FIELD}.{key}", f"must be an integer, got {value!r}")
            return value
    if required and default is None:
        raise InputError(f"{_FIELD}.{keys[0]}", "is required for this model_type")
    return default


def _flag(cfg: Mapping[str, Any], key: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputError(f"{_FIELD}.{key}", f"must be true or false, got {value!r}")
    return value


def _activation(cfg: Mapping[str, Any], key: str, default: Activation) -> Activation:
    name = str(cfg.get(key) or "").lower()
    if "relu" in name:
        return Activation.RELU
    if "silu" in name or "swish" in name:
        return Activation.SILU
    if "gelu" in name:
        return Activation.GELU
    return default


def _llama_like(cfg: Mapping[str, Any]) -> Architecture:
    # transformers/models/llama/modeling_llama.py (mistral, mixtral, qwen2 share the layout).
    hidden = _get(cfg, "hidden_size")
    heads = _get(cfg, "num_attention_heads")
    model_type = cfg.get("model_type")
    bias = _flag(cfg, "attention_bias", False)
    experts = _get(cfg, "num_local_experts", default=1, required=False)
    return Architecture(
        layers=_get(cfg, "num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=_get(cfg, "num_key_value_heads", default=heads, required=False),
        head_dim=_get(cfg, "head_dim", default=hidden // heads if heads else 1, required=False),
        vocab_size=_get(cfg, "vocab_size"),
        ffn_hidden=_get(cfg, "intermediate_size"),
        max_seq_len=_get(cfg, "max_position_embeddings", default=2048, required=False),
        tied_embeddings=_flag(cfg, "tie_word_embeddings", False),
        bias=_flag(cfg, "mlp_bias", False) if model_type == "llama" else False,
        # Llama's attention_bias covers q, k, v and o; Qwen2 biases q, k, v only.
        qkv_bias=True if model_type == "qwen2" else bias,
        norm=Norm.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        gated_mlp=True,
        activation=_activation(cfg, "hidden_act", Activation.SILU),
        num_experts=experts,
        experts_per_token=_get(cfg, "num_experts_per_tok", default=min(2, experts), required=False),
    )


def _gpt2(cfg: Mapping[str, Any]) -> Architecture:
    # transformers/models/gpt2/modeling_gpt2.py: Conv1D c_attn (3h), c_proj, c_fc, c_proj.
    hidden = _get(cfg, "n_embd", "hidden_size")
    return Architecture(
        layers=_get(cfg, "n_layer", "num_hidden_layers"),
        hidden=hidden,
        heads=_get(cfg, "n_head", "num_attention_heads"),
        vocab_size=_get(cfg, "vocab_size"),
        ffn_hidden=_get(cfg, "n_inner", default=4 * hidden, required=False),
        max_seq_len=_get(cfg, "n_positions", "n_ctx", default=1024, required=False),
        tied_embeddings=_flag(cfg, "tie_word_embeddings", True),
        activation=_activation(cfg, "activation_function", Activation.GELU),
    )


def _gpt_neox(cfg: Mapping[str, Any]) -> Architecture:
    # transformers/models/gpt_neox/modeling_gpt_neox.py: rotary, biased linears, untied embed_out.
    return Architecture(
        layers=_get(cfg, "num_hidden_layers"),
        hidden=_get(cfg, "hidden_size"),
        heads=_get(cfg, "num_attention_heads"),
        vocab_size=_get(cfg, "vocab_size"),
        ffn_hidden=_get(cfg, "intermediate_size"),
        max_seq_len=_get(cfg, "max_position_embeddings", default=2048, required=False),
        tied_embeddings=_flag(cfg, "tie_word_embeddings", False),
        bias=_flag(cfg, "attention_bias", True),
        position_embedding=PositionEmbedding.ROPE,
        activation=_activation(cfg, "hidden_act", Activation.GELU),
    )


def _opt(cfg: Mapping[str, Any]) -> Architecture:
    # transformers/models/opt/modeling_opt.py: learned positions with an offset of 2,
    # project_in/out when word_embed_proj_dim != hidden, no final norm when post-LN (350m).
    hidden = _get(cfg, "hidden_size")
    proj = _get(cfg, "word_embed_proj_dim", default=hidden, required=False)
    pre_ln = _flag(cfg, "do_layer_norm_before", True)
    return Architecture(
        layers=_get(cfg, "num_hidden_layers"),
        hidden=hidden,
        heads=_get(cfg, "num_attention_heads"),
        vocab_size=_get(cfg, "vocab_size"),
        ffn_hidden=_get(cfg, "ffn_dim"),
        max_seq_len=_get(cfg, "max_position_embeddings", default=2048, required=False),
        position_offset=2,
        tied_embeddings=_flag(cfg, "tie_word_embeddings", True),
        bias=_flag(cfg, "enable_bias", True),
        activation=_activation(cfg, "activation_function", Activation.RELU),
        final_norm=pre_ln and not _flag(cfg, "_remove_final_layer_norm", False),
        embed_proj_dim=proj if proj != hidden else None,
    )


def _bloom(cfg: Mapping[str, Any]) -> Architecture:
    # transformers/models/bloom/modeling_bloom.py: ALiBi, embedding LayerNorm, tied head.
    hidden = _get(cfg, "hidden_size", "n_embed")
    return Architecture(
        layers=_get(cfg, "n_layer", "num_hidden_layers"),
        hidden=hidden,
        heads=_get(cfg, "n_head", "num_attention_heads"),
        vocab_size=_get(cfg, "vocab_size"),
        tied_embeddings=_flag(cfg, "tie_word_embeddings", True),
        position_embedding=PositionEmbedding.ALIBI,
        embedding_norm=True,
    )


_FAMILIES: dict[str, Callable[[Mapping[str, Any]], Architecture]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "mixtral": _llama_like,
    "qwen2": _llama_like,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "opt": _opt,
    "bloom": _bloom,
}

SUPPORTED_MODEL_TYPES = tuple(sorted(_FAMILIES))


def architecture_from_hf_config(cfg: Mapping[str, Any]) -> Architecture:
    """The architecture a ``config.json`` body describes."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise InputError(f"{_FIELD}.model_type", 'is required (e.g. "llama")')
    try:
        family = _FAMILIES[model_type]
    except KeyError:
        known = ", ".join(SUPPORTED_MODEL_TYPES)
        raise InputError(
            f"{_FIELD}.model_type", f"unsupported model_type {model_type!r}; supported: {known}"
        ) from None
    return family(cfg)
