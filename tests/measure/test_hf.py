"""The user's Hugging Face model, built by transformers: its parameter list, a simulated run on
the CPU, and the refusals (no transformers, selective recomputation)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from calculators.architecture import count_params  # noqa: E402
from calculators.errors import InputError  # noqa: E402
from calculators.hf_config import architecture_from_hf_config  # noqa: E402
from measure import spec as measure_spec  # noqa: E402
from measure.engines.hf import build_hf, decoder_layers, hf_config, hf_tensors  # noqa: E402
from measure.hf_families import FAMILIES, family_config  # noqa: E402
from measure.runner import run  # noqa: E402
from measure.spec import parse_spec  # noqa: E402
from measure.trace import count_parameters  # noqa: E402
from measure.workloads import build_workload  # noqa: E402

# families the calculator reads from config.json today (the others are predicted from Ψ)
READ_BY_CALCULATOR = ("llama", "mistral", "qwen2", "mixtral", "deepseek_v3")


def _body(family: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"hf_config": family_config(family)},
        "dp": 4,
        "stages": [1, 3],
        "precision": "mixed_bf16",
        "mode": "simulated",
        "device": "cpu",
        "warmup_steps": 1,
        "steps": 1,
        "batch": {"micro_batch_size": 1, "seq_len": 32},
    }
    body.update(extra)
    return body


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_builds_on_meta_with_one_group_per_layer(family: str) -> None:
    cfg = family_config(family)
    model = build_hf(hf_config(cfg), torch.device("meta"), checkpointing=False)
    layers = decoder_layers(model)
    assert len(layers) == cfg["num_hidden_layers"]
    tensors = hf_tensors(cfg)
    groups = {g for _, _, g in tensors}
    assert groups == {"root"} | {f"layers.{i}" for i in range(len(layers))}
    in_layers = sum(p.numel() for layer in layers for p in layer.parameters())
    assert sum(torch.Size(s).numel() for _, s, g in tensors if g != "root") == in_layers


@pytest.mark.parametrize("family", READ_BY_CALCULATOR)
def test_built_model_counts_what_the_calculator_counts(family: str) -> None:
    cfg = family_config(family)
    built = sum(torch.Size(s).numel() for _, s, _ in hf_tensors(cfg))
    assert built == count_params(architecture_from_hf_config(cfg))


def test_llama_simulated_world_matches_the_prediction() -> None:
    seen: list[tuple[float, str]] = []
    result = run(_body("llama"), lambda f, m: seen.append((f, m)))
    assert "transformers" in result["workload"]
    assert result["environment"]["transformers"]
    assert "CPU mode" in result["cpu_mode"]
    for r in result["runs"]:
        assert r["engine"] == "torch"
        meas, pred = r["measured"]["resident"], r["predicted"]["resident"]
        assert abs(pred - meas) <= 0.005 * meas, (r["stage"], pred, meas)
        comm = r["communication"]
        assert comm["relative_error"] is not None and abs(comm["relative_error"]) <= 0.005
        assert "after_backward" not in r["measured"]  # phase figures are CUDA-only
    # progress moves inside each stage, not only between stages
    inside = {round(f, 3) for f, _ in seen if 0 < f < 1}
    assert len(inside) >= 4, seen


def test_a_family_with_its_own_modelling_code_is_predicted_from_it() -> None:
    # Gemma: (1 + weight) norms, scaled embeddings, GeGLU; the calculator reads its config
    result = run(_body("gemma", stages=[2]))
    (r,) = result["runs"]
    assert not any("does not read model_type" in n for n in r["notes"])
    assert r["measured"]["parameters"] == r["predicted"]["parameters"] > 0


def test_a_padded_batch_trains_with_a_padding_mask_and_is_predicted_as_one() -> None:
    batch = {"micro_batch_size": 2, "seq_len": 32, "padded": True}
    result = run(_body("qwen3", stages=[0], batch=batch))
    assert "padded" in result["workload"]
    (r,) = result["runs"]
    meas, pred = r["measured"]["resident"], r["predicted"]["resident"]
    assert abs(pred - meas) <= 0.005 * meas, (pred, meas)
    spec = parse_spec(_body("qwen3", batch=batch))
    assert spec.batch is not None and spec.batch.padded
    # the workload's batch: labels -100 where the mask is 0, the last sequence from its middle
    from measure.engines.hf import IGNORE_INDEX, hf_workload

    _, labels = hf_workload(spec).make_batch(torch.device("cpu"), torch.Generator().manual_seed(0))
    assert (labels == IGNORE_INDEX).sum() == 16 and (labels[-1, 16:] == IGNORE_INDEX).all()


def test_a_padded_batch_is_refused_for_measures_own_decoder() -> None:
    body = _body("llama", batch={"micro_batch_size": 1, "seq_len": 32, "padded": True})
    body["model"] = {"preset": "gpt2"}
    with pytest.raises(InputError) as err:
        parse_spec(body)
    assert err.value.field == "batch.padded"


def test_without_transformers_the_request_names_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(measure_spec, "transformers_available", lambda: False)
    with pytest.raises(InputError) as err:
        parse_spec(_body("llama"))
    assert err.value.field == "model.hf_config"
    assert "pip install" in err.value.message and "transformers" in err.value.message


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {
                "batch": {
                    "micro_batch_size": 1,
                    "seq_len": 8,
                    "activation_checkpointing": "selective",
                }
            },
            "batch.activation_checkpointing",
        ),
        ({"model": {"hf_config": {"model_type": "no-such-family"}}}, "model.hf_config.model_type"),
        ({"model": {"hf_config": {"hidden_size": 8}}}, "model.hf_config.model_type"),
    ],
)
def test_bad_hf_requests_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as err:
        parse_spec(_body("llama", **change))
    assert err.value.field == field


@pytest.mark.parametrize("family", ["qwen3", "mistral"])  # full attention; sliding windows
@pytest.mark.parametrize("autocast", [False, True])
def test_the_key_value_cache_dies_with_the_model_output(family: str, autocast: bool) -> None:
    """A training forward without checkpointing fills transformers' ``DynamicCache``
    (``use_cache`` on by default), held only by the model output: once the loop has taken the
    loss and dropped the output (as ``measure``'s loop and the Trainer's ``compute_loss`` do),
    the cache's tensors autograd did not also save are freed, which is why the calculators count
    them only while the model computes its loss (``ActivationBreakdown.cache_only``)."""
    import weakref

    body = family_config(family)
    model = build_hf(hf_config(body), torch.device("cpu"), checkpointing=False)
    x = torch.randint(3, int(body["vocab_size"]), (2, 128))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=x, labels=x)
    cache = out.past_key_values
    tensors = [weakref.ref(t) for layer in cache.layers for t in (layer.keys, layer.values)]
    assert tensors and all(t() is not None for t in tensors)  # filled while the output lives
    held = weakref.ref(cache)
    loss = out.loss
    del out, cache
    assert held() is None  # no reference cycle keeps it for the garbage collector
    if autocast:  # SDPA saved bf16 casts: the fp32 cache copies go with the cache
        assert all(t() is None for t in tensors)
    loss.backward()


def test_accelerates_forward_wrapper_returns_fp32_logits_the_prediction_holds() -> None:
    # DDP (autocast already) and FSDP2 (autocast on top of its policy), forward wrapped as
    # accelerate wraps it: the loop holds fp32 logits, 4 bytes a token and vocabulary entry
    cfg = family_config("llama")
    body = _body("llama", stages=[0, 2], engine_config={"convert_outputs_to_fp32": True})
    result = run(body)
    (value,) = [
        v for v in result["resolved_config"]["values"] if v["key"] == "convert_outputs_to_fp32"
    ]
    assert value["value"] is True
    for r in result["runs"]:
        meas, pred = r["measured"]["resident"], r["predicted"]["resident"]
        assert abs(pred - meas) <= 0.005 * meas, (r["stage"], pred, meas)
        assert r["measured"]["held_outputs"] == 4 * 32 * cfg["vocab_size"] + 4


def test_checkpoint_offload_is_parsed_and_refused_where_it_cannot_run() -> None:
    batch = {
        "micro_batch_size": 1,
        "seq_len": 32,
        "activation_checkpointing": "full",
        "checkpoint_offload": True,
    }
    spec = parse_spec(_body("llama", batch=batch))
    assert spec.batch is not None and spec.batch.checkpoint_offload
    # transformers pins the host copies: a host without an accelerator cannot run it
    with pytest.raises(InputError) as err:
        run(_body("llama", batch=batch))
    assert err.value.field == "batch.checkpoint_offload"
    body = _body("llama", batch=batch)
    body["model"] = {"preset": "gpt2"}
    with pytest.raises(InputError) as err:
        parse_spec(body)
    assert err.value.field == "batch.checkpoint_offload"
    with pytest.raises(InputError) as err:
        parse_spec(_body("llama", batch={**batch, "activation_checkpointing": "none"}))
    assert err.value.field == "batch.checkpoint_offload"


@pytest.mark.gpu
def test_checkpoint_offload_trains_with_the_inputs_on_the_host() -> None:
    batch = {
        "micro_batch_size": 2,
        "seq_len": 64,
        "activation_checkpointing": "full",
        "checkpoint_offload": True,
    }
    result = run({**_body("qwen3", stages=[2], batch=batch), "dp": 1, "device": "cuda"})
    assert result["workload"].endswith(", offloaded)")
    (r,) = result["runs"]
    meas, pred = r["measured"]["peak_requested"], r["predicted"]["peak"]
    assert abs(pred - meas) <= 0.01 * meas, (pred, meas)


def test_every_n_layers_checkpoints_layers_0_n_2n() -> None:
    # transformers' every_n_layers: the layers it leaves run as they are, and the run's
    # workload names the pattern; the canonical decoder refuses it
    cfg = {**family_config("llama"), "num_hidden_layers": 5}
    model = build_hf(hf_config(cfg), torch.device("meta"), checkpointing=True, every_n_layers=2)
    assert [layer.gradient_checkpointing for layer in decoder_layers(model)] == [
        True,
        False,
        True,
        False,
        True,
    ]
    batch = {
        "micro_batch_size": 1,
        "seq_len": 32,
        "activation_checkpointing": "full",
        "checkpoint_every_n_layers": 2,
    }
    result = run(_body("llama", batch=batch, stages=[3]))
    assert "gradient checkpointing every 2 layers" in result["workload"]
    body = _body("llama", batch=batch)
    body["model"] = {"preset": "gpt2"}
    with pytest.raises(InputError) as err:
        parse_spec(body)
    assert err.value.field == "batch.checkpoint_every_n_layers"


@pytest.mark.gpu
def test_every_n_layers_is_predicted_where_it_peaks() -> None:
    batch = {
        "micro_batch_size": 2,
        "seq_len": 256,
        "activation_checkpointing": "full",
        "checkpoint_every_n_layers": 2,
    }
    for stage in (0, 3):
        result = run({**_body("llama", stages=[stage], batch=batch), "dp": 1, "device": "cuda"})
        (r,) = result["runs"]
        meas, pred = r["measured"]["peak_requested"], r["predicted"]["peak"]
        assert abs(pred - meas) <= 0.01 * meas, (stage, pred, meas)


def test_the_request_config_is_left_as_given() -> None:
    # transformers completes a llama3 rope_scaling in place (it adds rope_theta); the request
    # the service stores and echoes must stay what the user sent
    body = {
        **family_config("llama"),
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    request = _body("llama")
    request["model"]["hf_config"] = body
    before = copy.deepcopy(request)
    build_workload(parse_spec(request))  # the request read, then the model built from it
    hf_config(body)
    count_parameters(body)  # the traced mode's own build
    assert request == before
