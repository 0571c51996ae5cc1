"""Read a Hugging Face ``config.json`` body into an :class:`Architecture` (nothing downloaded).

Each family maps its keys the way its ``transformers`` modelling file builds the module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from calculators.architecture import (
    MAX_DIM,
    Activation,
    Architecture,
    LatentAttention,
    Norm,
    PositionEmbedding,
    TransformersModelling,
)
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


def _list(cfg: Mapping[str, Any], key: str) -> list[Any]:
    value = cfg.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(f"{_FIELD}.{key}", f"must be a list, got {value!r}")
    return value


def _rotary_fraction(cfg: Mapping[str, Any]) -> float:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        rope = {}
    value = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise InputError(f"{_FIELD}.partial_rotary_factor", f"must be in (0, 1], got {value!r}")
    return float(value)


def _dense_moe_layers(cfg: Mapping[str, Any]) -> None:
    """Qwen-MoE's dense layers (``mlp_only_layers``, ``decoder_sparse_step``) are not modelled."""
    if _list(cfg, "mlp_only_layers"):
        raise InputError(
            f"{_FIELD}.mlp_only_layers", "dense layers between MoE layers are not supported"
        )
    if _get(cfg, "decoder_sparse_step", default=1, required=False) != 1:
        raise InputError(f"{_FIELD}.decoder_sparse_step", "only 1 (every layer MoE) is supported")


# transformers' configuration_<family>.py defaults for keys a config.json may leave out
_HEAD_DIM_DEFAULT = {
    "qwen3": 128,
    "qwen3_moe": 128,
    "gemma": 256,
    "gemma2": 256,
    "gemma3_text": 256,
}
_TIED_DEFAULT = {"gemma", "gemma2", "gemma3_text", "smollm3"}
_GEMMA = {"gemma", "gemma2", "gemma3_text"}
_MOE = {"mixtral", "qwen2_moe", "qwen3_moe"}


_WINDOW_DEFAULT = {"mistral": 4096, "ministral": 4096, "gemma2": 4096, "gemma3_text": 4096}
_QWEN = {"qwen2", "qwen3", "qwen2_moe", "qwen3_moe"}
_UNBIASED = {"mistral", "ministral", "mixtral", "phi3"}  # modelling code ignores attention_bias


def _sliding_window(cfg: Mapping[str, Any], model_type: str) -> int | None:
    """The window transformers' mask functions use (``None``: causal masks only)."""
    if model_type in ("llama", "gemma"):
        return None
    # SmolLM3's mask for its sliding layers reads sliding_window whatever use_sliding_window
    # says (modeling_smollm3.py: the mask mapping follows layer_types)
    if model_type in _QWEN and not _flag(cfg, "use_sliding_window", False):
        return None  # configuration_qwen*.py: sliding_window if use_sliding_window else None
    default = _WINDOW_DEFAULT.get(model_type, 4096 if model_type in _QWEN else None)
    if "sliding_window" in cfg and cfg["sliding_window"] is None:
        if model_type == "ministral":
            # modeling_ministral.py builds the sliding-window mask whatever the layer types
            raise InputError(
                f"{_FIELD}.sliding_window", "is required for ministral (transformers needs it)"
            )
        return None
    window: int | None = _get(cfg, "sliding_window", default=default, required=False)
    if window is not None and window < 0:
        raise InputError(f"{_FIELD}.sliding_window", "must be a token count >= 0")
    return window or None


