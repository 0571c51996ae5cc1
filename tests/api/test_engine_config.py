"""engine_config as the source of truth, through the HTTP API: a DeepSpeed config (with the
"auto" values of transformers' Trainer) for engine deepspeed, FSDP2 settings for engine torch."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parents[2]

# config.json of a Llama 2 7B (meta-llama/Llama-2-7b-hf)
LLAMA_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}

# transformers' ds_config_zero3.json as its DeepSpeed documentation ships it: "auto" everywhere
TRAINER_ZERO3: dict[str, Any] = {
    "fp16": {
        "enabled": "auto",
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 16,
        "hysteresis": 2,
        "min_loss_scale": 1,
    },
    "bf16": {"enabled": "auto"},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
    },
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}

BATCH = {"micro_batch_size": 2, "seq_len": 1024, "grad_accumulation_steps": 4}


def post(client: TestClient, path: str, body: dict[str, Any], status: int = 200) -> Any:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()


def values(body: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    return {v["key"]: (v["value"], v["from"]) for v in body["resolved_config"]["values"]}


def fields(body: dict[str, Any]) -> set[str]:
    return {e["field"] for e in body["detail"]}


# --- DeepSpeed ---------------------------------------------------------------------------------


def test_trainer_config_with_auto_everywhere(client: TestClient) -> None:
    body = post(
        client,
        "/v1/memory",
        {
            "model": {"hf_config": LLAMA_7B},
            "dp": 8,
            "engine": "deepspeed",
            "precision": "mixed_bf16",
            "batch": BATCH,
            "engine_config": TRAINER_ZERO3,
        },
    )
    rc = body["resolved_config"]
    assert [s["stage"] for s in body["stages"]] == [3] == rc["stages"]
    assert (rc["stage"], rc["precision"]) == (3, "mixed_bf16")
    assert rc["offload"] == {"optimizer": "cpu", "params": "cpu"}
    # transformers Trainer: micro-batch from the batch, train_batch = world × micro × accumulation
    assert (rc["micro_batch_size"], rc["gradient_accumulation_steps"]) == (2, 4)
    assert rc["train_batch_size"] == 8 * 2 * 4
    got = values(body)
    h = LLAMA_7B["hidden_size"]
    assert got["zero_optimization.reduce_bucket_size"][0] == h * h == 16_777_216
    assert got["zero_optimization.stage3_prefetch_bucket_size"][0] == int(0.9 * h * h)
    assert got["zero_optimization.stage3_param_persistence_threshold"][0] == 10 * h
    assert got["zero_optimization.reduce_bucket_size"][1].startswith("auto: hidden_size²")
    assert got["bf16.enabled"][0] is True and got["fp16.enabled"][0] is False
    assert got["gradient_clipping"][0] is None and "no effect" in got["gradient_clipping"][1]
    assert got["zero_optimization.sub_group_size"] == (1_000_000_000, "config")
    # the same run spelled out without "auto" gives the same bytes
    spelled = json.loads(json.dumps(TRAINER_ZERO3))
    spelled["fp16"]["enabled"], spelled["bf16"] = False, {"enabled": True}
    spelled.update(
        train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=4, train_batch_size=64
    )
    spelled["zero_optimization"].update(
        reduce_bucket_size=h * h,
        stage3_prefetch_bucket_size=int(0.9 * h * h),
        stage3_param_persistence_threshold=10 * h,
    )
    for key in ("optimizer", "scheduler", "gradient_clipping"):
        spelled.pop(key)
    explicit = post(
        client,
        "/v1/memory",
        {
            "model": {"hf_config": LLAMA_7B},
            "dp": 8,
            "engine": "deepspeed",
            "batch": BATCH,
            "engine_config": spelled,
        },
    )
    assert explicit["stages"][0]["per_device"] == body["stages"][0]["per_device"]
    assert body["stages"][0]["per_device"]["peak"] is not None


def test_auto_buckets_change_the_figures(client: TestClient) -> None:
    """hidden_size² buckets, not DeepSpeed's 5e8 defaults, are what the model walks."""
    common = {"model": {"hf_config": LLAMA_7B}, "dp": 8, "engine": "deepspeed", "batch": BATCH}
    auto = post(
        client,
        "/v1/memory",
        {
            **common,
            "engine_config": {
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
            },
        },
    )
    default = post(
        client,
        "/v1/memory",
        {**common, "engine_config": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}},
    )
    assert auto["stages"][0]["per_device"]["peak"] < default["stages"][0]["per_device"]["peak"]


