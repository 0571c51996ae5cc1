"""Every request example of the API, in one place: Swagger UI shows them and "Try it out" sends
them (``app.api.openapi`` attaches ``EXAMPLES`` to each POST operation); the tests send each one
and expect a 2xx. The paper's 7.5B / Nd = 64 case comes first where it applies.
"""

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
    "padded_batch": {
        "summary": "Llama 3 8B under FSDP2 on a padding collator's batches (attention_mask zeros)",
        "value": {
            "model": {"preset": "llama3-8b"},
            "dp": 8,
            "stages": [3],
            "precision": "mixed_bf16",
            "engine": "torch",
            "batch": {"micro_batch_size": 2, "seq_len": 4096, "padded": True},
            "device_memory": 80_000_000_000,
        },
    },
    "checkpoint_offload": {
        "summary": "Llama 3 8B under FSDP2, checkpointed layers' inputs offloaded to the host",
        "value": {
            "model": {"preset": "llama3-8b"},
            "dp": 8,
            "stages": [3],
            "precision": "mixed_bf16",
            "engine": "torch",
            "batch": {
                "micro_batch_size": 1,
                "seq_len": 8192,
                "activation_checkpointing": "full",
                "checkpoint_offload": True,
            },
            "device_memory": 80_000_000_000,
        },
    },
    "every_n_layers": {
        "summary": "Llama 3 8B under FSDP2, every second decoder layer checkpointed "
        "(transformers' every_n_layers=2)",
        "value": {
            "model": {"preset": "llama3-8b"},
            "dp": 8,
            "stages": [2, 3],
            "precision": "mixed_bf16",
            "engine": "torch",
            "batch": {
                "micro_batch_size": 1,
                "seq_len": 8192,
                "activation_checkpointing": "full",
                "checkpoint_every_n_layers": 2,
            },
            "device_memory": 80_000_000_000,
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

COMMUNICATION_EXAMPLES: dict[str, dict[str, Any]] = {
    "paper_figure": {
        "summary": "ZeRO §7: Ψ = 1e9, Nd = 8, fp16 (3.5e9 / 3.5e9 / 3.5e9 / 5.25e9 bytes)",
        "value": {"model": {"params": 1_000_000_000}, "dp": 8},
    },
    "deepspeed_llama2_7b": {
        "summary": "Llama 2 7B on 4 × 8 H100, DeepSpeed defaults, NDR InfiniBand",
        "value": {
            "model": {"preset": "llama2-7b"},
            "dp": 32,
            "precision": "mixed_bf16",
            "engine": "deepspeed",
            "gpus_per_node": 8,
            "interconnect": "nvlink4",
            "inter_node_interconnect": "ib_ndr",
        },
    },
    "torch_fsdp2_hsdp": {
        "summary": "FSDP2 with HSDP: shard in a node of 8, replicate across 4 nodes",
        "value": {
            "model": {"preset": "llama3-8b"},
            "dp": 32,
            "stages": [2, 3],
            "precision": "mixed_bf16",
            "engine": "torch",
            "gpus_per_node": 8,
            "shard_group_size": 8,
        },
    },
    "custom_link": {
        "summary": "Two nodes over 100 GbE given as numbers, gradient accumulation 4",
        "value": {
            "model": {"params": 1_300_000_000},
            "dp": 16,
            "gpus_per_node": 8,
            "grad_accumulation_steps": 4,
            "inter_node_interconnect": {"bandwidth": 12.5e9, "latency": 2e-5},
        },
    },
}

SWEEP_EXAMPLES: dict[str, dict[str, Any]] = {
    "paper_all_stages": {
        "summary": "ZeRO paper's 7.5B model, stages 0-3, Nd = 1 ... 4096",
        "value": {"model": {"params": 7_500_000_000}, "dp": 64},
    },
    "preset_with_batch": {
        "summary": "Llama 3 8B with a batch, engine torch, on 80 GB devices",
        "value": {
            "model": {"preset": "llama3-8b"},
            "dp": 8,
            "dp_values": [1, 2, 4, 8, 16, 32, 64],
            "precision": "mixed_bf16",
            "engine": "torch",
            "batch": {"micro_batch_size": 1, "seq_len": 4096},
            "device_memory": 80_000_000_000,
        },
    },
}

INFERENCE_EXAMPLES: dict[str, dict[str, Any]] = {
    "llama2_7b_4k": {
        "summary": "Llama 2 7B in bf16, one 4096-token sequence",
        "value": {"model": {"preset": "llama2-7b"}, "context": 4096},
    },
    "weights_10b_fp16": {
        "summary": "A 10B model: weights alone in fp16",
        "value": {"model": {"params": 10_000_000_000}, "weights": "fp16"},
    },
}

# Small enough to finish in seconds on a CPU as on a GPU (a few MB of model states).
MEASURE_EXAMPLES: dict[str, dict[str, Any]] = {
    "mlp_all_stages": {
        "summary": "An MLP of 2 Linear(64, 64), 2 simulated ranks, stages 0-3, one step",
        "value": {
            "model": {"preset": "mlp-2x64"},
            "dp": 2,
            "mode": "simulated",
            "steps": 1,
            "warmup_steps": 1,
        },
    },
    "tiny_transformer": {
        "summary": "A 2-layer GPT of width 64 with a batch of 2 × 32 tokens, stages 1 and 3",
        "value": {
            "model": {
                "architecture": {
                    "layers": 2,
                    "hidden": 64,
                    "heads": 4,
                    "vocab_size": 256,
                    "max_seq_len": 32,
                }
            },
            "dp": 2,
            "stages": [1, 3],
            "mode": "simulated",
            "steps": 1,
            "warmup_steps": 1,
            "batch": {"micro_batch_size": 2, "seq_len": 32},
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
        "summary": "A GEMM efficiency measured elsewhere (e.g. a profiler's GEMM TFLOP/s over "
        "the dense peak)",
        "value": {
            "gpu": "h100-sxm",
            "precision": "mixed_bf16",
            "engine": "deepspeed",
            "efficiency": 0.72,
        },
    },
}

# Request examples by path of their POST operation.
EXAMPLES: dict[str, dict[str, dict[str, Any]]] = {
    "/v1/memory": MEMORY_EXAMPLES,
    "/v1/memory/sweep": SWEEP_EXAMPLES,
    "/v1/capacity": CAPACITY_EXAMPLES,
    "/v1/communication": COMMUNICATION_EXAMPLES,
    "/v1/inference": INFERENCE_EXAMPLES,
    "/v1/measure": MEASURE_EXAMPLES,
    "/v1/plan": PLAN_EXAMPLES,
    "/v1/calibrations": CALIBRATION_EXAMPLES,
}
