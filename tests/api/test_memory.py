"""POST /v1/memory from the outside: published figures, conventions, offload, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.calculators.test_zero_paper import MODELS, TABLE_1, agrees_to_printed_precision

GB = 10**9


def post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/memory", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_figure_1_through_http(client: TestClient) -> None:
    body = post(client, {"model": {"params": 7_500_000_000}, "dp": 64})
    got = [s["per_device"]["model_states"] for s in body["stages"]]
    assert got == [120_000_000_000, 31_406_250_000, 16_640_625_000, 1_875_000_000]
    assert body["convention"]["engine"] == "paper"
    assert body["convention"]["k"] == 12
    assert body["stages"][1]["per_device_readable"]["model_states"] == "31.41 GB (29.25 GiB)"


@pytest.mark.parametrize("nd", sorted(TABLE_1))
def test_table_1_through_http(client: TestClient, nd: int) -> None:
    for psi, cells in zip(MODELS, TABLE_1[nd], strict=True):
        body = post(client, {"model": {"params": psi}, "dp": nd, "stages": [1, 2, 3]})
        got = [s["per_device"]["model_states"] / GB for s in body["stages"]]
        assert all(
            agrees_to_printed_precision(g, c) for g, c in zip(got, cells.split(), strict=True)
        )


def test_10b_fp32_through_http(client: TestClient) -> None:
    fp32 = post(client, {"model": {"params": 10**10}, "dp": 1, "stages": [0], "precision": "fp32"})
    half = post(
        client,
        {
            "model": {"params": 10**10},
            "dp": 1,
            "stages": [0],
            "precision": "mixed_bf16",
            "master_weights": False,
        },
    )
    assert fp32["stages"][0]["per_device"]["model_states"] == 160 * GB
    assert half["stages"][0]["per_device"]["model_states"] == 120 * GB


def test_architecture_preset_and_hf_config_agree(client: TestClient) -> None:
    arch = {
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "vocab_size": 32000,
        "ffn_hidden": 11008,
        "max_seq_len": 4096,
        "bias": False,
        "norm": "rmsnorm",
        "position_embedding": "rope",
        "gated_mlp": True,
    }
    hf = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "intermediate_size": 11008,
        "vocab_size": 32000,
    }
    counts = {
        post(client, {"model": m, "dp": 8})["params"]
        for m in ({"architecture": arch}, {"preset": "llama2-7b"}, {"hf_config": hf})
    }
    assert counts == {6_738_415_616}


HF_CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "hf_configs"


@pytest.mark.parametrize(
    ("config", "params"),
    # transformers 5.17 builds these counts (measure.trace.count_parameters, on the meta device)
    [("deepseek_v3-small.json", 418_103_296), ("deepseek-v3.json", 671_026_404_352)],
)
@pytest.mark.parametrize("engine", ["paper", "torch", "deepspeed"])
def test_deepseek_v3_config_is_answered_by_every_engine(
    client: TestClient, config: str, params: int, engine: str
) -> None:
    hf = json.loads((HF_CONFIGS / config).read_text())
    peaks = {}
    for checkpointing in ("none", "full"):
        batch = {"micro_batch_size": 1, "seq_len": 2048, "activation_checkpointing": checkpointing}
        body = post(
            client,
            {
                "model": {"hf_config": hf},
                "dp": 8,
                "engine": engine,
                "precision": "mixed_bf16",
                "batch": batch,
            },
        )
        assert body["params"] == params
        peaks[checkpointing] = [s["per_device"]["peak"] for s in body["stages"]]
    assert all(p is not None and p > 0 for p in peaks["full"]), peaks
    # checkpointing lowers the peak wherever activations set it (not where the optimizer
    # step of a 671B model does)
    pairs = list(zip(peaks["full"], peaks["none"], strict=True))
    assert all(f <= n for f, n in pairs) and any(f < n for f, n in pairs), peaks


def test_a_multimodal_config_points_to_its_text_config(client: TestClient) -> None:
    """Gemma 3 4B ships a vision tower around a gemma3_text model: the 422 says what to send."""
    text = json.loads((HF_CONFIGS / "gemma-3-4b-text.json").read_text())
    multimodal = {
        "model_type": "gemma3",
        "text_config": text,
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
    }
    body = {"model": {"hf_config": multimodal}, "dp": 8}
    r = client.post("/v1/memory", json=body)
    assert r.status_code == 422
    (error,) = r.json()["detail"]
    assert error["field"] == "model.hf_config.model_type"
    assert "'gemma3_text' language model" in error["msg"] and "text_config" in error["msg"]
    assert post(client, {"model": {"hf_config": text}, "dp": 8})["params"] == 3_880_263_168
    r = client.post("/v1/memory", json={"model": {"hf_config": {"model_type": "llava"}}, "dp": 8})
    assert r.status_code == 422
    assert "unsupported model_type 'llava'; supported:" in r.json()["detail"][0]["msg"]


def test_heads_sdpa_sends_to_its_math_path_get_a_422(client: TestClient) -> None:
    """CUDA's fused attention kernels take a head only as wide as their matmuls align (a
    multiple of 8 in 16-bit, 4 in fp32; flash any width, but one for q, k and v and no mask);
    SDPA runs any other through its math path, with fp32 scores, which the figures do not model:
    the 422 names the widths and points to eager attention, which they do."""
    deepseek = json.loads((HF_CONFIGS / "deepseek_v3-small.json").read_text())
    odd = {**deepseek, "qk_nope_head_dim": 24, "qk_rope_head_dim": 4, "v_head_dim": 16}  # 28, 16
    batch = {"micro_batch_size": 1, "seq_len": 512}
    body = {"model": {"hf_config": odd}, "dp": 8, "engine": "torch", "batch": batch}
    for engine in ("torch", "deepspeed"):
        r = client.post("/v1/memory", json={**body, "engine": engine})
        assert r.status_code == 422, r.text
        errors = r.json()["detail"]
        assert [e["field"] for e in errors] == [
            f"model.hf_config.{k}" for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        ]
        msg = errors[0]["msg"]
        assert "q/k 28 and v 16 wide" in msg and "multiple of 8 in 16-bit" in msg
        assert "math path" in msg and '"attn_implementation": "eager"' in msg
    # fp32 q/k 28 wide: the memory-efficient kernel takes it (a multiple of 4); eager is modelled
    post(client, {**body, "precision": "fp32"})
    post(client, {**body, "model": {"hf_config": {**odd, "attn_implementation": "eager"}}})
    # a 20-wide head: flash takes it without a mask, nothing fused does with one (a padded batch)
    llama = json.loads((HF_CONFIGS / "llama-3.2-3b.json").read_text())
    narrow = {**llama, "head_dim": 20}
    body = {"model": {"hf_config": narrow}, "dp": 8, "engine": "torch", "batch": batch}
    post(client, body)
    r = client.post("/v1/memory", json={**body, "batch": {**batch, "padded": True}})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "model.hf_config.head_dim"


def test_eager_attention_is_taken_from_the_config(client: TestClient) -> None:
    """``attn_implementation`` as transformers' configuration takes it: eager keeps the
    (b, heads, s, s) probabilities, so the same run needs more; other kernels get a 422."""
    cfg = json.loads((HF_CONFIGS / "llama-3.2-3b.json").read_text())
    batch = {"micro_batch_size": 1, "seq_len": 2048}
    peaks = {}
    for impl in ("sdpa", "eager"):
        for engine in ("torch", "deepspeed"):
            body = {
                "model": {"hf_config": {**cfg, "attn_implementation": impl}},
                "dp": 4,
                "stages": [3],
                "engine": engine,
                "batch": batch,
            }
            answer = post(client, body)
            peaks[impl, engine] = answer["stages"][0]["per_device"]["peak"]
            eager_notes = [n for n in answer["breakdown_notes"] if "eager attention" in n]
            assert len(eager_notes) == (impl == "eager"), answer["breakdown_notes"]
    # 28 layers x 24 heads x 2048^2 scores: fp32 probabilities and their bf16 cast saved
    saved = 28 * 24 * 2048**2 * 6
    for engine in ("torch", "deepspeed"):
        assert peaks["eager", engine] - peaks["sdpa", engine] > saved, peaks
    for config, field, words in (
        ({**cfg, "attn_implementation": "flash_attention_2"}, "attn_implementation", "sdpa, eager"),
        (
            {
                "model_type": "gpt2",
                "n_layer": 2,
                "n_embd": 64,
                "n_head": 2,
                "vocab_size": 64,
                "attn_implementation": "eager",
            },
            "attn_implementation",
            "canonical decoder",
        ),
        (
            {**cfg, "attn_implementation": "eager", "attention_dropout": 1.5},
            "attention_dropout",
            "[0, 1)",
        ),
        ({**cfg, "attention_dropout": -0.1}, "attention_dropout", "[0, 1)"),
    ):
        r = client.post("/v1/memory", json={"model": {"hf_config": config}, "dp": 4})
        assert r.status_code == 422, r.text
        (error,) = r.json()["detail"]
        assert error["field"] == f"model.hf_config.{field}" and words in error["msg"], error


def test_fp32_gradient_convention_is_18_bytes(client: TestClient) -> None:
    body = post(
        client, {"model": {"params": 10**9}, "dp": 1, "stages": [0], "gradients": "fp32_grads"}
    )
    assert body["stages"][0]["per_device"]["model_states"] == 18 * 10**9
    assert body["convention"]["bytes_per_param"]["gradients"] == 4


@pytest.mark.parametrize(
    ("optimizer", "precision", "k"),
    [
        ("adam", "mixed_fp16", 12),
        ("adamw", "mixed_bf16", 12),
        ("sgd", "mixed_fp16", 4),
        ("sgd_momentum", "mixed_fp16", 8),
        ("adafactor", "mixed_bf16", 4),
        ("adam_8bit", "mixed_bf16", 6.03125),
        ("adam", "fp32", 8),
        ("adam", "bf16", 4),
        ("sgd_momentum", "fp32", 4),
    ],
)
def test_optimizer_k(client: TestClient, optimizer: str, precision: str, k: float) -> None:
    body = post(
        client,
        {"model": {"params": 10**9}, "dp": 1, "optimizer": optimizer, "precision": precision},
    )
    assert body["convention"]["k"] == k
    assert body["convention"]["optimizer_assumption"]


def test_k_override(client: TestClient) -> None:
    body = post(client, {"model": {"params": 10**9}, "dp": 4, "k": 16, "stages": [1]})
    assert body["stages"][0]["per_device"]["optimizer_states"] == 4 * 10**9


def test_optimizer_offload_moves_states_to_cpu(client: TestClient) -> None:
    body = post(
        client,
        {
            "model": {"params": 8 * 10**9},
            "dp": 8,
            "stages": [1, 2, 3],
            "offload": {"optimizer": "cpu", "params": "none"},
        },
    )
    s1, s2, s3 = body["stages"]
    assert s1["per_device"]["optimizer_states"] == 0
    assert s1["cpu"]["optimizer_states"] == 12 * 10**9
    assert s1["per_device"]["gradients"] == 16 * 10**9  # stage 1 keeps full 16-bit gradients
    assert s2["per_device"]["model_states"] == 16 * 10**9  # 2Ψ parameters only
    assert s2["cpu"]["total"] == 14 * 10**9  # (2 + 12)Ψ/N: gradient partition + states
    assert s3["per_device"]["model_states"] == 2 * 10**9


def test_param_offload_to_nvme(client: TestClient) -> None:
    body = post(
        client,
        {
            "model": {"params": 8 * 10**9},
            "dp": 8,
            "stages": [3],
            "offload": {"optimizer": "nvme", "params": "nvme"},
        },
    )
    s3 = body["stages"][0]
    assert s3["per_device"]["model_states"] == 0
    assert s3["nvme"]["total"] == 14 * 10**9
    assert s3["cpu"]["total"] == 2 * 10**9


def test_tp_pp_divide_before_zero(client: TestClient) -> None:
    body = post(client, {"model": {"params": 64 * 10**9}, "dp": 8, "tp": 4, "pp": 2, "stages": [3]})
    assert body["params_per_device"] == 8 * 10**9
    assert body["stages"][0]["per_device"]["model_states"] == 16 * 10**9


def test_fits(client: TestClient) -> None:
    body = post(client, {"model": {"params": 7_500_000_000}, "dp": 64, "device_memory": 32 * GB})
    assert [s["fits"] for s in body["stages"]] == [False, True, True, True]


BAD: list[tuple[dict[str, Any], str]] = [
    ({"model": {"params": 0}, "dp": 8}, "model.params"),
    ({"model": {"params": -5}, "dp": 8}, "model.params"),
    ({"model": {"params": 10**30}, "dp": 8}, "model.params"),
    ({"model": {"params": 1000}, "dp": 0}, "dp"),
    ({"model": {"params": 1000}, "dp": 8, "stages": [4]}, "stages.0"),
    ({"model": {"params": 1000}, "dp": 8, "stages": [1, 1]}, "stages"),
    ({"model": {"params": 1000}, "dp": 8, "stages": []}, "stages"),
    ({"model": {"params": 1000}, "dp": 8, "precision": "fp8"}, "precision"),
    ({"model": {"params": 1000}, "dp": 8, "colour": "red"}, "colour"),
    ({"model": {"preset": "gpt5"}, "dp": 8}, "model.preset"),
    ({"model": {}, "dp": 8}, "model"),
    ({"model": {"params": 1000, "preset": "gpt2"}, "dp": 8}, "model"),
    ({"dp": 8}, "model"),
    ({"model": {"params": 1000}, "dp": 8, "k": -1}, "k"),
    (
        {
            "model": {
                "architecture": {
                    "layers": 12,
                    "hidden": 1000,
                    "heads": 16,
                    "vocab_size": 10,
                    "max_seq_len": 8,
                }
            },
            "dp": 8,
        },
        "model.architecture.heads",
    ),
    ({"model": {"preset": "gpt2"}, "dp": 8, "pp": 5}, "pp"),
    ({"model": {"preset": "gpt2"}, "dp": 8, "tp": 5}, "tp"),
    ({"model": {"params": 1000}, "dp": 8, "offload": {"optimizer": "cpu"}}, "offload.optimizer"),
    (
        {"model": {"params": 1000}, "dp": 8, "stages": [2], "offload": {"params": "cpu"}},
        "offload.params",
    ),
    ({"model": {"hf_config": {"model_type": "t5"}}, "dp": 8}, "model.hf_config.model_type"),
]


@pytest.mark.parametrize(("body", "field"), BAD, ids=[f for _, f in BAD])
def test_bad_input_names_the_field(client: TestClient, body: dict[str, Any], field: str) -> None:
    r = client.post("/v1/memory", json=body)
    assert r.status_code == 422, r.text
    fields = [d["field"] for d in r.json()["detail"]]
    assert field in fields
    assert all(d["msg"] for d in r.json()["detail"])


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_non_finite_numbers_are_422_not_500(client: TestClient, literal: bytes) -> None:
    for body in (
        b'{"model": {"params": ' + literal + b'}, "dp": 8}',
        b'{"model": {"params": 1000}, "dp": 8, "k": ' + literal + b"}",
    ):
        r = client.post("/v1/memory", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert "NaN" not in r.text and "Infinity" not in r.text


def test_torch_engine_predicts_peak_with_a_breakdown(client: TestClient) -> None:
    arch = {"layers": 12, "hidden": 768, "heads": 12, "vocab_size": 50257, "max_seq_len": 1024}
    body = {
        "model": {"architecture": arch},
        "dp": 8,
        "precision": "mixed_bf16",
        "engine": "torch",
        "batch": {"micro_batch_size": 8, "seq_len": 1024},
    }
    torch_body = post(client, body)
    torch_stages = torch_body["stages"]
    assert torch_body["breakdown_notes"]
    paper_stages = post(client, body | {"engine": "paper"})["stages"]
    for t, p in zip(torch_stages, paper_stages, strict=True):
        d = t["per_device"]
        assert d["peak"] > d["resident"] > 0
        assert d["activations"] > 0
        assert t["breakdown"]["theory"] == p["per_device"]["model_states"]
        assert t["breakdown"]["allocated_peak"] == d["peak"]
        assert t["breakdown"]["reserved"] is None
    # FSDP2 with reshard_after_forward=False keeps the 16-bit parameters gathered: higher peak
    assert torch_stages[2]["per_device"]["peak"] > torch_stages[3]["per_device"]["peak"]


def test_transformers_models_with_a_batch_say_which_batches_they_follow(
    client: TestClient,
) -> None:
    batch = {"micro_batch_size": 2, "seq_len": 1024}
    unpadded, padded = "for a batch without padding", "for a padded batch"

    def said(body: dict[str, Any], words: str) -> bool:
        return any(words in n for n in post(client, body)["breakdown_notes"])

    # transformers' modelling code (a preset of a Hugging Face family) with a batch
    llama = {"model": {"preset": "llama3-8b"}, "dp": 8, "engine": "torch", "batch": batch}
    assert said(llama, unpadded) and not said(llama, padded)
    llama_padded = {**llama, "batch": {**batch, "padded": True}}
    assert said(llama_padded, padded) and not said(llama_padded, unpadded)
    # no batch: no activations to qualify; the canonical decoder: no attention mask at all
    for body in (
        {"model": {"preset": "llama3-8b"}, "dp": 8, "engine": "torch"},
        {"model": {"preset": "gpt2"}, "dp": 8, "engine": "torch", "batch": batch},
    ):
        assert not said(body, unpadded) and not said(body, padded)


def test_a_padded_batch_counts_the_mask_and_is_refused_for_the_canonical_decoder(
    client: TestClient,
) -> None:
    batch = {"micro_batch_size": 2, "seq_len": 4096}
    body = {"model": {"preset": "llama3-8b"}, "dp": 8, "engine": "torch", "stages": [3]}

    def peak(b: dict[str, Any]) -> int:
        stage = post(client, {**body, "batch": b})["stages"][0]
        return int(stage["per_device"]["peak"])

    # 32 layers: a bf16 (2, 1, 4096, 4096) bias each, k/v expanded from 8 to 32 heads
    extra = peak({**batch, "padded": True}) - peak(batch)
    layer = 2 * 2 * 4096 * 4096 + 2 * 2 * 2 * 4096 * (4096 - 1024)
    assert extra >= 32 * layer
    r = client.post(
        "/v1/memory",
        json={
            "model": {"preset": "gpt2"},
            "dp": 8,
            "batch": {**batch, "seq_len": 1024, "padded": True},
        },
    )
    assert r.status_code == 422, r.text
    assert "batch.padded" in r.text


@pytest.mark.parametrize(
    ("engine", "stage", "residual"), [("torch", 0, 4), ("torch", 3, 2), ("deepspeed", 2, 2)]
)
def test_checkpoint_offload_moves_the_layer_inputs_to_host_memory(
    client: TestClient, engine: str, stage: int, residual: int
) -> None:
    # Llama 3 8B: 32 layers, hidden 4096; DDP keeps an fp32 residual stream under autocast,
    # FSDP2's bf16 policy and DeepSpeed a bf16 one
    batch = {"micro_batch_size": 1, "seq_len": 8192, "activation_checkpointing": "full"}
    body = {"model": {"preset": "llama3-8b"}, "dp": 8, "engine": engine, "stages": [stage]}
    kept_answer = post(client, {**body, "batch": batch})
    moved_answer = post(client, {**body, "batch": {**batch, "checkpoint_offload": True}})
    kept, moved = kept_answer["stages"][0], moved_answer["stages"][0]
    # each says how it checkpoints, every_n_layers 1 among it
    assert "kept on the device" in kept_answer["breakdown_notes"][-1]
    assert "pinned host memory" in moved_answer["breakdown_notes"][-1]
    assert all("every_n_layers" in a["breakdown_notes"][-1] for a in (kept_answer, moved_answer))
    inputs = 32 * residual * 8192 * 4096
    assert kept["cpu"]["activations"] == 0
    assert moved["cpu"]["activations"] == inputs
    assert moved["cpu"]["total"] == kept["cpu"]["total"] + inputs
    # at the start of backward (DDP's peak is its optimizer step, with no activations) the device
    # holds none of them; at the peak at most one layer's input comes back
    start = "peak_candidate_loss_backward"
    if engine == "torch":
        assert kept["components"][start] - moved["components"][start] == inputs
    assert kept["per_device"]["peak"] - moved["per_device"]["peak"] >= (
        0 if stage == 0 else inputs - inputs // 32
    )
    assert moved["per_device"]["resident"] == kept["per_device"]["resident"]


@pytest.mark.parametrize(
    ("model", "batch"),
    [
        ({"preset": "llama3-8b"}, {"activation_checkpointing": "none"}),
        ({"preset": "llama3-8b"}, {"activation_checkpointing": "selective"}),
        ({"preset": "gpt2"}, {"activation_checkpointing": "full"}),
    ],
)
def test_checkpoint_offload_is_refused_where_it_does_not_apply(
    client: TestClient, model: dict[str, Any], batch: dict[str, Any]
) -> None:
    r = client.post(
        "/v1/memory",
        json={
            "model": model,
            "dp": 8,
            "batch": {"micro_batch_size": 1, "seq_len": 1024, "checkpoint_offload": True, **batch},
        },
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "batch.checkpoint_offload"


@pytest.mark.parametrize(
    "model",
    [
        {"preset": "llama3-8b"},
        # sliding-window layers (window 512) beside every sixth full one
        {"hf_config": json.loads((HF_CONFIGS / "gemma-3-1b.json").read_text())},
        # a dense first layer, then MoE layers
        {"hf_config": json.loads((HF_CONFIGS / "deepseek_v3-small.json").read_text())},
    ],
)
def test_every_n_layers_checkpoints_some_layers(client: TestClient, model: dict[str, Any]) -> None:
    # every second layer checkpointed: half keep their input, half all they save (each by its
    # kind); every torch stage answers between full checkpointing and none
    batch = {"micro_batch_size": 1, "seq_len": 8192, "activation_checkpointing": "full"}
    body = {"model": model, "dp": 8, "engine": "torch"}
    full = post(client, {**body, "batch": batch})
    every = post(client, {**body, "batch": {**batch, "checkpoint_every_n_layers": 2}})
    plain = post(client, {**body, "batch": {**batch, "activation_checkpointing": "none"}})
    assert "every_n_layers=n" in every["breakdown_notes"][-1]
    for stage in (0, 1, 2, 3):
        acts = [a["stages"][stage]["per_device"]["activations"] for a in (full, every, plain)]
        peaks = [a["stages"][stage]["per_device"]["peak"] for a in (full, every, plain)]
        assert acts[0] < acts[1] < acts[2]
        # DDP's fp32 optimizer step outweighs all three at stages 0 and 1
        assert peaks[0] <= peaks[1] <= peaks[2] and (stage < 2 or peaks[0] < peaks[1] < peaks[2])
    moved = post(
        client,
        {**body, "batch": {**batch, "checkpoint_every_n_layers": 2, "checkpoint_offload": True}},
    )
    cfg = model.get("hf_config", {"num_hidden_layers": 32, "hidden_size": 4096})
    inputs = -(-cfg["num_hidden_layers"] // 2) * 8192 * cfg["hidden_size"]  # layers 0, 2, 4, ...
    assert moved["stages"][3]["cpu"]["activations"] == 2 * inputs
    # DDP's fp32 residual stream: 4 bytes an element
    assert moved["stages"][0]["cpu"]["activations"] == 4 * inputs


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"engine": "deepspeed"}, "torch engine"),
        ({"model": {"preset": "gpt2"}, "batch_seq_len": 1024}, "transformers"),
        ({"batch_checkpointing": "none"}, "needs activation_checkpointing full"),
    ],
)
def test_every_n_layers_is_refused_where_it_is_not_modelled(
    client: TestClient, change: dict[str, Any], why: str
) -> None:
    batch = {
        "micro_batch_size": 1,
        "seq_len": change.pop("batch_seq_len", 4096),
        "activation_checkpointing": change.pop("batch_checkpointing", "full"),
        "checkpoint_every_n_layers": 3,
    }
    body = {"model": {"preset": "llama3-8b"}, "dp": 8, "engine": "torch", "batch": batch}
    r = client.post("/v1/memory", json={**body, **change})
    assert r.status_code == 422, r.text
    assert "batch.checkpoint_every_n_layers" in r.text and why in r.text


def test_a_peak_with_a_step_says_the_allocators_blocks_are_not_counted(client: TestClient) -> None:
    # the torch engines and DeepSpeed predict the step's tensors; what the caching allocator
    # hands activations beyond their requests is said, not counted (the paper has no step)
    batch = {"micro_batch_size": 1, "seq_len": 2048}
    for engine, said in (("torch", True), ("deepspeed", True), ("paper", False)):
        body = {"model": {"preset": "llama3-8b"}, "dp": 8, "engine": engine, "batch": batch}
        notes = post(client, body)["stages"][0]["notes"]
        assert any("max_memory_allocated" in n for n in notes) is said, (engine, notes)
    notes = post(client, {"model": {"preset": "llama3-8b"}, "dp": 8, "engine": "torch"})
    assert not any("max_memory_allocated" in n for n in notes["stages"][0]["notes"])
