"""POST /v1/communication and GET /v1/interconnects from the outside."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from measure.hf_families import family_config

PSI = {"params": 1_000_000_000}
ROOT = Path(__file__).resolve().parents[2]


def post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/communication", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_paper_figure_through_http(client: TestClient) -> None:
    body = post(client, {"model": PSI, "dp": 8})
    assert [s["sent_bytes_per_rank"] for s in body["stages"]] == [
        3_500_000_000,
        3_500_000_000,
        3_500_000_000,
        5_250_000_000,
    ]
    assert [s["ratio_to_ddp"] for s in body["stages"]] == [1, 1, 1, 1.5]
    assert body["convention"]["engine"] == "paper"
    assert "§7" in body["convention"]["description"]
    assert "overlap" in body["convention"]["ignores"]
    s3 = body["stages"][3]
    assert [(c["op"], c["phase"]) for c in s3["collectives"]] == [
        ("all_gather", "forward"),
        ("all_gather", "backward"),
        ("reduce_scatter", "backward"),
    ]
    for c in s3["collectives"]:
        assert c["payload_bytes"] == 2_000_000_000
        assert c["sent_bytes_per_rank"] == 1_750_000_000
        assert (c["dtype"], c["group_size"], c["link"]) == ("fp16", 8, "intra_node")
    assert s3["time_seconds"] > 0


def test_nd_1_sends_nothing_through_http(client: TestClient) -> None:
    body = post(client, {"model": PSI, "dp": 1})
    for s in body["stages"]:
        assert s["sent_bytes_per_rank"] == 0 and s["ratio_to_ddp"] is None
        assert s["time_seconds"] == 0


@pytest.mark.parametrize("engine", ["paper", "deepspeed", "torch"])
def test_every_engine_names_its_convention(client: TestClient, engine: str) -> None:
    body = post(
        client,
        {
            "model": {"preset": "gpt2"},
            "dp": 16,
            "engine": engine,
            "gpus_per_node": 8,
            "grad_accumulation_steps": 2,
        },
    )
    assert body["convention"]["description"].startswith(engine)
    assert body["topology"]["nodes"] == 2 and body["topology"]["dp_group_nodes"] == 2
    for s in body["stages"]:
        assert s["sent_bytes_per_rank"] == sum(c["sent_bytes_per_rank"] for c in s["collectives"])
        for c in s["collectives"]:
            assert (
                c["intra_node_bytes_per_rank"] + c["inter_node_bytes_per_rank"]
                == (c["sent_bytes_per_rank"])
            )


def test_deepspeed_config_and_offload_through_http(client: TestClient) -> None:
    body = post(
        client,
        {
            "model": {"preset": "llama2-7b"},
            "dp": 32,
            "engine": "deepspeed",
            "precision": "mixed_bf16",
            "stages": [3],
            "offload": {"optimizer": "cpu"},
            "engine_config": {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}},
        },
    )
    (s3,) = body["stages"]
    assert s3["offload_transfers"] and s3["offload_time_seconds"] > 0
    bwd = [c for c in s3["collectives"] if c["phase"] == "backward" and c["op"] == "all_gather"]
    assert bwd and all(c["link"] == "intra_node" for c in bwd)


def test_fsdp2_cpu_offload_moves_shards_at_stages_2_and_3(client: TestClient) -> None:
    # CPUOffloadPolicy runs at reshard_after_forward False (stage 2) too: the shards go up for
    # every all-gather (once at stage 2, twice at 3), the reduced gradients come down
    body = post(
        client,
        {
            "model": {"preset": "llama3-8b"},
            "dp": 8,
            "engine": "torch",
            "precision": "mixed_bf16",
            "engine_config": {"offload_policy": "cpu"},
        },
    )
    s2, s3 = body["stages"]
    assert (s2["stage"], s3["stage"]) == (2, 3)
    up = [
        sum(t["bytes"] for t in s["offload_transfers"] if t["direction"] == "h2d") for s in (s2, s3)
    ]
    assert up[1] == 2 * up[0] > 0


def test_custom_links(client: TestClient) -> None:
    slow = post(
        client,
        {
            "model": PSI,
            "dp": 16,
            "gpus_per_node": 8,
            "inter_node_interconnect": {"bandwidth": 1e9, "latency": 1e-4},
        },
    )
    fast = post(
        client, {"model": PSI, "dp": 16, "gpus_per_node": 8, "inter_node_interconnect": "ib_xdr"}
    )
    assert slow["links"]["inter_node"]["name"] == "custom"
    assert fast["links"]["inter_node"]["source"].startswith("NVIDIA ConnectX-8")
    assert all(
        a["time_seconds"] > b["time_seconds"]
        for a, b in zip(slow["stages"], fast["stages"], strict=True)
    )


def test_interconnect_presets(client: TestClient) -> None:
    r = client.get("/v1/interconnects")
    assert r.status_code == 200
    names = {p["name"]: p for p in r.json()}
    assert names["nvlink4"]["bandwidth"] == 450_000_000_000
    assert all(p["source"] for p in names.values())


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"nodes": 3}, "nodes"),
        ({"gpus_per_node": 3}, "gpus_per_node"),
        ({"nodes": 2, "gpus_per_node": 8}, "gpus_per_node"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"interconnect": "nvlink9"}, "interconnect"),
        ({"inter_node_interconnect": {"bandwidth": -1}}, "inter_node_interconnect"),
        ({"shard_group_size": 3}, "shard_group_size"),
        ({"zeropp": {"hpz": 3}}, "zeropp.hpz"),
        ({"grad_accumulation_steps": 0}, "grad_accumulation_steps"),
        ({"engine": "torch", "zeropp": {"qwz": True}}, "zeropp"),
        ({"engine": "deepspeed", "shard_group_size": 4}, "shard_group_size"),
        (
            {
                "engine": "deepspeed",
                "engine_config": {"zero_optimization": {"stage3_max_reuse_distance": -1}},
            },
            "engine_config.zero_optimization.stage3_max_reuse_distance",
        ),
        (
            {"engine": "torch", "engine_config": {"fsdp_root_reshard_after_forward": 1}},
            "engine_config.fsdp_root_reshard_after_forward",
        ),
        ({"offload": {"params": "cpu"}, "stages": [2]}, "offload.params"),
    ],
)
def test_bad_input_names_the_field(client: TestClient, extra: dict[str, Any], field: str) -> None:
    r = client.post("/v1/communication", json={"model": PSI, "dp": 8, **extra})
    assert r.status_code == 422, r.text
    assert any(e["field"].startswith(field) for e in r.json()["detail"]), r.json()


def test_nan_bandwidth_is_a_422_not_a_500(client: TestClient) -> None:
    raw = '{"model": {"params": 1000}, "dp": 8, "interconnect": {"bandwidth": NaN}}'
    r = client.post("/v1/communication", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422


def test_deepspeed_recomputation_gathers_again_through_http(client: TestClient) -> None:
    # Qwen2.5-0.5B under the Trainer's "auto" stage-3 knobs: with every layer recomputed the
    # reuse walk of forward's first layers reaches past 1e9 elements, so they are released and
    # gathered again for their recomputation, as DeepSpeed did on the CPU and on the GPUs
    # (bench/results/ds_cpu_gathers_real_checkpointing.json): 608,878,592 elements, not
    # 493,961,216
    hf = json.loads((ROOT / "bench" / "hf_configs" / "qwen2.5-0.5b.json").read_text())
    zero = {
        "stage": 3,
        "reduce_bucket_size": 802816,
        "stage3_prefetch_bucket_size": 722534,
        "stage3_param_persistence_threshold": 8960,
    }
    base = {
        "model": {"hf_config": hf},
        "dp": 2,
        "engine": "deepspeed",
        "precision": "mixed_bf16",
        "engine_config": {"zero_optimization": zero, "bf16": {"enabled": True}},
    }
    gathered = {}
    for policy in ("none", "full"):
        (s3,) = post(client, {**base, "activation_checkpointing": policy})["stages"]
        (forward,) = [c for c in s3["collectives"] if c["phase"] == "forward"]
        gathered[policy] = (forward["op"], forward["calls"], forward["payload_bytes"])
    # 16-bit copies of every gathered parameter (sizes even: no padding at Nd 2)
    assert gathered == {
        "none": ("all_gather", 121, 2 * 493_961_216),
        "full": ("all_gather", 160, 2 * 608_878_592),
    }


RECOMPUTE_RUNS = json.loads((ROOT / "bench" / "results" / "recompute" / "h200x2.json").read_text())


@pytest.mark.parametrize("name", sorted(RECOMPUTE_RUNS))
def test_deepspeed_recomputation_sends_what_the_gpus_sent(client: TestClient, name: str) -> None:
    # bench/gpu/recompute_round.sh on 2 × H200: small family configs at stage 3 with a live cap
    # below the model, with and without transformers' gradient checkpointing; each run's bytes
    # sent per rank predicted again from its config (the few bytes apart: scalar all-reduces)
    run = RECOMPUTE_RUNS[name]
    family, policy = name.split("_")
    (measured,) = run["result"]["runs"]
    sent = measured["communication"]["measured_sent_bytes_per_rank"]
    body = {
        "model": {"hf_config": family_config(family, "small")},
        "dp": measured["world_size"],
        "engine": "deepspeed",
        "precision": "mixed_bf16",
        "stages": [3],
        "engine_config": run["engine_config"],
        "activation_checkpointing": policy,
    }
    (s3,) = post(client, body)["stages"]
    assert abs(s3["sent_bytes_per_rank"] - sent) <= 16, (s3["sent_bytes_per_rank"], sent)