def test_bf16_and_stage_3_alone(client: TestClient) -> None:
    body = post(
        client,
        "/v1/memory",
        {
            "model": {"params": 7_000_000_000},
            "dp": 8,
            "engine": "deepspeed",
            "engine_config": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}},
        },
    )
    same = post(
        client,
        "/v1/memory",
        {
            "model": {"params": 7_000_000_000},
            "dp": 8,
            "engine": "deepspeed",
            "precision": "mixed_bf16",
            "stages": [3],
        },
    )
    assert [s["stage"] for s in body["stages"]] == [3]
    assert body["convention"]["precision"] == "mixed_bf16"
    assert body["stages"][0]["per_device"] == same["stages"][0]["per_device"]
    assert same["resolved_config"] is None
    rc = body["resolved_config"]
    assert rc["micro_batch_size"] is None and rc["train_batch_size"] is None


def test_config_offload_with_default_stages(client: TestClient) -> None:
    """An offload the user never sent in the request does not trip stage 0."""
    body = post(
        client,
        "/v1/memory",
        {
            "model": {"params": 1_000_000_000},
            "dp": 4,
            "engine": "deepspeed",
            "engine_config": {
                "fp16": {"enabled": True},
                "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            },
        },
    )
    assert [s["stage"] for s in body["stages"]] == [2]
    assert body["stages"][0]["cpu"]["optimizer_states"] > 0


def test_config_offload_without_a_stage_leaves_out_what_cannot_offload(client: TestClient) -> None:
    body = post(
        client,
        "/v1/memory",
        {
            "model": {"params": 1_000_000_000},
            "dp": 4,
            "engine": "deepspeed",
            "engine_config": {
                "bf16": {"enabled": True},
                "zero_optimization": {"offload_param": {"device": "cpu"}},
            },
        },
    )
    assert [s["stage"] for s in body["stages"]] == [3]
    assert body["resolved_config"]["stage"] is None
    assert any("left out" in n for n in body["resolved_config"]["notes"])


def test_config_offload_below_its_own_stage_names_both_keys(client: TestClient) -> None:
    body = post(
        client,
        "/v1/memory",
        {
            "model": {"params": 1_000_000_000},
            "dp": 4,
            "engine": "deepspeed",
            "engine_config": {
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}},
            },
        },
        status=422,
    )
    assert fields(body) == {
        "engine_config.zero_optimization.offload_param.device",
        "engine_config.zero_optimization.stage",
    }


def test_explicit_stages_including_the_configs_are_answered(client: TestClient) -> None:
    body = post(
        client,
        "/v1/memory",
        {
            "model": {"params": 1_000_000_000},
            "dp": 4,
            "engine": "deepspeed",
            "stages": [2, 3],
            "engine_config": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}},
        },
    )
    assert [s["stage"] for s in body["stages"]] == [2, 3]


CONFIG_BF16_Z3 = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}


