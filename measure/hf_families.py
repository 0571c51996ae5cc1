"""Small Hugging Face configs of the families ``measure`` builds with transformers.

Each family keeps its shape (grouped-query ratio, gated MLP, tied or untied embeddings, q/k
norms, qkv bias, sliding windows, experts) at a width and depth that trains in seconds:
``tiny`` for CPU tests, ``small`` (~30-130M parameters) for GPU validation runs. The bodies are
``config.json`` bodies: what ``model.hf_config`` carries.
"""

from __future__ import annotations

from typing import Any

# family -> (config fields that give it its shape, beyond the common sizes below)
_SHAPES: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "tie_word_embeddings": False},
    "mistral": {"model_type": "mistral", "tie_word_embeddings": False, "sliding_window": None},
    # a full layer then three sliding ones over half the context (family_config)
    "ministral": {
        "model_type": "ministral",
        "tie_word_embeddings": False,
        "head_dim": None,
        "sliding_window": None,
    },
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": True},
    "qwen3": {"model_type": "qwen3", "tie_word_embeddings": True, "head_dim": None},
    "gemma": {"model_type": "gemma", "tie_word_embeddings": True, "head_dim": None},
    "gemma2": {
        "model_type": "gemma2",
        "tie_word_embeddings": True,
        "head_dim": None,
        "sliding_window": None,
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        "tie_word_embeddings": True,
        "head_dim": None,
        "sliding_window": None,
    },
    "phi3": {"model_type": "phi3", "tie_word_embeddings": False},
    # every fourth layer rotates nothing (no_rope_layer_interval's default)
    "smollm3": {"model_type": "smollm3", "tie_word_embeddings": True},
    "mixtral": {
        "model_type": "mixtral",
        "tie_word_embeddings": False,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "qwen2_moe": {
        "model_type": "qwen2_moe",
        "tie_word_embeddings": False,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": None,
        "shared_expert_intermediate_size": None,
    },
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "tie_word_embeddings": False,
        "head_dim": None,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "moe_intermediate_size": None,
    },
    # multi-head latent attention, one dense layer, then sigmoid-routed experts in groups
    # plus a shared expert (the latent widths and experts follow the size: see family_config)
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        "tie_word_embeddings": False,
        "first_k_dense_replace": 1,
        "n_shared_experts": 1,
    },
}
FAMILIES = tuple(_SHAPES)

# (layers, hidden, heads, kv heads, ffn, vocab, positions)
SIZES = {
    "tiny": (2, 64, 4, 2, 128, 256, 128),
    "small": (8, 768, 12, 4, 2048, 32000, 2048),
    # a ~1B dense shape (Llama: 886M): per-tensor allocator rounding weighs less than at small
    "medium": (16, 2048, 16, 8, 5632, 32000, 4096),
}

# DeepSeek's routing: (experts, experts per token, expert groups, groups chosen per token)
_DEEPSEEK_ROUTING = {"tiny": (4, 2, 2, 1), "small": (16, 4, 4, 2), "medium": (16, 4, 4, 2)}


def family_config(family: str, size: str = "tiny") -> dict[str, Any]:
    """The ``config.json`` body of ``family`` at ``size`` (a :data:`SIZES` name)."""
    layers, hidden, heads, kv_heads, ffn, vocab, positions = SIZES[size]
    body: dict[str, Any] = {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": ffn,
        "vocab_size": vocab,
        "max_position_embeddings": positions,
        # token ids inside the small vocabulary (some families default to ids past it)
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    for key, value in _SHAPES[family].items():
        if value is not None:
            body[key] = value
        elif key == "head_dim":
            body[key] = hidden // heads
        elif key == "sliding_window":
            body[key] = positions // 2  # local layers see half the context
        else:  # the experts' widths
            body[key] = ffn // 2
    if family == "ministral":  # Ministral-8B's interleaving: one full layer to three sliding
        body["layer_types"] = [
            "full_attention" if i % 4 == 0 else "sliding_attention" for i in range(layers)
        ]
    if family == "deepseek_v3":
        head = hidden // heads
        experts, top_k, groups, top_groups = _DEEPSEEK_ROUTING[size]
        body.update(
            num_key_value_heads=heads,  # latent attention: every head its own keys and values
            q_lora_rank=hidden // 4,
            kv_lora_rank=hidden // 8,
            qk_nope_head_dim=head,
            qk_rope_head_dim=head // 2,  # q/k heads 1.5 × the value heads, as in DeepSeek-V3
            v_head_dim=head,
            moe_intermediate_size=ffn // 4,
            n_routed_experts=experts,
            num_experts_per_tok=top_k,
            n_group=groups,
            topk_group=top_groups,
        )
    return body
