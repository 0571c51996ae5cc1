# ruff: noqa: T201 (a script: its report goes to stdout)
"""Generated configs of every modelled family against transformers' own code, on the CPU.

Where ``tests/calculators/test_transformers_activations.py`` holds one small config per family
and named variants, this draws configs at random: widths, heads and key/value heads, head
dims, layer counts and kinds (sliding windows, NoPE layers, DeepSeek's dense layers), experts
and routing, biases, MLP activations, rotary scalings, Gemma's soft-capping and query scale,
tied embeddings, ``use_cache``, attention implementation and dropout, and batches (sequences,
lengths, padding, checkpointing, ``every_n_layers``, dtype regime). For each, the analytical
figures (``measure.trace.predicted_figures``: saved bytes, autocast weight copies, logits, the
loss's transient copy, the key/value cache) must equal the trace of transformers' forward +
loss on fake tensors (``measure.trace.figures``), and the parameter count that of the model
transformers builds on the meta device. Configs transformers itself refuses to build are drawn
again. Needs torch and transformers (``pip install -e ".[measure,hf]"``); about 0.15 s a case
on one core. Exits 1 if any case differs.

    python3 bench/trace_fuzz.py --seed 1 --cases 1000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calculators.activations import Regime, activations  # noqa: E402
from calculators.architecture import count_params  # noqa: E402
from calculators.batch import Batch, Checkpointing  # noqa: E402
from calculators.hf_config import architecture_from_hf_config  # noqa: E402

FAMILIES = (
    "llama",
    "mistral",
    "ministral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "smollm3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v3",
)
_LAYER_TYPES = ("ministral", "gemma3_text")
_WINDOWED = ("mistral", "ministral", "gemma2", "gemma3_text")
_HEAD_DIM_KEY = ("ministral", "qwen3", "gemma", "gemma2", "gemma3_text", "qwen3_moe")


def random_case(rng: random.Random) -> tuple[dict[str, Any], Batch, Regime]:
    """One config, batch and regime, drawn from ``rng``."""
    family = rng.choice(FAMILIES)
    heads = rng.choice([2, 3, 4, 6, 8])
    layers = rng.choice([1, 2, 3, 4])
    cfg: dict[str, Any] = {
        "model_type": family,
        "hidden_size": heads * rng.choice([8, 16, 24]),
        "intermediate_size": rng.choice([40, 64, 96, 200]),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": rng.choice([d for d in (1, 2, 3, 4, 6, 8) if heads % d == 0]),
        "vocab_size": rng.choice([100, 128, 257, 500]),
        "max_position_embeddings": 256,
        "pad_token_id": None,
        "bos_token_id": None,
        "eos_token_id": None,
    }
    if family == "deepseek_v3":
        cfg["num_key_value_heads"] = heads  # latent attention: every head its own k and v
        g = rng.choice([1, 2, 4])
        cfg |= {
            "q_lora_rank": rng.choice([None, 24]),
            "kv_lora_rank": rng.choice([8, 16]),
            "qk_nope_head_dim": rng.choice([8, 16, 24]),
            "qk_rope_head_dim": rng.choice([4, 8, 16]),
            "v_head_dim": rng.choice([8, 16, 32]),
            "first_k_dense_replace": rng.choice([0, 1, 2]),
            "n_routed_experts": rng.choice([4, 8]),
            "num_experts_per_tok": rng.choice([1, 2]),
            "n_group": g,
            "topk_group": rng.choice([k for k in (1, 2, 4) if k <= g]),
            "moe_intermediate_size": 32,
            "n_shared_experts": rng.choice([1, 2]),
        }
    elif family in _HEAD_DIM_KEY or rng.random() < 0.5:
        # phi3 rotates an even share of a head dim that is a multiple of 4
        cfg["head_dim"] = rng.choice([8, 16, 24, 32])
    if family == "phi3":
        cfg["partial_rotary_factor"] = rng.choice([0.5, 0.75, 1.0])
        if cfg.get("head_dim", cfg["hidden_size"] // heads) % 8:
            cfg["head_dim"] = 16
    if family == "mixtral":
        cfg["num_local_experts"] = rng.choice([2, 4, 8])
        cfg["num_experts_per_tok"] = rng.choice([1, 2])
    if family in ("qwen2_moe", "qwen3_moe"):
        cfg |= {
            "num_experts": rng.choice([2, 4, 8]),
            "num_experts_per_tok": rng.choice([1, 2]),
            "moe_intermediate_size": rng.choice([16, 32, 48]),
            "norm_topk_prob": rng.choice([True, False]),
        }
    if family == "qwen2_moe":
        cfg["shared_expert_intermediate_size"] = rng.choice([16, 48, 64])
    if family in _WINDOWED and rng.random() < 0.6:
        cfg["sliding_window"] = rng.choice([4, 8, 16, 33])
    if family in _LAYER_TYPES:
        kinds = ("sliding_attention", "full_attention")
        cfg["layer_types"] = [rng.choice(kinds) for _ in range(layers)]
    if family in ("qwen2", "qwen3") and rng.random() < 0.3:
        cfg |= {
            "use_sliding_window": True,
            "sliding_window": rng.choice([4, 16]),
            "max_window_layers": rng.choice([0, 1, 2]),
        }
    if family == "smollm3":
        cfg["no_rope_layers"] = [rng.choice([0, 1]) for _ in range(layers)]
    if family in ("llama", "qwen2", "qwen3", "mistral") and rng.random() < 0.3:
        cfg["rope_scaling"] = rng.choice(
            [
                {"rope_type": "linear", "factor": 2.0},
                {"rope_type": "dynamic", "factor": 2.0},
                {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32,
                },
            ]
        )
    if family == "phi3" and rng.random() < 0.3:
        # transformers sizes the factors by hidden_size // heads, whatever head_dim says
        cfg.pop("head_dim", None)
        half = cfg["hidden_size"] // heads * cfg["partial_rotary_factor"]
        cfg["original_max_position_embeddings"] = 32
        cfg["rope_scaling"] = {
            "type": "longrope",
            "long_factor": [1.5] * int(half // 2),
            "short_factor": [1.0] * int(half // 2),
        }
    if family in ("gemma2", "gemma3_text") and rng.random() < 0.3:
        cfg["final_logit_softcapping"] = rng.choice([None, 30.0])
        cfg["query_pre_attn_scalar"] = rng.choice([16, 64])
    if family in ("llama", "smollm3") and rng.random() < 0.3:
        cfg["mlp_bias"] = True
    if (
        family in ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe")
        and rng.random() < 0.2
    ):
        cfg["hidden_act"] = rng.choice(["gelu", "gelu_pytorch_tanh", "relu"])
    if family.startswith("gemma") and rng.random() < 0.3:
        cfg["hidden_activation"] = rng.choice(["gelu_pytorch_tanh", "gelu"])
    if family != "deepseek_v3" and rng.random() < 0.3:
        cfg["attention_bias"] = True
    if rng.random() < 0.3:
        cfg["tie_word_embeddings"] = rng.choice([True, False])
    if rng.random() < 0.3:
        cfg["attn_implementation"] = "eager"
    if rng.random() < 0.2:
        cfg["use_cache"] = False
    if rng.random() < 0.15:
        cfg["attention_dropout"] = 0.1
    checkpointing = rng.choice([Checkpointing.NONE, Checkpointing.FULL])
    batch = Batch(
        micro_batch_size=rng.choice([1, 2, 3]),
        seq_len=rng.choice([5, 16, 24, 37, 64]),
        activation_checkpointing=checkpointing,
        padded=rng.random() < 0.3,
        checkpoint_every_n_layers=rng.choice([1, 1, 2, 3])
        if checkpointing is Checkpointing.FULL
        else 1,
    )
    return cfg, batch, rng.choice(list(Regime))


class Refused(Exception):
    """transformers would not build or run the config."""


def check(cfg: dict[str, Any], batch: Batch, regime: Regime) -> tuple[tuple[int, ...], ...] | None:
    """``(predicted, traced)`` where they differ (the figures, then the parameter count),
    ``None`` where they agree; raises :class:`Refused` (transformers will not build the
    config) or the calculators' ``InputError``."""
    from measure import trace

    arch = architecture_from_hf_config(cfg)
    acts = activations(arch, batch, regime)
    try:
        built = trace.count_parameters(cfg)
        traced = trace.trace_batch(cfg, batch, regime.value)
    except Exception as e:  # transformers' own checks (a config it will not build)
        raise Refused(f"{type(e).__name__}: {e}") from e
    predicted = (*trace.predicted_figures(acts), count_params(arch))
    figures = (*trace.figures(traced), built)
    return None if predicted == figures else (predicted, figures)


def main(argv: list[str] | None = None) -> int:
    from calculators.errors import InputError

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cases", type=int, default=200)
    a = p.parse_args(argv)
    rng = random.Random(a.seed)
    ran = 0
    refused: dict[str, int] = {}
    differ = []
    while ran < a.cases:
        cfg, batch, regime = random_case(rng)
        try:
            result = check(cfg, batch, regime)
        except (InputError, Refused) as e:
            why = "calculators: " + e.field if isinstance(e, InputError) else str(e).split(":")[0]
            refused[why] = refused.get(why, 0) + 1
            continue
        ran += 1
        if result is not None:
            differ.append((cfg, batch, regime, result))
            print(json.dumps(cfg), batch, regime.value)
            print("  predicted", result[0])
            print("  traced   ", result[1])
    print(f"seed {a.seed}: {ran} cases, {len(differ)} differ")
    for why, n in sorted(refused.items()):
        print(f"  drawn again {n} times: {why}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