@pytest.mark.parametrize(
    ("request_fields", "config", "named"),
    [
        (
            {"precision": "mixed_fp16"},
            CONFIG_BF16_Z3,
            {"precision", "engine_config.bf16.enabled"},
        ),
        (
            {"precision": "mixed_bf16"},
            {"fp16": {"enabled": True}},
            {"precision", "engine_config.fp16.enabled"},
        ),
        ({"stages": [1, 2]}, CONFIG_BF16_Z3, {"stages", "engine_config.zero_optimization.stage"}),
        (
            {"offload": {"optimizer": "none"}},
            {
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            },
            {"offload.optimizer", "engine_config.zero_optimization.offload_optimizer.device"},
        ),
        (
            {"stages": [0, 2]},
            {
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            },
            {"stages", "engine_config.zero_optimization.offload_optimizer.device"},
        ),
        (
            {"batch": {"micro_batch_size": 4, "seq_len": 128}},
            {**CONFIG_BF16_Z3, "train_micro_batch_size_per_gpu": 8},
            {"batch.micro_batch_size", "engine_config.train_micro_batch_size_per_gpu"},
        ),
        (
            {"batch": {"micro_batch_size": 4, "seq_len": 128, "grad_accumulation_steps": 2}},
            {**CONFIG_BF16_Z3, "gradient_accumulation_steps": 8},
            {"batch.grad_accumulation_steps", "engine_config.gradient_accumulation_steps"},
        ),
        (
            {"optimizer": "sgd"},
            {**CONFIG_BF16_Z3, "optimizer": {"type": "AdamW"}},
            {"optimizer", "engine_config.optimizer.type"},
        ),
        (
            {},
            {"fp16": {"enabled": True}, "bf16": {"enabled": True}},
            {"engine_config.fp16.enabled", "engine_config.bf16.enabled"},
        ),
        (
            {"batch": {"micro_batch_size": 4, "seq_len": 128}},
            {**CONFIG_BF16_Z3, "train_batch_size": 100, "gradient_accumulation_steps": 2},
            {
                "engine_config.train_batch_size",
                "batch.micro_batch_size",
                "engine_config.gradient_accumulation_steps",
                "dp",
            },
        ),
    ],
)
def test_explicit_contradiction_names_both_fields(
    client: TestClient, request_fields: dict[str, Any], config: dict[str, Any], named: set[str]
) -> None:
    body = post(
        client,
        "/v1/memory",
        {
            "model": {"preset": "gpt2"},
            "dp": 8,
            "engine": "deepspeed",
            **request_fields,
            "engine_config": config,
        },
        status=422,
    )
    assert fields(body) == named


@pytest.mark.parametrize(
    ("model", "config", "field", "words"),
    [
        (
            {"params": 10**9},
            {"bf16": {"enabled": True}, "zero_optimization": {"reduce_bucket_size": "auto"}},
            "engine_config.zero_optimization.reduce_bucket_size",
            "hidden size",
        ),
        (
            {"preset": "gpt2"},
            {"fp16": {"enabled": False}},
            "engine_config.fp16.enabled",
            "fp32",
        ),
        (
            {"preset": "gpt2"},
            {"bf16": {"enabled": "auto"}},
            "engine_config.bf16.enabled",
            "send precision",
        ),
        (
            {"preset": "gpt2"},
            {"bf16": {"enabled": True}, "optimizer": {"type": "Lamb"}},
            "engine_config.optimizer.type",
            "not modelled",
        ),
        (
            {"preset": "gpt2"},
            {"bf16": {"enabled": True}, "zero_optimization": {"stage": 4}},
            "engine_config.zero_optimization.stage",
            "0, 1, 2 or 3",
        ),
    ],
)
def test_config_that_cannot_be_answered_names_its_key(
    client: TestClient, model: dict[str, Any], config: dict[str, Any], field: str, words: str
) -> None:
    body = post(
        client,
        "/v1/memory",
        {"model": model, "dp": 8, "engine": "deepspeed", "engine_config": config},
        status=422,
    )
    assert fields(body) == {field}
    assert words in body["detail"][0]["msg"]


def test_auto_the_trainer_leaves_and_a_missing_batch(client: TestClient) -> None:
    """Stage-3 keys under stage 2 stay "auto" in the Trainer and DeepSpeed keeps its default;
    a micro-batch "auto" with no batch is reported unresolved, saying why."""
    body = post(
        client,
        "/v1/memory",
        {
            "model": {"preset": "gpt2"},
            "dp": 8,
            "engine": "deepspeed",
            "engine_config": {
                "fp16": {"enabled": "auto"},
                "bf16": {"enabled": "auto"},
                "train_micro_batch_size_per_gpu": "auto",
                "train_batch_size": "auto",
                "zero_optimization": {"stage": 2, "stage3_prefetch_bucket_size": "auto"},
            },
        },
    )
    got = values(body)
    value, how = got["zero_optimization.stage3_prefetch_bucket_size"]
    assert value == 50_000_000 and "only for stage 3" in how
    assert got["train_micro_batch_size_per_gpu"][0] is None
    assert "batch" in got["train_micro_batch_size_per_gpu"][1]
    # fp16 / bf16 "auto" follow the request's precision: mixed_fp16 by default
    assert got["fp16.enabled"][0] is True and got["bf16.enabled"][0] is False
    assert body["resolved_config"]["precision"] == "mixed_fp16"


