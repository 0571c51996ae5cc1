"""Every valid /v1/memory and /v1/communication body is answered within a second of CPU time.

The bound is the service's promise for a single request, whatever the architecture: bodies are
generated up to the schema's limits on layers, experts (layers × experts up to 65,536 MLPs) and
vocabulary, for every engine. Each body is answered in process, the way the route answers it
(its caches cleared, so the tensor list and the engine walks are built afresh), and timed with
``time.process_time`` (CPU of this process only, so other load on the machine does not count).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.api.routes.communication import communication
from app.api.routes.memory import answer
from app.schemas.communication import CommunicationRequest
from app.schemas.memory import MemoryRequest
from bench.calc_bench import MANY_EXPERTS
from calculators.architecture import MAX_BLOCK_MLPS, _tensors
from calculators.engines.deepspeed import allocator, stage3
from calculators.errors import InputError
from calculators.parameters import architecture_params

CPU_SECONDS = 1.0
PRECISIONS = {
    "paper": ("fp32", "mixed_fp16", "mixed_bf16", "bf16"),
    "torch": ("fp32", "mixed_fp16", "mixed_bf16", "bf16"),
    "deepspeed": ("mixed_fp16", "mixed_bf16"),
}

STAGE3_KNOBS = {
    "stage3_param_persistence_threshold": [0, 100_000, 10**9],
    "stage3_max_live_parameters": [0, 300_000, 10**9, 10**12],
    "stage3_prefetch_bucket_size": [0, 1000, 50_000_000, 10**12],
    "stage3_max_reuse_distance": [0, 30_000_000, 10**12],
    "stage3_model_persistence_threshold": [0, 1_000_000],
}


@st.composite
def architectures(draw: st.DrawFn) -> dict[str, Any]:
    layers = draw(st.sampled_from([1, 2, 16, 61, 128, 1000, 10_000]))
    experts = draw(
        st.sampled_from([1, 8, 64, 256, 4096]).filter(lambda e: layers * e <= MAX_BLOCK_MLPS)
    )
    heads = draw(st.sampled_from([1, 4, 32, 128]))
    head_dim = draw(st.sampled_from([1, 16, 128]))
    kv_heads = draw(st.sampled_from([h for h in (1, 2, 8, heads) if heads % h == 0]))
    learned = draw(st.booleans())
    arch: dict[str, Any] = {
        "layers": layers,
        "hidden": heads * head_dim,
        "heads": heads,
        "kv_heads": kv_heads,
        "vocab_size": draw(st.sampled_from([7, 32_000, 151_936, 16_777_216])),
        "ffn_hidden": draw(st.sampled_from([None, 1, 1408, 14_336])),
        "num_experts": experts,
        "experts_per_token": draw(st.integers(1, min(experts, 8))),
        "gated_mlp": draw(st.booleans()),
        "bias": draw(st.booleans()),
        "tied_embeddings": draw(st.booleans()),
        "norm": draw(st.sampled_from(["layernorm", "rmsnorm"])),
        "position_embedding": "learned" if learned else draw(st.sampled_from(["rope", "none"])),
    }
    if learned:
        arch["max_seq_len"] = draw(st.sampled_from([16, 4096, 1_048_576]))
    return arch


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    engine = draw(st.sampled_from(sorted(PRECISIONS)))
    model = draw(
        st.one_of(
            st.builds(lambda a: {"architecture": a}, architectures()),
            st.builds(lambda p: {"preset": p}, st.sampled_from(["llama3-8b", "mixtral-8x7b"])),
            st.builds(lambda p: {"params": p}, st.integers(1, 10**15)),
        )
    )
    body: dict[str, Any] = {
        "model": model,
        "dp": draw(st.sampled_from([1, 2, 8, 64, 1024, 2**20])),
        "stages": draw(st.sets(st.integers(0, 3), min_size=1).map(sorted)),
        "engine": engine,
        "precision": draw(st.sampled_from(PRECISIONS[engine])),
    }
    if engine == "deepspeed" and draw(st.booleans()):
        zero: dict[str, Any] = {
            "reduce_bucket_size": draw(st.sampled_from([1000, 100_000, 500_000_000])),
            "overlap_comm": draw(st.booleans()),
        }
        # the stage-3 coordinator's knobs: tensors released or kept, prefetched far ahead or
        # fetched on demand, re-gathered or kept into backward
        for knob, values in STAGE3_KNOBS.items():
            if draw(st.booleans()):
                zero[knob] = draw(st.sampled_from(values))
        body["engine_config"] = {"zero_optimization": zero}
    if draw(st.booleans()):
        return "communication", body
    if "params" not in model and draw(st.booleans()):
        body["batch"] = {
            "micro_batch_size": draw(st.sampled_from([1, 2, 64])),
            "seq_len": draw(st.sampled_from([1, 4096, 131_072])),
            "grad_accumulation_steps": draw(st.sampled_from([1, 4])),
        }
    return "memory", body


# The widest MoE the schema allows (16 layers x 4,096 experts: 196,691 tensors): the DeepSpeed
# walks read its identical experts as one run (calculators.parameters.ParamList, the stage-3
# coordinator's run-length trace).
_MANY_EXPERTS = MANY_EXPERTS  # the widest MoE the schema allows (bench/calc_bench.py)
_WIDEST = {"model": {"architecture": _MANY_EXPERTS}, "dp": 8, "stages": [0, 1, 2, 3]}
# the same with experts over stage3_param_persistence_threshold (262,144 elements each): each
# block's 4,096 experts are released and re-gathered, one run of identical copies each way
_RELEASED_EXPERTS = {
    **_WIDEST,
    "model": {"architecture": {**_MANY_EXPERTS, "hidden": 512, "ffn_hidden": 512}},
    "engine": "deepspeed",
    "precision": "mixed_bf16",
}
# hidden 2048: experts of 1,048,576 elements, each of stage 0's copies in the large pool, where
# the allocator replay walks only the first few of each run of identical experts
_WIDE_EXPERTS = {
    **_RELEASED_EXPERTS,
    "model": {"architecture": {**_MANY_EXPERTS, "hidden": 2048, "ffn_hidden": 512}},
}
_ONE_BY_128 = {"micro_batch_size": 1, "seq_len": 128}
# Ψ = 1e15 with one-element gradient buckets: 1e15 buckets, counted without listing them
_ONE_ELEMENT_BUCKETS = {
    "model": {"params": 10**15},
    "dp": 8,
    "engine": "deepspeed",
    "precision": "mixed_bf16",
    "engine_config": {"zero_optimization": {"reduce_bucket_size": 1}},
}

# a transformers model whose layers differ (sliding-window layers beside every sixth full one)
# with every second layer checkpointed: the walks go layer by layer
_GEMMA3 = json.loads((Path(__file__).parents[2] / "bench/hf_configs/gemma-3-1b.json").read_text())
_EVERY_SECOND_LAYER = {
    "model": {"hf_config": {**_GEMMA3, "num_hidden_layers": 10_000}},
    "dp": 8,
    "stages": [0, 1, 2, 3],
    "engine": "torch",
    "precision": "mixed_bf16",
    "batch": {
        "micro_batch_size": 1,
        "seq_len": 4096,
        "activation_checkpointing": "full",
        "checkpoint_every_n_layers": 2,
    },
}


def _cold() -> None:
    for cached in (
        _tensors,
        architecture_params,
        stage3._stage3_trace,
        stage3._stage3_plan,
        allocator._replay,
    ):
        cached.cache_clear()


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(bodies())
@example(("memory", {**_WIDEST, "engine": "paper"}))
@example(("communication", _ONE_ELEMENT_BUCKETS))
@example(("communication", {**_WIDEST, "engine": "paper"}))
@example(("memory", {**_WIDEST, "engine": "torch", "precision": "mixed_bf16"}))
@example(("communication", {**_WIDEST, "engine": "torch", "precision": "mixed_bf16"}))
@example(
    ("memory", {**_WIDEST, "engine": "torch", "precision": "mixed_bf16", "batch": _ONE_BY_128})
)
@example(("memory", {**_WIDEST, "engine": "deepspeed", "precision": "mixed_bf16"}))
@example(("communication", {**_WIDEST, "engine": "deepspeed", "precision": "mixed_bf16"}))
# the persistent experts again, but only the first million elements of them kept (the model's
# persistence threshold): copies alike in persistence are taken together
@example(
    (
        "memory",
        {
            **_WIDEST,
            "engine": "deepspeed",
            "precision": "mixed_bf16",
            "engine_config": {
                "zero_optimization": {"stage3_model_persistence_threshold": 1_000_000}
            },
        },
    )
)
@example(("memory", _RELEASED_EXPERTS))
@example(("communication", _RELEASED_EXPERTS))
@example(("memory", _WIDE_EXPERTS))
@example(("memory", _EVERY_SECOND_LAYER))
def test_each_request_takes_under_a_second_of_cpu(
    endpoint_body: tuple[str, dict[str, Any]],
) -> None:
    endpoint, body = endpoint_body
    _cold()
    start = time.process_time()
    try:
        if endpoint == "memory":
            answer(MemoryRequest(**body))
        else:
            communication(CommunicationRequest(**body))
    except InputError:
        pass  # a 4xx naming the field: answered all the same
    spent = time.process_time() - start
    assert spent < CPU_SECONDS, f"{spent:.2f} s of CPU for {endpoint} {body}"