def _layer_types(cfg: Mapping[str, Any], model_type: str, layers: int) -> list[str]:
    """``config.layer_types`` as the family's configuration class fills it in."""
    given = _list(cfg, "layer_types")
    if given:
        if len(given) != layers:
            raise InputError(f"{_FIELD}.layer_types", f"must list {layers} layers")
        return [str(x) for x in given]
    if model_type == "gemma2":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if model_type == "gemma3_text":
        pattern = _get(cfg, "sliding_window_pattern", default=6, required=False)
        if pattern < 1:
            raise InputError(f"{_FIELD}.sliding_window_pattern", "must be at least 1")
        return [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
    if model_type == "smollm3":
        # configuration_smollm3.py: the NoPE layers slide when use_sliding_window and a window
        # are both set
        slides = _flag(cfg, "use_sliding_window", False) and cfg.get("sliding_window") is not None
        nope = [not rope for rope in _rope_layers(cfg, layers)]
        return ["sliding_attention" if slides and n else "full_attention" for n in nope]
    if model_type in _QWEN:
        first = _get(cfg, "max_window_layers", default=28, required=False)
        if not _flag(cfg, "use_sliding_window", False):
            return ["full_attention"] * layers
        return ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    return ["sliding_attention"] * layers  # mistral, mixtral, phi3: every layer when windowed


def _rope_layers(cfg: Mapping[str, Any], layers: int) -> list[bool]:
    """Which layers rotate q and k: SmolLM3's ``no_rope_layers`` (1: rotary, 0: none), by
    default every layer but each ``no_rope_layer_interval``-th (configuration_smollm3.py)."""
    given = _list(cfg, "no_rope_layers")
    if not given:
        interval = _get(cfg, "no_rope_layer_interval", default=4, required=False)
        if interval < 1:
            raise InputError(f"{_FIELD}.no_rope_layer_interval", "must be at least 1")
        return [(i + 1) % interval != 0 for i in range(layers)]
    if len(given) != layers or any(x not in (0, 1) or isinstance(x, float) for x in given):
        raise InputError(f"{_FIELD}.no_rope_layers", f"must list {layers} layers, each 0 or 1")
    return [bool(x) for x in given]


def _llama_like(cfg: Mapping[str, Any]) -> Architecture:
    """The RMSNorm + RoPE + gated-MLP families, each as its ``modeling_<family>.py`` builds it.

    llama / mistral / ministral / qwen2 / qwen3 / phi3 / smollm3: ``LlamaDecoderLayer``'s layout
    (phi3 fuses ``qkv_proj`` and ``gate_up_proj``; qwen3 adds per-head q/k norms; ministral
    takes a window per layer; smollm3 rotates nothing in its NoPE layers); gemma / gemma2 /
    gemma3_text: ``(1 + weight)`` norms, tied head, GeGLU, four norms per layer from gemma2 on;
    mixtral / qwen2_moe / qwen3_moe: a top-k router and ``num_experts`` SwiGLU experts (qwen2_moe
    adds a gated shared expert).
    """
    model_type = str(cfg.get("model_type"))
    hidden = _get(cfg, "hidden_size")
    heads = _get(cfg, "num_attention_heads")
    if not heads:
        raise InputError(f"{_FIELD}.num_attention_heads", "must be at least 1")
    head_dim = _get(
        cfg, "head_dim", default=_HEAD_DIM_DEFAULT.get(model_type, hidden // heads), required=False
    )
    if model_type == "ministral" and cfg.get("head_dim") is None:
        # modeling_ministral.py reads config.head_dim, whose default is None
        raise InputError(f"{_FIELD}.head_dim", "is required for ministral (transformers needs it)")
    # Mistral's, Ministral's, Mixtral's and Phi-3's attention projections never have a bias
    attention_bias = model_type not in _UNBIASED and _flag(cfg, "attention_bias", False)
    if model_type in ("qwen2", "qwen2_moe"):
        qkv_bias = _flag(cfg, "qkv_bias", True)  # Qwen2 biases q, k and v, never o
    else:
        qkv_bias = attention_bias
    experts = 1
    ffn = _get(cfg, "intermediate_size")
    shared = None
    if model_type == "mixtral":
        experts = _get(cfg, "num_local_experts", default=8, required=False)
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        _dense_moe_layers(cfg)
        experts = _get(cfg, "num_experts")
        ffn = _get(cfg, "moe_intermediate_size")
        if model_type == "qwen2_moe":
            shared = _get(cfg, "shared_expert_intermediate_size")
    top_k = _get(cfg, "num_experts_per_tok", default=min(2, experts), required=False)
    layers = _get(cfg, "num_hidden_layers")
    fraction = _rotary_fraction(cfg) if model_type == "phi3" else 1.0
    if not 1 <= layers <= MAX_DIM:
        raise InputError(f"{_FIELD}.num_hidden_layers", f"must be between 1 and {MAX_DIM}")
    types = _layer_types(cfg, model_type, layers)
    window = _sliding_window(cfg, model_type)
    rope_kinds = len(set(types)) if model_type == "gemma3_text" else 1
    rope = _rope_layers(cfg, layers) if model_type == "smollm3" else [True] * layers
    # Gemma-2 soft-caps its logits by default (30), Gemma-3 where its config says so
    softcap = cfg.get("final_logit_softcapping", 30.0 if model_type == "gemma2" else None)
    logit_softcap = model_type in ("gemma2", "gemma3_text") and softcap is not None
    sliding = [kind == "sliding_attention" and window is not None for kind in types]
    pattern = tuple(zip(sliding, rope, strict=True))
    modelling = TransformersModelling(
        family=model_type,
        norm_plus_one=model_type in _GEMMA,
        qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
        sandwich_norms=model_type in ("gemma2", "gemma3_text"),
        fused_projections=model_type == "phi3",
        residual_dropout=model_type == "phi3",
        out_proj_first=model_type == "phi3",
        experts_first=model_type == "qwen3_moe",
        rotary_cat=model_type == "phi3",
        rotary_dim=int(head_dim * fraction) if fraction != 1.0 else None,
        rope_kinds=rope_kinds,
        nope_layers=rope.count(False),
        nope_sliding_layers=sum(s and not r for s, r in zip(sliding, rope, strict=True)),
        final_logit_softcap=logit_softcap,
        shared_expert_ffn=shared,
        fused_experts=model_type in _MOE,  # transformers ≥ 5: experts.gate_up_proj / down_proj
        router_normalize=model_type == "mixtral" or _flag(cfg, "norm_topk_prob", False),
        router_weights_fp32=model_type == "mixtral",
        use_cache=_flag(cfg, "use_cache", True),
        out_bias=False if model_type in ("qwen2", "qwen2_moe") else attention_bias,
        sliding_window=window,
        sliding_layers=types.count("sliding_attention") if window is not None else 0,
        layer_pattern=pattern if len(set(pattern)) > 1 else (),
    )
    default_act = Activation.GELU if model_type in _GEMMA else Activation.SILU
    act_key = (
        "hidden_activation" if model_type in _GEMMA and "hidden_activation" in cfg else "hidden_act"
    )
    return Architecture(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=_get(cfg, "num_key_value_heads", default=heads, required=False),
        head_dim=head_dim,
        vocab_size=_get(cfg, "vocab_size"),
        ffn_hidden=ffn,
        max_seq_len=_get(cfg, "max_position_embeddings", default=2048, required=False),
        tied_embeddings=_flag(cfg, "tie_word_embeddings", model_type in _TIED_DEFAULT),
        # Llama's mlp_bias covers gate/up/down; attention_bias q, k, v and o
        bias=_flag(cfg, "mlp_bias", False) if model_type in ("llama", "smollm3") else False,
        qkv_bias=qkv_bias,
        norm=Norm.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        gated_mlp=True,
        activation=_activation(cfg, act_key, default_act),
        num_experts=experts,
        experts_per_token=top_k,
        modelling=modelling,
    )


def _positive(cfg: Mapping[str, Any], key: str, default: int) -> int:
    value: int = _get(cfg, key, default=default, required=False)
    if not 1 <= value <= MAX_DIM:
        raise InputError(f"{_FIELD}.{key}", f"must be between 1 and {MAX_DIM}")
    return value


def _deepseek_v3(cfg: Mapping[str, Any]) -> Architecture:
    """``DeepseekV3ForCausalLM`` (``models/deepseek_v3/modeling_deepseek_v3.py``).

    Multi-head latent attention (``LatentAttention``); the first ``first_k_dense_replace``
    layers keep a dense SwiGLU MLP of ``intermediate_size``, the others route each token to
    ``num_experts_per_tok`` of ``n_routed_experts`` SwiGLU experts of ``moe_intermediate_size``
    (a sigmoid-scored fp32 router; ``e_score_correction_bias`` is a buffer, not a parameter)
    and add ``n_shared_experts`` shared experts as one ungated MLP. Defaults are
    ``DeepseekV3Config``'s (DeepSeek-V3's own sizes).
    """
    hidden = _positive(cfg, "hidden_size", 7168)
    heads = _positive(cfg, "num_attention_heads", 128)
    kv_heads = _get(cfg, "num_key_value_heads", default=heads, required=False)
    if kv_heads != heads:
        # DeepseekV3Attention expands the latent to every head; with fewer key/value heads
        # transformers' SDPA path would repeat those keys and values once more
        raise InputError(
            f"{_FIELD}.num_key_value_heads",
            f"must equal num_attention_heads ({heads}): latent attention gives every head its "
            "own keys and values",
        )
    q_lora: int | None = None
    if "q_lora_rank" not in cfg or cfg["q_lora_rank"] is not None:
        q_lora = _positive(cfg, "q_lora_rank", 1536)
    mla = LatentAttention(
        q_lora_rank=q_lora,
        kv_lora_rank=_positive(cfg, "kv_lora_rank", 512),
        qk_nope_head_dim=_get(cfg, "qk_nope_head_dim", default=128, required=False),
        qk_rope_head_dim=_positive(cfg, "qk_rope_head_dim", 64),
        v_head_dim=_positive(cfg, "v_head_dim", 128),
    )
    if mla.qk_nope_head_dim < 0 or mla.qk_rope_head_dim % 2:
        field = "qk_nope_head_dim" if mla.qk_nope_head_dim < 0 else "qk_rope_head_dim"
        raise InputError(f"{_FIELD}.{field}", "must be >= 0 (qk_rope_head_dim: even)")
    layers = _positive(cfg, "num_hidden_layers", 61)
    experts = _positive(cfg, "n_routed_experts", 256)
    top_k = _positive(cfg, "num_experts_per_tok", 8)
    groups = _positive(cfg, "n_group", 8)
    if experts % groups or experts // groups < 2:
        # DeepseekV3TopkRouter views the scores as (n_group, experts / n_group) and takes the
        # top 2 of each group
        raise InputError(
            f"{_FIELD}.n_group", f"must divide n_routed_experts ({experts}) into groups of >= 2"
        )
    if _positive(cfg, "topk_group", 4) > groups:
        raise InputError(f"{_FIELD}.topk_group", f"must be <= n_group ({groups})")
    if top_k > experts:
        raise InputError(
            f"{_FIELD}.num_experts_per_tok", f"must be <= n_routed_experts ({experts})"
        )
    moe_ffn = _positive(cfg, "moe_intermediate_size", 2048)
    # 0 builds zero-width shared experts whose linears still save their input: not modelled
    shared = _positive(cfg, "n_shared_experts", 1)
    dense = _get(cfg, "first_k_dense_replace", default=3, required=False)
    if dense < 0:
        raise InputError(f"{_FIELD}.first_k_dense_replace", "must be >= 0")
    attention_bias = _flag(cfg, "attention_bias", False)
    modelling = TransformersModelling(
        family="deepseek_v3",
        fused_experts=True,  # DeepseekV3NaiveMoe: experts.gate_up_proj / down_proj (3-D)
        experts_first=True,  # DeepseekV3MoE registers experts, then gate, then shared_experts
        latent_attention=mla,
        rotary_dim=mla.qk_rope_head_dim,
        shared_expert_ffn=moe_ffn * shared,
        shared_expert_gate=False,
        router_fp32=True,
        router_normalize=_flag(cfg, "norm_topk_prob", True),
        router_weights_fp32=True,
        dense_layers=min(dense, layers),
        dense_ffn=_positive(cfg, "intermediate_size", 18432),
        use_cache=_flag(cfg, "use_cache", True),
        out_bias=attention_bias,
    )
    return Architecture(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=heads,
        head_dim=mla.qk_head_dim,
        vocab_size=_positive(cfg, "vocab_size", 129280),
        ffn_hidden=moe_ffn,
        max_seq_len=_positive(cfg, "max_position_embeddings", 4096),
        tied_embeddings=_flag(cfg, "tie_word_embeddings", False),
        bias=False,
        qkv_bias=attention_bias,
        norm=Norm.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        gated_mlp=True,
        activation=_activation(cfg, "hidden_act", Activation.SILU),
        num_experts=experts,
        experts_per_token=top_k,
        modelling=modelling,
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
    "ministral": _llama_like,
    "mixtral": _llama_like,
    "qwen2": _llama_like,
    "qwen3": _llama_like,
    "gemma": _llama_like,
    "gemma2": _llama_like,
    "gemma3_text": _llama_like,
    "phi3": _llama_like,
    "smollm3": _llama_like,
    "qwen2_moe": _llama_like,
    "qwen3_moe": _llama_like,
    "deepseek_v3": _deepseek_v3,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "opt": _opt,
    "bloom": _bloom,
}

SUPPORTED_MODEL_TYPES = tuple(sorted(_FAMILIES))
# the families built as transformers' modelling code builds them (the rest: the canonical decoder)
_MODELLED = {k for k, v in _FAMILIES.items() if v in (_llama_like, _deepseek_v3)}


ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


def _eager(cfg: Mapping[str, Any], arch: Architecture) -> Architecture:
    """``attn_implementation``: the key transformers' configuration takes (``PreTrainedConfig``
    keeps it as ``_attn_implementation``, which ``from_config`` / ``from_pretrained`` build
    with). ``sdpa``, transformers' default, unless the body says ``eager``; and
    ``attention_dropout``, which either applies to the probabilities in training."""
    impl = cfg.get("attn_implementation")
    eager = impl is not None and impl != "sdpa"
    field = f"{_FIELD}.attn_implementation"
    if eager and impl not in ATTN_IMPLEMENTATIONS:
        raise InputError(
            field,
            f"must be one of {', '.join(ATTN_IMPLEMENTATIONS)}, got {impl!r} (other attention "
            "implementations, flash_attention_2 among them, are not modelled)",
        )
    if arch.modelling is None:
        if eager:
            raise InputError(
                field,
                f"eager attention is modelled for {', '.join(sorted(_MODELLED))}; "
                f"{cfg.get('model_type')!r} is predicted as the canonical decoder",
            )
        return arch
    dropout = cfg.get("attention_dropout")
    dropout = 0.0 if dropout is None else dropout
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise InputError(f"{_FIELD}.attention_dropout", f"must be in [0, 1), got {dropout!r}")
    if not eager and not dropout:
        return arch
    # Gemma-2 passes its attn_logit_softcapping (default 50) to the attention function; Gemma-3
    # keeps the key but passes nothing
    softcap = cfg.get("attn_logit_softcapping", 50.0)
    return replace(
        arch,
        modelling=replace(
            arch.modelling,
            eager_attention=eager,
            attn_softcap=eager and arch.modelling.family == "gemma2" and softcap is not None,
            attention_dropout=dropout > 0,
        ),
    )


def architecture_from_hf_config(cfg: Mapping[str, Any]) -> Architecture:
    """The architecture a ``config.json`` body describes."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise InputError(f"{_FIELD}.model_type", 'is required (e.g. "llama")')
    try:
        family = _FAMILIES[model_type]
    except KeyError:
        known = ", ".join(SUPPORTED_MODEL_TYPES)
        text = cfg.get("text_config")
        inner = text.get("model_type") if isinstance(text, Mapping) else None
        if isinstance(inner, str) and inner in _FAMILIES:
            # a multimodal config (Gemma 3 4B+, Mistral Small 3.1, ...): its language model is a
            # supported family, its vision tower and projector are not modelled
            raise InputError(
                f"{_FIELD}.model_type",
                f"model_type {model_type!r} adds a vision tower, which is not modelled, to a "
                f"{inner!r} language model: send its text_config as hf_config to predict the "
                "language model alone (the vision tower's parameters, states and traffic are "
                "then left out)",
            ) from None
        raise InputError(
            f"{_FIELD}.model_type", f"unsupported model_type {model_type!r}; supported: {known}"
        ) from None
    return _eager(cfg, family(cfg))