def test_communication_takes_accumulation_and_stage_from_the_config(client: TestClient) -> None:
    body = post(
        client,
        "/v1/communication",
        {
            "model": {"preset": "gpt2"},
            "dp": 8,
            "engine": "deepspeed",
            "engine_config": {
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 3},
                "train_batch_size": 64,
                "gradient_accumulation_steps": 4,
            },
        },
    )
    assert [s["stage"] for s in body["stages"]] == [3]
    assert body["grad_accumulation_steps"] == 4
    assert body["resolved_config"]["micro_batch_size"] == 64 // 8 // 4
    once = post(
        client,
        "/v1/communication",
        {
            "model": {"preset": "gpt2"},
            "dp": 8,
            "engine": "deepspeed",
            "engine_config": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}},
        },
    )
    # stage 3 gathers parameters on every micro-step: four micro-steps send more
    assert body["stages"][0]["sent_bytes_per_rank"] > once["stages"][0]["sent_bytes_per_rank"]


# --- torch / FSDP2 -----------------------------------------------------------------------------

TORCH: dict[str, Any] = {
    "model": {"preset": "gpt2"},
    "dp": 8,
    "engine": "torch",
    "batch": {"micro_batch_size": 2, "seq_len": 512},
}
# what a config of accelerate's fsdp_* keys also decides under mixed precision: accelerate's
# forward wrapper returns fp32 logits
ACCELERATE: dict[str, Any] = {"engine_config": {"convert_outputs_to_fp32": True}}


@pytest.mark.parametrize(
    ("config", "same_as"),
    [
        ({"reshard_after_forward": True}, {"stages": [3]}),
        ({"reshard_after_forward": False}, {"stages": [2]}),
        (
            {
                "reshard_after_forward": True,
                "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
            },
            {"stages": [3], "precision": "mixed_bf16"},
        ),
        (
            {"mixed_precision": {"param_dtype": None, "reduce_dtype": None}},
            {"precision": "fp32"},
        ),
        (
            {
                "fsdp_config": {
                    "fsdp_version": 2,
                    "fsdp_reshard_after_forward": False,
                    "fsdp_offload_params": False,
                    "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                    "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                    "fsdp_cpu_ram_efficient_loading": True,
                }
            },
            {"stages": [2], **ACCELERATE},
        ),
        ({"fsdp_sharding_strategy": "FULL_SHARD"}, {"stages": [3], **ACCELERATE}),
        # FSDP2's CPUOffloadPolicy: stages 2 and 3 (DDP's are left out), both parts on the CPU
        *(
            (config, {"stages": [2, 3], "offload": {"optimizer": "cpu", "params": "cpu"}})
            for config in (
                {"offload_policy": "cpu"},
                {"offload_policy": {"pin_memory": True}},
                {"offload_policy": {"type": "CPUOffloadPolicy", "pin_memory": False}},
            )
        ),
        (
            {"fsdp_config": {"fsdp_version": 2, "fsdp_offload_params": True}},
            {"stages": [2, 3], "offload": {"optimizer": "cpu", "params": "cpu"}, **ACCELERATE},
        ),
        (
            {"fsdp_reshard_after_forward": True, "fsdp_offload_params": "true"},
            {"stages": [3], "offload": {"optimizer": "cpu", "params": "cpu"}, **ACCELERATE},
        ),
        ({"fsdp_sharding_strategy": 2}, {"stages": [2], **ACCELERATE}),
        # accelerate's keys with its output conversion turned off: the plain loop
        ({"fsdp_sharding_strategy": 2, "convert_outputs_to_fp32": False}, {"stages": [2]}),
        (
            {"fsdp_reshard_after_forward": True, "fsdp_activation_checkpointing": True},
            {
                "stages": [3],
                "batch": {**TORCH["batch"], "activation_checkpointing": "full"},
                **ACCELERATE,
            },
        ),
    ],
)
def test_fsdp2_settings_are_what_the_engine_models(
    client: TestClient, config: dict[str, Any], same_as: dict[str, Any]
) -> None:
    body = post(client, "/v1/memory", {**TORCH, "engine_config": config})
    plain = post(client, "/v1/memory", {**TORCH, **same_as})
    assert [s["stage"] for s in body["stages"]] == [s["stage"] for s in plain["stages"]]
    assert [s["per_device"] for s in body["stages"]] == [s["per_device"] for s in plain["stages"]]
    assert body["resolved_config"]["engine"] == "torch"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"reshard_after_forward": 8}, "engine_config.reshard_after_forward"),
        ({"offload_policy": 3}, "engine_config.offload_policy"),
        ({"offload_policy": {"pin_memory": "yes"}}, "engine_config.offload_policy.pin_memory"),
        ({"offload_policy": {"type": "NVMeOffload"}}, "engine_config.offload_policy.type"),
        ({"fsdp_sharding_strategy": "HYBRID_SHARD"}, "engine_config.fsdp_sharding_strategy"),
        ({"fsdp_sharding_strategy": "NO_SHARD"}, "engine_config.fsdp_sharding_strategy"),
        ({"fsdp_version": 1}, "engine_config.fsdp_version"),
        (
            {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float16"}},
            "engine_config.mixed_precision.reduce_dtype",
        ),
        (
            {"mixed_precision": {"param_dtype": None, "reduce_dtype": "bfloat16"}},
            "engine_config.mixed_precision.reduce_dtype",
        ),
        # the request's precision is mixed_fp16 by default: a bf16 reduce is no param dtype
        ({"reduce_dtype": "bfloat16"}, "engine_config.reduce_dtype"),
        (
            {
                "mixed_precision": {
                    "param_dtype": "bfloat16",
                    "reduce_dtype": "float32",
                    "output_dtype": "float32",
                }
            },
            "engine_config.mixed_precision.output_dtype",
        ),
        ({"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP"}, "engine_config.fsdp_auto_wrap_policy"),
        ({"zero_optimization": {"stage": 3}}, "engine_config.zero_optimization"),
    ],
)
def test_fsdp2_settings_not_modelled_are_refused(
    client: TestClient, config: dict[str, Any], field: str
) -> None:
    body = post(client, "/v1/memory", {**TORCH, "engine_config": config}, status=422)
    assert fields(body) == {field}


