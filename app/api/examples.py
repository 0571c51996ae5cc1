"""Swagger UI examples (``openapi_examples``); the paper's 7.5B / Nd = 64 case comes first."""

from __future__ import annotations

from typing import Any

MEMORY_EXAMPLES: dict[str, dict[str, Any]] = {
    "paper_figure_1": {
        "summary": "ZeRO paper Figure 1: 7.5B, Nd = 64, K = 12",
        "value": {"model": {"params": 7_500_000_000}, "dp": 64},
    },
    "preset_llama3_8b": {
        "summary": "Llama 3 8B on 8 × 80 GB, mixed bf16, optimizer offloaded to CPU",
        "value": {
            "model": {"preset": "llama3-8b"},
            "dp": 8,
            "stages": [1, 2, 3],
            "precision": "mixed_bf16",
            "offload": {"optimizer": "cpu", "params": "none"},
            "device_memory": 80_000_000_000,
        },
    },
    "architecture_with_batch": {
        "summary": "A 12-layer GPT (217,217,024 params) with a batch, engine torch",
        "value": {
            "model": {
                "architecture": {
                    "layers": 12,
                    "hidden": 1024,
                    "heads": 16,
                    "vocab_size": 32000,
                    "ffn_hidden": 4096,
                    "max_seq_len": 512,
                }
            },
            "dp": 8,
            "precision": "mixed_bf16",
            "engine": "torch",
            "batch": {"micro_batch_size": 8, "seq_len": 512},
        },
    },
    "fp32_10b": {
        "summary": "10B in pure fp32 with Adam (160 GB of model states)",
        "value": {"model": {"params": 10_000_000_000}, "dp": 1, "stages": [0], "precision": "fp32"},
    },
    "hf_config": {
        "summary": "A Hugging Face config.json body (Mistral 7B)",
        "value": {
            "model": {
                "hf_config": {
                    "model_type": "mistral",
                    "hidden_size": 4096,
                    "intermediate_size": 14336,
                    "num_hidden_layers": 32,
                    "num_attention_heads": 32,
                    "num_key_value_heads": 8,
                    "vocab_size": 32000,
                    "max_position_embeddings": 32768,
                }
            },
            "dp": 16,
            "precision": "mixed_bf16",
        },
    },
}

CAPACITY_EXAMPLES: dict[str, dict[str, Any]] = {
    "paper_table_2": {
        "summary": "ZeRO paper Table 2: 32 GB V100s, Nd = 64",
        "value": {"device_memory": 32_000_000_000, "dp": 64},
    },
    "deepspeed_offload_llama_shape": {
        "summary": "Largest Llama-3-shaped model for DeepSpeed ZeRO-2 + CPU offload on 40 GiB",
        "value": {
            "device_memory": 42_949_672_960,
            "dp": 8,
            "stages": [2],
            "engine": "deepspeed",
            "precision": "mixed_bf16",
            "offload": {"optimizer": "cpu"},
            "shape": "llama3-8b",
            "batch": {"micro_batch_size": 1, "seq_len": 4096},
        },
    },
    "min_dp_llama2_70b": {
        "summary": "Smallest Nd per stage for Llama 2 70B on 80 GB devices",
        "value": {
            "device_memory": 80_000_000_000,
            "dp": 1,
            "model": {"preset": "llama2-70b"},
            "precision": "mixed_bf16",
        },
    },
}

PLAN_EXAMPLES: dict[str, dict[str, Any]] = {
    "llama3_8b_on_8_h100": {
        "summary": "Llama 3 8B on 8 × H100 80GB, global batch 256 × 4096 tokens",
        "value": {
            "model": {"preset": "llama3-8b"},
            "gpu": "h100-sxm",
            "gpus": 8,
            "gpus_per_node": 8,
            "interconnect": "nvlink4",
            "global_batch_size": 256,
            "seq_len": 4096,
            "engine": "deepspeed",
        },
    },
    "custom_gpu_torch": {
        "summary": "A 1.3B GPT on 4 GPUs given by their figures, FSDP2 / DDP",
        "value": {
            "model": {
                "architecture": {
                    "layers": 24,
                    "hidden": 2048,
                    "heads": 16,
                    "vocab_size": 50304,
                    "max_seq_len": 2048,
                }
            },
            "gpu": {"memory": 48 * 2**30, "peak_flops": 362e12},
            "gpus": 4,
            "global_batch_size": 64,
            "seq_len": 2048,
            "engine": "torch",
            "search": {"stages": [0, 2, 3], "activation_checkpointing": ["none", "full"]},
        },
    },
}

CALIBRATION_EXAMPLES: dict[str, dict[str, Any]] = {
    "given_efficiency": {
        "summary": "An efficiency measured elsewhere (model-FLOPs utilisation from your logs)",
        "value": {
            "gpu": "h100-sxm",
            "precision": "mixed_bf16",
            "engine": "deepspeed",
            "efficiency": 0.42,
        },
    },
}
