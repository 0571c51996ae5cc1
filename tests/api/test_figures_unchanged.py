"""Every engine's figures over a broad grid of requests, pinned to the figures recorded before the
per-tensor walks were replaced by closed forms and aggregation over identical tensors.

The grid (presets, dense and mixture-of-experts architectures, a bare Ψ; Nd from 1 to 1024; every
stage, precision, offload and DeepSpeed knob that changes a walk; ZeRO++) is built here; the
recorded answer of each request is a SHA-256 of its whole response (every stage's placement,
components, notes and collectives), in ``tests/data/figures.json``. Re-record only for an
intended change of a figure::

    python3 -m tests.api.test_figures_unchanged --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.api.routes.communication import communication
from app.api.routes.memory import answer
from app.schemas.communication import CommunicationRequest
from app.schemas.memory import MemoryRequest
from bench.calc_bench import MANY_EXPERTS
from calculators.errors import InputError

DATA = Path(__file__).resolve().parents[1] / "data" / "figures.json"

_DEEPSEEK_LIKE = {  # DeepSeek-V2-Lite's shape, fewer layers: 64 routed experts, gated SiLU
    "layers": 4,
    "hidden": 2048,
    "heads": 16,
    "vocab_size": 102400,
    "ffn_hidden": 1408,
    "num_experts": 64,
    "experts_per_token": 6,
    "gated_mlp": True,
    "bias": False,
    "norm": "rmsnorm",
    "position_embedding": "rope",
    "activation": "silu",
}
_MANY_EXPERTS = MANY_EXPERTS  # the widest MoE the schema allows (bench/calc_bench.py)
_SMALL_MOE_BIASED = {  # biased experts, learned positions, odd sizes: padding on every tensor
    "layers": 3,
    "hidden": 96,
    "heads": 6,
    "vocab_size": 50257,
    "ffn_hidden": 250,
    "max_seq_len": 1023,
    "num_experts": 33,
    "experts_per_token": 3,
}
_ODD_DENSE = {  # OPT-like: projections, embedding norm, position offset, tied embeddings
    "layers": 5,
    "hidden": 200,
    "heads": 5,
    "vocab_size": 30001,
    "max_seq_len": 777,
    "position_offset": 2,
    "embed_proj_dim": 120,
    "embedding_norm": True,
    "tied_embeddings": True,
    "lm_head_bias": True,
}
_DEEP_THIN = {"layers": 400, "hidden": 32, "heads": 2, "vocab_size": 7, "max_seq_len": 16}

MODELS: dict[str, dict[str, Any]] = {
    "gpt2": {"preset": "gpt2"},
    "llama3-8b": {"preset": "llama3-8b"},
    "mixtral-8x7b": {"preset": "mixtral-8x7b"},
    "deepseek-like": {"architecture": _DEEPSEEK_LIKE},
    "moe-33-biased": {"architecture": _SMALL_MOE_BIASED},
    "odd-dense": {"architecture": _ODD_DENSE},
    "deep-thin": {"architecture": _DEEP_THIN},
    "bare-7.5b": {"params": 7_500_000_000},
    "bare-odd": {"params": 1_234_567},
}
DPS = (1, 2, 4, 8, 16, 64, 1024)
_BATCH = {"micro_batch_size": 2, "seq_len": 256}

# DeepSpeed configs that change a walk: bucket sizes, overlap, sub-groups, the coordinator's knobs
DS_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny-buckets": {"zero_optimization": {"reduce_bucket_size": 1000}},
    "small-buckets": {"zero_optimization": {"reduce_bucket_size": 100_000}},
    "mid-buckets-no-overlap": {
        "zero_optimization": {"reduce_bucket_size": 5_000_000, "overlap_comm": False}
    },
    "overlap": {"zero_optimization": {"overlap_comm": True}},
    "no-contiguous": {"zero_optimization": {"contiguous_gradients": False}},
    "unicast-reduce": {"zero_optimization": {"use_multi_rank_bucket_allreduce": False}},
    "no-reduce-scatter": {"zero_optimization": {"reduce_scatter": False}},
    "sub-groups": {"zero_optimization": {"sub_group_size": 300_000}},
    "coordinator-tight": {
        "zero_optimization": {
            "stage3_max_live_parameters": 200_000,
            "stage3_prefetch_bucket_size": 50_000,
            "stage3_max_reuse_distance": 0,
            "stage3_param_persistence_threshold": 1000,
        }
    },
    "coordinator-mid": {
        "zero_optimization": {
            "stage3_max_live_parameters": 30_000_000,
            "stage3_prefetch_bucket_size": 5_000_000,
            "stage3_max_reuse_distance": 10_000_000,
            "stage3_model_persistence_threshold": 50_000,
        }
    },
    "offload-optimizer": {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
    "offload-unpinned": {
        "zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": False}},
        "zero_force_ds_cpu_optimizer": False,
    },
    "offload-params": {
        "zero_optimization": {
            "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "cpu"},
        }
    },
    "accumulation": {"gradient_accumulation_steps": 4},
    "fp32-communication": {"communication_data_type": "fp32"},
}
# offload needs a partitioned optimizer (stages 1-3), parameter offload stage 3
_STAGES_OF = {
    "offload-optimizer": [1, 2, 3],
    "offload-unpinned": [1, 2, 3],
    "offload-params": [3],
}


def _memory_cases() -> Iterator[tuple[str, dict[str, Any]]]:
    for model_name, model in MODELS.items():
        for dp in DPS:
            for batch in (None, _BATCH) if "params" not in model else (None,):
                tag = "b" if batch else "nb"
                base: dict[str, Any] = {"model": model, "dp": dp, "stages": [0, 1, 2, 3]}
                if batch:
                    base["batch"] = batch
                yield f"mem/{model_name}/paper/dp{dp}/{tag}", base
                yield (
                    f"mem/{model_name}/paper-fp32/dp{dp}/{tag}",
                    {**base, "precision": "fp32"},
                )
                for precision in ("mixed_fp16", "mixed_bf16"):
                    for engine in ("torch", "deepspeed"):
                        yield (
                            f"mem/{model_name}/{engine}/{precision}/dp{dp}/{tag}",
                            {**base, "engine": engine, "precision": precision},
                        )
        for dp in (1, 8, 64):
            base = {"model": model, "dp": dp, "stages": [0, 1, 2, 3], "precision": "mixed_bf16"}
            if "params" not in model:
                base["batch"] = _BATCH
            for name, config in DS_CONFIGS.items():
                body = {**base, "engine": "deepspeed", "engine_config": config}
                body["stages"] = _STAGES_OF.get(name, body["stages"])
                if name == "accumulation" and "batch" in body:
                    body["batch"] = {**_BATCH, "grad_accumulation_steps": 4}
                yield f"mem/{model_name}/deepspeed/{name}/dp{dp}", body
            for optimizer in ("sgd", "adamw"):
                yield (
                    f"mem/{model_name}/deepspeed/{optimizer}/dp{dp}",
                    {**base, "engine": "deepspeed", "optimizer": optimizer},
                )
                yield (
                    f"mem/{model_name}/torch/{optimizer}/dp{dp}",
                    {**base, "engine": "torch", "optimizer": optimizer},
                )
            yield (
                f"mem/{model_name}/deepspeed/offload-request/dp{dp}",
                {
                    **base,
                    "stages": [3],
                    "engine": "deepspeed",
                    "offload": {"optimizer": "cpu", "params": "cpu"},
                },
            )
            yield (
                f"mem/{model_name}/torch/root-resharded/dp{dp}",
                {
                    **base,
                    "engine": "torch",
                    "engine_config": {"fsdp_root_reshard_after_forward": False},
                },
            )
            if "batch" in base:
                yield (
                    f"mem/{model_name}/checkpointing/dp{dp}",
                    {
                        **base,
                        "engine": "deepspeed",
                        "batch": {**_BATCH, "activation_checkpointing": "full"},
                    },
                )


def _communication_cases() -> Iterator[tuple[str, dict[str, Any]]]:
    for model_name, model in MODELS.items():
        for dp in DPS:
            base: dict[str, Any] = {"model": model, "dp": dp, "stages": [0, 1, 2, 3]}
            yield f"comm/{model_name}/paper/dp{dp}", base
            for engine in ("torch", "deepspeed"):
                yield (
                    f"comm/{model_name}/{engine}/dp{dp}",
                    {**base, "engine": engine, "precision": "mixed_bf16"},
                )
        for dp in (8, 64):
            base = {
                "model": model,
                "dp": dp,
                "stages": [0, 1, 2, 3],
                "engine": "deepspeed",
                "precision": "mixed_bf16",
            }
            for name, config in DS_CONFIGS.items():
                yield (
                    f"comm/{model_name}/deepspeed/{name}/dp{dp}",
                    {
                        **base,
                        "engine_config": config,
                        "stages": _STAGES_OF.get(name, base["stages"]),
                    },
                )
            yield (
                f"comm/{model_name}/deepspeed/accumulate/dp{dp}",
                {
                    **base,
                    "grad_accumulation_steps": 4,
                },
            )
            yield (
                f"comm/{model_name}/deepspeed/per-micro-step/dp{dp}",
                {
                    **base,
                    "grad_accumulation_steps": 4,
                    "grad_sync": "per_micro_step",
                },
            )
            for zeropp in ({"qwz": True}, {"hpz": 8}, {"qgz": True}, {"qwz": True, "hpz": 8}):
                tag = "-".join(f"{k}{v}" for k, v in zeropp.items())
                yield f"comm/{model_name}/deepspeed/zeropp-{tag}/dp{dp}", {**base, "zeropp": zeropp}
            yield (
                f"comm/{model_name}/torch/hsdp/dp{dp}",
                {
                    **base,
                    "engine": "torch",
                    "shard_group_size": 8,
                },
            )


_HEAVY = "many-experts"  # its answers take seconds per request before the closed forms


def _heavy_cases() -> Iterator[tuple[str, dict[str, Any]]]:
    model = {"architecture": _MANY_EXPERTS}
    for engine in ("paper", "torch", "deepspeed"):
        for dp in (1, 8, 1024):
            body: dict[str, Any] = {
                "model": model,
                "dp": dp,
                "stages": [0, 1, 2, 3],
                "engine": engine,
                "batch": _BATCH,
            }
            if engine != "paper":
                body["precision"] = "mixed_bf16"
            yield f"mem/{_HEAVY}/{engine}/dp{dp}", body
            comm = {k: v for k, v in body.items() if k != "batch"}
            yield f"comm/{_HEAVY}/{engine}/dp{dp}", comm
    yield (
        f"mem/{_HEAVY}/deepspeed/small-buckets/dp8",
        {
            "model": model,
            "dp": 8,
            "engine": "deepspeed",
            "precision": "mixed_bf16",
            "engine_config": {"zero_optimization": {"reduce_bucket_size": 100_000}},
            "batch": _BATCH,
        },
    )


def cases() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, body in (*_memory_cases(), *_communication_cases(), *_heavy_cases()):
        assert key not in out, key
        out[key] = body
    return out


def response(body: dict[str, Any], key: str) -> Any:
    """The whole response as JSON values, or the error naming its field."""
    try:
        if key.startswith("mem/"):
            response: Any = json.loads(bytes(answer(MemoryRequest(**body)).body))
        else:
            response = communication(CommunicationRequest(**body)).model_dump(mode="json")
    except InputError as err:
        response = {"error": err.field, "message": err.message}
    return response


def figures(body: dict[str, Any], key: str) -> str:
    """``response`` as a SHA-256 of its canonical JSON."""
    text = json.dumps(response(body, key), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


_CASES = cases()
_RECORDED: dict[str, str] = json.loads(DATA.read_text()) if DATA.exists() else {}


def test_every_case_is_recorded() -> None:
    assert sorted(_RECORDED) == sorted(_CASES)


@pytest.mark.parametrize("key", sorted(_CASES))
def test_figures_unchanged(key: str) -> None:
    assert figures(_CASES[key], key) == _RECORDED[key], key


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python3 -m tests.api.test_figures_unchanged --write")
    recorded = {key: figures(body, key) for key, body in sorted(_CASES.items())}
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(recorded, indent=0, sort_keys=True) + "\n")
    sys.stdout.write(f"{len(recorded)} cases -> {DATA}\n")