@pytest.mark.parametrize(
    ("request_fields", "config", "named"),
    [
        (
            {"precision": "mixed_fp16"},
            {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}},
            {"precision", "engine_config.mixed_precision.param_dtype"},
        ),
        (
            {"stages": [0, 2]},
            {"reshard_after_forward": True},
            {"stages", "engine_config.reshard_after_forward"},
        ),
        (
            {},
            {"reshard_after_forward": True, "fsdp_sharding_strategy": "SHARD_GRAD_OP"},
            {"engine_config.reshard_after_forward", "engine_config.fsdp_sharding_strategy"},
        ),
        (
            {},
            {"offload_policy": "cpu", "fsdp_config": {"fsdp_offload_params": False}},
            {"engine_config.offload_policy", "engine_config.fsdp_config.fsdp_offload_params"},
        ),
        (
            {"offload": {"params": "none"}},
            {"offload_policy": {"pin_memory": True}},
            {"offload.params", "engine_config.offload_policy"},
        ),
        (
            {"stages": [1, 2]},
            {"fsdp_offload_params": True},
            {"stages", "engine_config.fsdp_offload_params"},
        ),
    ],
)
def test_fsdp2_contradictions_name_both_fields(
    client: TestClient, request_fields: dict[str, Any], config: dict[str, Any], named: set[str]
) -> None:
    body = post(
        client, "/v1/memory", {**TORCH, **request_fields, "engine_config": config}, status=422
    )
    assert fields(body) == named


@pytest.mark.parametrize(
    "config",
    [
        {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"}},
        {"mp_policy": {"param_dtype": "bf16"}},  # null: FSDP2 reduces in the gradients' dtype
        {"mp_policy": {"param_dtype": "bfloat16", "reduce_dtype": None, "output_dtype": "bf16"}},
        {"reduce_dtype": "bfloat16"},
    ],
)
def test_fsdp2_reducing_in_16_bits_halves_what_the_reduce_scatter_moves(
    client: TestClient, config: dict[str, Any]
) -> None:
    """FSDP2's reduce-scatter in the param dtype: its bytes and buffers halve, states stay."""
    request = {
        **TORCH,
        "model": {"preset": "llama3-8b"},
        "stages": [2, 3],
        "precision": "mixed_bf16",
    }
    half = post(client, "/v1/memory", {**request, "engine_config": config})
    full = post(client, "/v1/memory", request)
    for h, f in zip(half["stages"], full["stages"], strict=True):
        assert h["per_device"]["resident"] == f["per_device"]["resident"]
        assert h["per_device"]["peak"] <= f["per_device"]["peak"]
        block = "peak_candidate_block_backward"  # the moments holding a reduce-scatter input
        assert h["components"][block] < f["components"][block]
        assert any("reduce-scattered in 16-bit" in n for n in h["notes"])
    question = {k: v for k, v in request.items() if k != "batch"}
    sent = post(client, "/v1/communication", {**question, "engine_config": config})
    plain = post(client, "/v1/communication", question)
    for h, f in zip(sent["stages"], plain["stages"], strict=True):
        rs = [c for c in h["collectives"] if c["op"] == "reduce_scatter"]
        rs_full = [c for c in f["collectives"] if c["op"] == "reduce_scatter"]
        assert [c["dtype"] for c in rs] == ["bf16"]
        assert rs[0]["sent_bytes_per_rank"] * 2 == rs_full[0]["sent_bytes_per_rank"]


def test_readme_deepspeed_example_runs(client: TestClient) -> None:
    """The README's ds_config curl, posted as written."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(
        r"# A DeepSpeed config decides.*?\ncurl -s localhost:8000(\S+) .*?-d '(.*?)'", readme, re.S
    )
    assert match, "README lost its ds_config example"
    path, body = match.group(1), json.loads(match.group(2))
    got = post(client, path, body)
    rc = got["resolved_config"]
    assert rc["stage"] == 3 and rc["precision"] == "mixed_bf16"
    assert values(got)["zero_optimization.reduce_bucket_size"][0] == 4096 * 4096


def test_auto_values_match_transformers_trainer(client: TestClient) -> None:
    """Our "auto" values against transformers' own HfTrainerDeepSpeedConfig (needs transformers,
    accelerate and deepspeed installed; the GPU hosts have them)."""
    pytest.importorskip("accelerate")
    pytest.importorskip("deepspeed")
    from types import SimpleNamespace

    from transformers.integrations.deepspeed import (
        HfTrainerDeepSpeedConfig,
        unset_hf_deepspeed_config,
    )

    dp, micro, steps = 8, 2, 4
    args = SimpleNamespace(
        world_size=dp,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=steps,
        max_grad_norm=1.0,
        learning_rate=5e-5,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        save_on_each_node=False,
        fp16=False,
        fp16_full_eval=False,
        bf16=True,
        bf16_full_eval=False,
        fp16_backend="auto",
        fp16_opt_level="O1",
        get_warmup_steps=lambda _steps: 0,
    )
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=LLAMA_7B["hidden_size"]))
    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(TRAINER_ZERO3)))
    try:
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, model, num_training_steps=100)
        trainer = hf.config
    finally:
        unset_hf_deepspeed_config()
    body = post(
        client,
        "/v1/memory",
        {
            "model": {"hf_config": LLAMA_7B},
            "dp": dp,
            "engine": "deepspeed",
            "precision": "mixed_bf16",
            "batch": {"micro_batch_size": micro, "seq_len": 1024, "grad_accumulation_steps": steps},
            "engine_config": TRAINER_ZERO3,
        },
    )
    compared = 0
    for key, (value, how) in values(body).items():
        if not how.startswith("auto") or value is None:
            continue
        node: Any = trainer
        for part in key.split("."):
            node = node[part]
        assert node == value, key
        compared += 1
    assert compared >= 8


def test_an_accelerate_config_without_a_policy_says_how_accelerate_reduces(
    client: TestClient,
) -> None:
    """accelerate's own policy reduces in the param dtype; the figures keep fp32 and say so."""
    config = {"fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": True}}
    request = {**TORCH, "precision": "mixed_bf16"}
    body = post(client, "/v1/memory", {**request, "engine_config": config})
    assert any("reduce_dtype" in n for n in body["resolved_config"]["notes"])
    config["fsdp_config"]["reduce_dtype"] = "bfloat16"
    body = post(client, "/v1/memory", {**request, "engine_config": config})
    assert body["resolved_config"]["notes"] == []
    plain = post(
        client, "/v1/memory", {**request, "engine_config": {"reshard_after_forward": True}}
    )
    assert plain["resolved_config"]["notes"] == []


# --- transformers' Trainer loop ----------------------------------------------------------------

LLAMA_1B = json.loads(
    (Path(__file__).resolve().parents[2] / "bench/hf_configs/llama-1b.json").read_text()
)


@pytest.mark.parametrize("engine", ["torch", "deepspeed"])
def test_trainer_loop_drops_the_logits_before_backward(client: TestClient, engine: str) -> None:
    body = {
        "model": {"hf_config": LLAMA_1B},
        "dp": 8,
        "engine": engine,
        "precision": "mixed_bf16",
        "batch": {"micro_batch_size": 4, "seq_len": 4096},
        "stages": [2, 3],
    }
    kept = post(client, "/v1/memory", body)["stages"]
    dropped = post(client, "/v1/memory", {**body, "engine_config": {"trainer_loop": True}})
    logits = 2 * 4 * 4096 * LLAMA_1B["vocab_size"]  # 16-bit, freed as forward returns
    for k, d in zip(kept, dropped["stages"], strict=True):
        # the loss's backward sets these peaks: without the logits, and none held between steps
        assert k["per_device"]["peak"] - d["per_device"]["peak"] == pytest.approx(logits, rel=0.01)
        assert d["per_device"]["resident"] < k["per_device"]["resident"]


def test_trainer_loop_is_refused_where_it_cannot_hold(client: TestClient) -> None:
    gpt = {"model": {"preset": "gpt2"}, "dp": 8, "engine": "torch", "batch": BATCH}
    bad = post(client, "/v1/memory", {**gpt, "engine_config": {"trainer_loop": True}}, 422)
    assert fields(bad) == {"engine_config.trainer_loop"}
    llama = {**gpt, "model": {"hf_config": LLAMA_1B}}
    both = {"trainer_loop": True, "holds_outputs": True}
    bad = post(client, "/v1/memory", {**llama, "engine_config": both}, 422)
    assert fields(bad) == {"engine_config.holds_outputs"}
    bad = post(client, "/v1/memory", {**llama, "engine_config": {"trainer_loop": "yes"}}, 422)
    assert fields(bad) == {"engine_config.trainer_loop"}


def test_an_auto_config_says_which_loop_the_figures_assume(client: TestClient) -> None:
    body = {
        "model": {"hf_config": LLAMA_1B},
        "dp": 2,
        "engine": "deepspeed",
        "batch": {"micro_batch_size": 2, "seq_len": 1024},
    }

    def loop_notes(config: dict[str, Any]) -> list[str]:
        notes = post(client, "/v1/memory", {**body, "engine_config": config})["resolved_config"]
        return [n for n in notes["notes"] if "Trainer or accelerate fills" in n]

    (note,) = loop_notes(TRAINER_ZERO3)
    assert "engine_config.trainer_loop: true" in note
    # said once the loop is: the Trainer's, or a loop that keeps its outputs
    assert loop_notes({**TRAINER_ZERO3, "trainer_loop": True}) == []
    assert loop_notes({**TRAINER_ZERO3, "holds_outputs": True}) == []
    # a config without "auto" values is not the Trainer's or accelerate's to fill
    assert loop_notes({"zero_optimization": {"stage": 3}}) == []


@pytest.mark.parametrize("key", ["trainer_loop", "holds_outputs", "compute_capability_major"])
def test_auto_is_refused_for_the_services_own_keys(client: TestClient, key: str) -> None:
    body = {
        "model": {"hf_config": LLAMA_1B},
        "dp": 2,
        "engine": "deepspeed",
        "batch": {"micro_batch_size": 2, "seq_len": 1024},
        "engine_config": {**TRAINER_ZERO3, key: "auto"},
    }
    bad = post(client, "/v1/memory", body, 422)
    assert fields(bad) == {f"engine_config.{key}"}
