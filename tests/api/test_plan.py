"""POST /v1/plan, GET /v1/gpus and /v1/calibrations from the outside."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.examples import PLAN_EXAMPLES
from app.jobs.store import JobStatus
from calculators.architecture import count_params
from calculators.batch import Checkpointing
from calculators.communication import Network, Phase
from calculators.conventions import Engine, Stage
from calculators.gpus import get_gpu
from calculators.plan import Config, Efficiency, OffloadChoice, PlanSetup, _Evaluator, predict
from tests.api.fakes import fake_runner

GPT = {
    "layers": 4,
    "hidden": 256,
    "heads": 8,
    "vocab_size": 1000,
    "max_seq_len": 512,
}
SMALL = {
    "model": {"architecture": GPT},
    "gpu": "l4",
    "gpus": 2,
    "global_batch_size": 8,
    "seq_len": 512,
}


@pytest.fixture
def isolated() -> Iterator[TestClient]:
    """A client whose store lives in a throw-away folder."""
    from app.main import app

    with fake_runner(app), TestClient(app) as c:
        yield c


def post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("name", list(PLAN_EXAMPLES))
def test_swagger_examples_answer(client: TestClient, name: str) -> None:
    body = post(client, PLAN_EXAMPLES[name]["value"])
    assert body["candidates"], "the example should have a configuration that fits"
    speeds = [c["tokens_per_second"] for c in body["candidates"]]
    assert speeds == sorted(speeds, reverse=True)
    assert [c["rank"] for c in body["candidates"]] == list(range(1, len(speeds) + 1))
    assert len(body["candidates"]) + len(body["rejected"]) == body["evaluated"]


def test_llama3_8b_on_8_h100(isolated: TestClient) -> None:
    body = post(isolated, PLAN_EXAMPLES["llama3_8b_on_8_h100"]["value"])
    assert body["gpu"]["name"] == "h100-sxm"
    assert body["tokens_per_step"] == 256 * 4096
    best = body["candidates"][0]
    split = best["step_time"]
    parts = split["compute"] + split["exposed_communication"] + split["offload_transfer"]
    # every micro-step lasts as long as the slower queue: GPU work or host dispatch
    slower = max(split["gpu_busy"], split["host_dispatch"])
    assert split["compute"] == pytest.approx(slower + split["optimizer_step"])
    assert split["gpu_busy"] == pytest.approx(split["matmul"] + split["memory_bound"])
    busy_and_idle = split["matmul"] + split["memory_bound"] + split["gpu_idle"]
    assert split["compute"] == pytest.approx(busy_and_idle + split["optimizer_step"])
    assert split["bound"] == ("host" if split["host_dispatch"] > split["gpu_busy"] else "gpu")
    assert best["step_time_seconds"] == pytest.approx(parts)
    assert best["per_device"]["peak"] + best["headroom"] == body["assumptions"]["usable_memory"]
    assert best["config"]["stage"] >= 1  # 8B parameters at 16 B each do not fit stage 0
    assert best["assumptions"]["reason"]
    # every assumption named, the efficiency's source stated
    a = body["assumptions"]
    assert a["efficiency"] == body["calibration"]["efficiency"] == 0.75
    assert (
        "plan_profile" in a["efficiency_source"] and body["calibration"]["calibration_id"] is None
    )
    assert a["host_seconds_per_kernel"] == body["calibration"]["host_seconds_per_kernel"]
    assert body["calibration"]["host_calibration_id"] is None
    assert {k["stage"] for k in a["kernels"]} == {0, 1, 2, 3}
    for key in ("attention_efficiency", "memory_efficiency", "activation_passes_backward"):
        assert a[key] > 0
    assert a["peak_flops"] == pytest.approx(989.5e12)
    rejected = [r for r in body["rejected"] if r["config"]["stage"] == 0]
    assert rejected and all("does not fit" in r["reason"] for r in rejected)
    assert all(r["over_by"] > 0 for r in rejected)


def test_custom_gpu_and_a_narrow_search(client: TestClient) -> None:
    body = post(
        client,
        {
            **SMALL,
            "gpu": {"memory": 8 * 2**30, "peak_flops": 1e14, "memory_bandwidth": 10**12},
            "search": {
                "stages": [2, 3],
                "micro_batch_size": [1, 4],
                "activation_checkpointing": ["none"],
                "offload": ["none", "optimizer_and_params"],
            },
        },
    )
    assert body["evaluated"] == 2 * 2 * 2
    assert body["gpu"]["name"] == "custom" and body["gpu"]["peak_flops"] == 1e14
    assert {
        (c["config"]["stage"], c["config"]["micro_batch_size"], c["config"]["offload"])
        for c in body["candidates"]
    } == {(s, m, o) for s in (2, 3) for m in (1, 4) for o in ("none", "optimizer_and_params")}
    for c in body["candidates"]:
        assert c["config"]["grad_accumulation_steps"] * c["config"]["micro_batch_size"] == 4
        # FSDP2's CPU offload: torch's optimizer on the host, slower than on the device
        if c["config"]["offload"] != "none":
            assert c["step_time"]["offload_transfer"] > 0
    a = body["assumptions"]
    assert "single-tensor" in a["host_optimizer_source"] and a["host_optimizer_bandwidth"] > 0


def _llama3_8b_one_candidate(checkpointing: str, **extra: Any) -> dict[str, Any]:
    """Llama 3 8B on 8 × H100, 64 × 4,096 tokens: the one candidate of stage 3, micro-batch 2."""
    return {
        "model": {"preset": "llama3-8b"},
        "gpu": "h100-sxm",
        "gpus": 8,
        "global_batch_size": 64,
        "seq_len": 4096,
        "search": {
            "stages": [3],
            "micro_batch_size": [2],
            "activation_checkpointing": [checkpointing],
            "offload": ["none"],
            "checkpoint_offload": [False],
        },
        **extra,
    }


def test_padded_batches_take_more_memory_and_every_attention_product(client: TestClient) -> None:
    body = _llama3_8b_one_candidate("none")
    plain, padded = post(client, body), post(client, {**body, "padded": True})
    assert padded["assumptions"]["causal_attention_fraction"] == 1.0
    assert plain["assumptions"]["causal_attention_fraction"] == 0.5

    def peak(plan: dict[str, Any]) -> int:
        (c,) = plan["candidates"] or plan["rejected"]
        return int(c["peak"] if "peak" in c else c["needed"])

    # 32 layers: a (2, 1, 4096, 4096) bf16 bias and k/v expanded from 8 to 32 heads, 5 GiB
    assert peak(padded) - peak(plain) >= 5 * 2**30


def test_an_accelerate_config_holds_fp32_logits(client: TestClient) -> None:
    # accelerate's fsdp_* keys: forward returns an fp32 copy of the logits, which the loop
    # holds through backward: 2 more bytes per token and vocabulary entry than bf16 ones
    body = _llama3_8b_one_candidate("full", engine="torch")
    accelerate = {**body, "engine_config": {"fsdp_config": {"fsdp_version": 2}}}
    explicit = {**body, "engine_config": {"convert_outputs_to_fp32": True}}
    off = {**body, "engine_config": {"fsdp_version": 2, "convert_outputs_to_fp32": False}}
    (plain,), (wrapped,) = post(client, body)["candidates"], post(client, accelerate)["candidates"]

    def peak(candidate: dict[str, Any]) -> int:
        return int(candidate["per_device"]["peak"])

    assert peak(post(client, explicit)["candidates"][0]) == peak(wrapped)
    assert peak(post(client, off)["candidates"][0]) == peak(plain)
    assert peak(wrapped) - peak(plain) == 2 * 2 * 4096 * 128256


@pytest.mark.parametrize("knob", ["convert_outputs_to_fp32", "holds_outputs"])
def test_a_bad_loop_knob_is_the_requests_error(client: TestClient, knob: str) -> None:
    body = {**SMALL, "engine": "torch", "engine_config": {knob: 3}}
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text
    assert f"engine_config.{knob}" in r.text


def test_checkpoint_offload_is_a_candidate_that_trades_device_memory_for_copies(
    client: TestClient,
) -> None:
    # transformers' offload=True beside plain full checkpointing: the layers' inputs leave the
    # device for host memory, and the copies there and back lengthen the step
    body = _llama3_8b_one_candidate("full")
    body["search"]["checkpoint_offload"] = [False, True]
    found = post(client, body)
    assert "checkpoint offload" in " ".join(found["assumptions"]["notes"])
    by_place = {c["config"]["checkpoint_offload"]: c for c in found["candidates"]}
    kept, moved = by_place[False], by_place[True]
    inputs = 32 * 2 * (2 * 4096) * 4096  # 32 layers × bf16 × tokens × hidden
    assert moved["cpu"]["activations"] == inputs
    assert kept["cpu"]["activations"] == 0
    assert kept["per_device"]["peak"] - moved["per_device"]["peak"] == inputs
    # both ways over PCIe 5 (64 GB/s a direction), one copy per layer each way
    seconds = moved["step_time"]["checkpoint_transfer"]
    assert seconds == pytest.approx(2 * 4 * inputs / 64e9, rel=0.01)  # 4 micro-steps
    assert kept["step_time"]["checkpoint_transfer"] == 0
    assert moved["step_time"]["offload_transfer"] == pytest.approx(seconds)
    assert moved["step_time_seconds"] == pytest.approx(kept["step_time_seconds"] + seconds)
    assert moved["rank"] == 2  # slower, so ranked below


def test_a_transformers_model_is_planned_with_the_checkpointing_transformers_has(
    client: TestClient,
) -> None:
    # transformers checkpoints whole decoder layers: its models try none and full, never the
    # attention core alone, which the canonical decoder still tries
    body = _llama3_8b_one_candidate("none")
    body["search"]["activation_checkpointing"] = ["none", "selective", "full"]
    found = post(client, body)
    tried = {
        c["config"]["activation_checkpointing"] for c in found["candidates"] + found["rejected"]
    }
    assert tried == {"none", "full"}
    body["search"]["activation_checkpointing"] = ["selective"]
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text
    assert "search.activation_checkpointing" in r.text and "whole decoder layers" in r.text
    gpt = post(client, {**SMALL, "search": {"activation_checkpointing": ["selective"]}})
    assert {c["config"]["activation_checkpointing"] for c in gpt["candidates"]} == {"selective"}


def test_checkpoint_offload_is_transformers_option(client: TestClient) -> None:
    # the canonical decoder's full checkpointing keeps its inputs on the device: asked for
    # offload alone it gets a 422 naming the field; with false beside it, false is what it tries
    body = {**SMALL, "search": {"activation_checkpointing": ["full"]}}
    body["search"]["checkpoint_offload"] = [True]
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text
    assert "search.checkpoint_offload" in r.text
    body["search"]["checkpoint_offload"] = [False, True]
    found = post(client, body)
    placed = {c["config"]["checkpoint_offload"] for c in found["candidates"] + found["rejected"]}
    assert placed == {False}


def test_every_n_layers_trades_memory_for_less_recomputation(client: TestClient) -> None:
    # transformers' every_n_layers beside every layer checkpointed and none: each step between
    # them, its peak too, and only the checkpointed layers' forward runs again
    body = _llama3_8b_one_candidate("full")
    body["search"]["activation_checkpointing"] = ["none", "full"]
    body["search"]["checkpoint_every_n_layers"] = [1, 2, 4]
    found = post(client, body)
    assert any("every_n_layers" in n for n in found["assumptions"]["notes"])
    every = {
        (c["config"]["activation_checkpointing"], c["config"]["checkpoint_every_n_layers"]): c
        for c in found["candidates"] + found["rejected"]
    }
    assert set(every) == {("none", 1), ("full", 1), ("full", 2), ("full", 4)}
    order = [every[k] for k in (("full", 1), ("full", 2), ("full", 4), ("none", 1))]

    def peak(c: dict[str, Any]) -> int:  # a rejected candidate: the peak that does not fit
        return int(c["per_device"]["peak"] if "per_device" in c else c["peak"])

    assert [peak(c) for c in order] == sorted(peak(c) for c in order)
    # (no checkpointing does not fit at this shape)
    times = [c["step_time"]["recompute"] for c in order[:3]]
    assert times == sorted(times, reverse=True)
    # 32 layers: 16 and 8 of them run forward again, half and a quarter of full's recomputation
    full, half, quarter = (every[("full", n)]["step_time"]["recompute"] for n in (1, 2, 4))
    assert half == pytest.approx(full / 2, rel=0.02)
    assert quarter == pytest.approx(full / 4, rel=0.02)


@pytest.mark.parametrize(
    ("change", "why"),
    [({"engine": "deepspeed"}, "torch engine"), ({"model": SMALL["model"]}, "include 1")],
)
def test_every_n_layers_is_planned_where_it_is_modelled(
    client: TestClient, change: dict[str, Any], why: str
) -> None:
    # DeepSpeed's memory model and the canonical decoder checkpoint every layer: asked for
    # intervals above 1 alone they get a 422 naming the field; with 1 beside them, 1 is tried
    body = {**_llama3_8b_one_candidate("full"), **change}
    body["search"]["checkpoint_every_n_layers"] = [2]
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text
    assert "search.checkpoint_every_n_layers" in r.text and why in r.text
    body["search"]["checkpoint_every_n_layers"] = [1, 2]
    found = post(client, body)
    tried = {
        c["config"]["checkpoint_every_n_layers"] for c in found["candidates"] + found["rejected"]
    }
    assert tried == {1}


def test_eager_attention_computes_every_score_and_says_so(client: TestClient) -> None:
    cfg = json.loads(open("bench/hf_configs/llama-3.1-8b.json").read())
    body = {
        "gpu": "h100-sxm",
        "gpus": 8,
        "global_batch_size": 64,
        "seq_len": 4096,
        "search": {
            "stages": [3],
            "micro_batch_size": [1],
            "activation_checkpointing": ["full"],
            "offload": ["none"],
            "checkpoint_offload": [False],
        },
    }
    sdpa = post(client, {**body, "model": {"hf_config": cfg}})
    eager = post(client, {**body, "model": {"hf_config": {**cfg, "attn_implementation": "eager"}}})
    assert sdpa["assumptions"]["causal_attention_fraction"] == 0.5
    assert eager["assumptions"]["causal_attention_fraction"] == 1.0
    assert any("eager attention" in n for n in eager["assumptions"]["notes"])
    assert not any("eager attention" in n for n in sdpa["assumptions"]["notes"])
    (s,), (e,) = sdpa["candidates"], eager["candidates"]
    # twice the attention products, and passes over the saved probabilities
    assert e["step_time"]["matmul"] > s["step_time"]["matmul"]
    assert e["step_time"]["memory_bound"] > s["step_time"]["memory_bound"]
    assert e["per_device"]["peak"] > s["per_device"]["peak"]


def test_efficiency_from_the_request(client: TestClient) -> None:
    a = post(client, {**SMALL, "efficiency": 0.2})
    b = post(client, {**SMALL, "efficiency": 0.4})
    assert a["calibration"]["source"] == "given by the request"
    key = lambda c: json.dumps(c["config"], sort_keys=True)  # noqa: E731
    steps_a = {key(c): c["step_time"] for c in a["candidates"]}
    for c in b["candidates"]:
        # the GEMMs take longer at the lower efficiency; the other kernels and the host do not
        sa, sb = steps_a[key(c)], c["step_time"]
        assert sa["matmul"] > sb["matmul"]
        assert sa["memory_bound"] == pytest.approx(sb["memory_bound"])
        assert sa["host_dispatch"] == pytest.approx(sb["host_dispatch"])


def test_host_cost_from_the_request(client: TestClient) -> None:
    a = post(client, {**SMALL, "host_seconds_per_kernel": 20e-6})
    b = post(client, {**SMALL, "host_seconds_per_kernel": 40e-6})
    assert a["calibration"]["host_source"] == "given by the request"
    assert a["assumptions"]["host_seconds_per_kernel"] == 20e-6
    key = lambda c: json.dumps(c["config"], sort_keys=True)  # noqa: E731
    host_a = {key(c): c["step_time"]["host_dispatch"] for c in a["candidates"]}
    for c in b["candidates"]:
        assert c["step_time"]["host_dispatch"] == pytest.approx(2 * host_a[key(c)])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": {"params": 1_000_000}}, "model"),
        ({"gpu": "h999"}, "gpu"),
        ({"global_batch_size": 7}, "global_batch_size"),
        ({"engine": "paper"}, "engine"),
        ({"interconnect": "warp"}, "interconnect"),
        ({"search": {"micro_batch_size": [3]}}, "search.micro_batch_size"),
        ({"search": {"stages": [1, 1]}}, "search.stages"),
        ({"search": {"sizes": [1]}}, "search.sizes"),
        ({"gpus_per_node": 3}, "gpus_per_node"),
        ({"padded": True}, "padded"),  # the canonical decoder attends without a mask
    ],
)
def test_bad_input_names_the_field(client: TestClient, change: dict[str, Any], field: str) -> None:
    r = client.post("/v1/plan", json={**SMALL, **change})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == field


def test_nan_efficiency_is_a_422(client: TestClient) -> None:
    r = client.post(
        "/v1/plan",
        content=json.dumps({**SMALL, "efficiency": float("nan")}),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "efficiency"


def test_gpu_presets_listed(client: TestClient) -> None:
    r = client.get("/v1/gpus")
    assert r.status_code == 200
    by_name = {g["name"]: g for g in r.json()}
    assert {"h100-sxm", "h200", "a100-40gb", "a100-80gb", "l40s"} <= set(by_name)
    assert by_name["a100-80gb"]["peak_flops_16bit"] == 312e12
    assert "datasheet" in by_name["h200"]["source"]


def _store_measurement(
    client: TestClient,
    step_time: float,
    device: str = "cuda",
    probe: dict[str, Any] | None = None,
    host_optimizer_s: float | None = None,
    cpu_threads: int | None = None,
    job_id: str = "job-1",
) -> str:
    """A succeeded 2-GPU measure job, as the runner would have stored it (``probe``: the run's
    ``host_probe`` entry; ``host_optimizer_s``: a run under FSDP2's CPU offload, its timed host
    optimizer step; ``cpu_threads``: the torch threads its ranks ran on)."""
    store = client.app.state.jobs.store  # type: ignore[attr-defined]
    request: dict[str, Any] = {
        "model": {"architecture": GPT},
        "dp": 2,
        "stages": [2],
        "precision": "mixed_bf16",
        "engine": "torch",
        "batch": {"micro_batch_size": 2, "seq_len": 512},
    }
    run: dict[str, Any] = {
        "stage": 2,
        "step_time_s": step_time,
        "world_size": 2,
        "mode": "distributed",
        "host_probe": probe,
    }
    if host_optimizer_s is not None:
        request["offload"] = {"optimizer": "cpu", "params": "cpu"}
        run["host_optimizer_step_s"] = host_optimizer_s
    job = store.create(job_id, request, "runner", 60.0)
    store.start(job.id)
    result: dict[str, Any] = {
        "environment": {"device_type": device, "device_name": "NVIDIA L4"},
        "runs": [run],
    }
    if cpu_threads is not None:
        result["environment"]["cpu_threads"] = cpu_threads
    store.finish(job.id, JobStatus.SUCCEEDED, result=json.dumps(result))
    return str(job.id)


def _setup(efficiency: float, host: float) -> PlanSetup:
    from calculators.architecture import Architecture
    from calculators.interconnects import PRESETS

    arch = Architecture(**GPT)  # type: ignore[arg-type]
    gpu = get_gpu("l4")
    return PlanSetup(
        architecture=arch,
        params=count_params(arch),
        gpu=gpu,
        gpus=2,
        gpus_per_node=2,
        network=Network(intra=PRESETS[gpu.intra_node_link], host=PRESETS[gpu.host_link]),
        global_batch_size=4,
        seq_len=512,
        efficiency=Efficiency(efficiency, "test", host_seconds_per_kernel=host),
    )


MEASURED = Config(Stage.GRADIENTS, 2, 1, Checkpointing.NONE, OffloadChoice.NONE)


def _predicted_step(efficiency: float, host: float = 33e-6) -> float:
    return predict(_setup(efficiency, host), MEASURED)[1].total


def _predicted_probe(efficiency: float, host: float, measured: Config = MEASURED) -> dict[str, Any]:
    """The run's host_probe entry as the model with these figures predicts it: the measured
    configuration's forward and backward at one sequence of 32 tokens (no optimizer step, and
    the step's own collectives left out)."""
    small = replace(_setup(efficiency, host), seq_len=32, global_batch_size=2)
    one = replace(measured, micro_batch_size=1)
    _, step, _ = predict(small, one)
    step_phase = _Evaluator(small).communication(one).phases[Phase.STEP].total(1)
    seconds = step.total - step.optimizer_step - step_phase - step.offload_transfer
    return {"seconds": seconds, "micro_batch_size": 1, "seq_len": 32, "repetitions": 10}


def test_calibration_from_a_measurement_is_stored_and_used(isolated: TestClient) -> None:
    assert isolated.get("/v1/calibrations").json() == {"data": [], "count": 0}
    # a small model's micro-step is host-bound: the run sets the host cost per kernel
    job_id = _store_measurement(isolated, _predicted_step(0.75, host=50e-6))
    r = isolated.post("/v1/calibrations", json={"measurement_id": job_id})
    assert r.status_code == 201, r.text
    cal = r.json()
    assert cal["gpu"] == "l4" and cal["device_name"] == "NVIDIA L4"
    assert cal["figure"] == "host" and "host-bound" in cal["note"]
    assert cal["host_seconds_per_kernel"] == pytest.approx(50e-6, rel=1e-6)
    assert cal["measurement_id"] == job_id and cal["stage"] == 2
    listed = isolated.get("/v1/calibrations").json()
    assert listed["count"] == 1 and listed["data"][0]["id"] == cal["id"]

    body = post(isolated, SMALL)  # l4, mixed_bf16: the calibration applies
    assert body["calibration"]["host_calibration_id"] == cal["id"]
    assert body["calibration"]["calibration_id"] is None  # the GEMM efficiency stays stated
    assert body["calibration"]["host_seconds_per_kernel"] == pytest.approx(50e-6, rel=1e-6)
    assert cal["id"] in body["assumptions"]["host_seconds_per_kernel_source"]
    other = post(isolated, {**SMALL, "gpu": "l40s"})  # another GPU: the stated default
    assert other["calibration"]["host_calibration_id"] is None
    fp32 = post(isolated, {**SMALL, "precision": "fp32"})  # another precision: the default
    assert fp32["calibration"]["host_calibration_id"] is None


def test_an_offloaded_run_times_its_host_optimizer_for_the_plan(isolated: TestClient) -> None:
    # FSDP2 with CPU offload on a host whose optimizer streams 3 GB/s per rank: the run's timed
    # optimizer step sets that bandwidth and nothing else (no probe; the step's remainder
    # holds the offload copies, no measure of the GPU)
    host_bw = 3e9
    offloaded = replace(MEASURED, offload=OffloadChoice.OPTIMIZER_AND_PARAMS)
    setup = replace(_setup(0.75, 50e-6), host_optimizer_bandwidth=host_bw)
    step = predict(setup, offloaded)[1].total
    timed = _Evaluator(setup).host_step_bytes(offloaded) / host_bw
    job_id = _store_measurement(isolated, step, host_optimizer_s=timed)
    r = isolated.post("/v1/calibrations", json={"measurement_id": job_id})
    assert r.status_code == 201, r.text
    cal = r.json()
    assert cal["host_optimizer_bandwidth"] == pytest.approx(host_bw, rel=1e-9)
    assert cal["figure"] == "host_optimizer" and cal["host_seconds_per_kernel"] is None
    assert "not one this run reached" in cal["note"]
    assert any("sets the host optimizer bandwidth" in n for n in cal["notes"])

    offload = {**SMALL, "search": {"offload": ["optimizer_and_params"], "stages": [2, 3]}}
    body = post(isolated, offload)
    assert body["assumptions"]["host_optimizer_bandwidth"] == pytest.approx(host_bw, rel=1e-9)
    assert cal["id"] in body["assumptions"]["host_optimizer_source"]
    # the other figures stay stated: the calibration sets neither
    assert body["calibration"]["calibration_id"] is None
    assert body["calibration"]["host_calibration_id"] is None
    # the request's own figure first; DeepSpeed's CPU Adam is another optimizer: not this one
    given = post(isolated, {**offload, "host_optimizer_bandwidth": 5e9})["assumptions"]
    assert given["host_optimizer_bandwidth"] == 5e9
    assert given["host_optimizer_source"] == "given by the request"
    ds = post(isolated, {**offload, "engine": "deepspeed", "search": {"stages": [2, 3]}})
    assert cal["id"] not in ds["assumptions"]["host_optimizer_source"]


def test_a_host_optimizer_figure_serves_plans_whose_ranks_step_on_as_many_threads(
    isolated: TestClient,
) -> None:
    # one rank per node keeps every core for its host optimizer; torchrun gives each of
    # several ranks per node one thread: a figure timed one way does not serve the other
    offloaded = replace(MEASURED, offload=OffloadChoice.OPTIMIZER_AND_PARAMS)
    setup = replace(_setup(0.75, 50e-6), host_optimizer_bandwidth=3e9)
    step = predict(setup, offloaded)[1].total
    timed = _Evaluator(setup).host_step_bytes(offloaded) / 3e9
    many = _store_measurement(isolated, step, host_optimizer_s=timed, cpu_threads=16)
    cal = isolated.post("/v1/calibrations", json={"measurement_id": many}).json()
    assert cal["host_optimizer_threads"] == "all"
    assert cal["host_optimizer_bandwidth"] == pytest.approx(3e9, rel=1e-9)

    search = {"offload": ["optimizer_and_params"], "stages": [2, 3]}
    one_per_node = {**SMALL, "gpus": 2, "gpus_per_node": 1, "search": search}
    body = post(isolated, one_per_node)["assumptions"]
    assert body["host_optimizer_threads"] == "all"
    assert cal["id"] in body["host_optimizer_source"]
    assert body["host_optimizer_bandwidth"] == pytest.approx(3e9, rel=1e-9)
    shared = post(isolated, {**SMALL, "search": search})["assumptions"]  # 2 ranks on a node
    assert shared["host_optimizer_threads"] == "one"
    assert "OMP_NUM_THREADS=1" in shared["host_optimizer_threads_source"]
    assert cal["id"] not in shared["host_optimizer_source"]
    assert "single-tensor AdamW on one host thread" in shared["host_optimizer_source"]
    # an accelerate config: accelerate launch sets one thread even for a node's only rank
    accelerate = {**one_per_node, "engine_config": {"fsdp_version": 2}}
    launched = post(isolated, accelerate)["assumptions"]
    assert launched["host_optimizer_threads"] == "one"
    assert "accelerate" in launched["host_optimizer_threads_source"]
    # a run whose ranks stepped on one thread serves the plan of several ranks per node
    single = _store_measurement(
        isolated, step, host_optimizer_s=timed / 4, cpu_threads=1, job_id="job-2"
    )
    cal_one = isolated.post("/v1/calibrations", json={"measurement_id": single}).json()
    assert cal_one["host_optimizer_threads"] == "one"
    shared = post(isolated, {**SMALL, "search": search})["assumptions"]
    assert cal_one["id"] in shared["host_optimizer_source"]
    assert shared["host_optimizer_bandwidth"] == pytest.approx(12e9, rel=1e-9)
    # the request decides when it says
    given = post(isolated, {**one_per_node, "host_optimizer_threads": "one"})["assumptions"]
    assert (
        given["host_optimizer_threads"] == "one" and cal_one["id"] in given["host_optimizer_source"]
    )


def test_host_optimizer_threads_for_deepspeed(client: TestClient) -> None:
    # DeepSpeed's offloaded step runs torch's host ops on the rank's threads too: planned by
    # them, and the deepspeed launcher (every core per rank) is asked for by all
    body = post(client, {**SMALL, "engine": "deepspeed"})["assumptions"]
    assert body["host_optimizer_threads"] == "one"
    assert "deepspeed launcher" in body["host_optimizer_threads_source"]
    told = post(client, {**SMALL, "engine": "deepspeed", "host_optimizer_threads": "all"})
    assert told["assumptions"]["host_optimizer_threads"] == "all"
    assert told["assumptions"]["host_optimizer_bandwidth"] > body["host_optimizer_bandwidth"]
    bad = client.post("/v1/plan", json={**SMALL, "host_optimizer_threads": "some"})
    assert bad.status_code == 422 and "host_optimizer_threads" in bad.text


def test_an_offloaded_run_with_its_probe_sets_the_host_cost_not_the_gemm_efficiency(
    isolated: TestClient,
) -> None:
    offloaded = replace(MEASURED, offload=OffloadChoice.OPTIMIZER_AND_PARAMS)
    setup = replace(_setup(0.75, 50e-6), host_optimizer_bandwidth=3e9)
    timed = _Evaluator(setup).host_step_bytes(offloaded) / 3e9
    # a step 0.5 s longer than the model predicts (FSDP2's host copies): not the GPU's speed
    step = predict(setup, offloaded)[1].total + 0.5
    job_id = _store_measurement(
        isolated, step, probe=_predicted_probe(0.75, 50e-6, offloaded), host_optimizer_s=timed
    )
    cal = isolated.post("/v1/calibrations", json={"measurement_id": job_id}).json()
    assert cal["figure"] == "host"
    # (the helper's probe time leaves out all offload transfer; the probe model counts the
    # per-micro-step part of it, so the host cost comes back within a few %)
    assert cal["host_seconds_per_kernel"] == pytest.approx(50e-6, rel=0.02)
    assert cal["efficiency"] == 0.75  # kept
    assert any("the GEMM efficiency is not taken from its step" in n for n in cal["notes"])
    # asked for explicitly, the step sets it
    gpu = isolated.post("/v1/calibrations", json={"measurement_id": job_id, "figure": "both"})
    assert gpu.json()["efficiency"] < 0.75


def test_a_run_without_offload_says_why_it_sets_no_host_optimizer(isolated: TestClient) -> None:
    job_id = _store_measurement(isolated, _predicted_step(0.75, host=50e-6))
    cal = isolated.post("/v1/calibrations", json={"measurement_id": job_id}).json()
    assert cal["host_optimizer_bandwidth"] is None
    assert "host_optimizer_bandwidth is null: the run did not offload" in cal["note"]


def test_one_run_with_its_host_probe_sets_both_figures(isolated: TestClient) -> None:
    # GEMMs at 20 % of the peak, 2 µs per kernel: the step is GPU-bound, the probe host-bound
    probe = _predicted_probe(0.2, 2e-6)
    job_id = _store_measurement(isolated, _predicted_step(0.2, 2e-6), probe=probe)
    r = isolated.post("/v1/calibrations", json={"measurement_id": job_id})
    assert r.status_code == 201, r.text
    cal = r.json()
    assert cal["figure"] == "both" and "host probe" in cal["note"]
    assert cal["efficiency"] == pytest.approx(0.2, rel=1e-6)
    assert cal["host_seconds_per_kernel"] == pytest.approx(2e-6, rel=1e-6)
    assert cal["host_probe_seconds"] == pytest.approx(probe["seconds"])
    body = post(isolated, SMALL)  # the plan takes both figures from it
    assert body["calibration"]["calibration_id"] == cal["id"]
    assert body["calibration"]["host_calibration_id"] == cal["id"]
    assert body["calibration"]["efficiency"] == pytest.approx(0.2, rel=1e-6)
    assert body["calibration"]["host_seconds_per_kernel"] == pytest.approx(2e-6, rel=1e-6)


def test_a_host_bound_run_with_its_probe_keeps_the_stated_efficiency(isolated: TestClient) -> None:
    probe = _predicted_probe(0.75, 50e-6)
    job_id = _store_measurement(isolated, _predicted_step(0.75, 50e-6), probe=probe)
    cal = isolated.post("/v1/calibrations", json={"measurement_id": job_id}).json()
    assert cal["figure"] == "host"
    assert cal["host_seconds_per_kernel"] == pytest.approx(50e-6, rel=1e-6)
    assert cal["efficiency"] == 0.75
    assert any("host-bound at the probe's host cost" in n for n in cal["notes"])
    body = post(isolated, SMALL)
    assert body["calibration"]["host_calibration_id"] == cal["id"]
    assert body["calibration"]["calibration_id"] is None  # the GEMM efficiency stays stated


def test_both_figures_need_the_host_probe(isolated: TestClient) -> None:
    job_id = _store_measurement(isolated, _predicted_step(0.2, 2e-6))
    r = isolated.post("/v1/calibrations", json={"measurement_id": job_id, "figure": "both"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "figure"
    # without a probe the run sets one figure, and says why the probe's time is null
    cal = isolated.post("/v1/calibrations", json={"measurement_id": job_id}).json()
    assert cal["host_probe_seconds"] is None and "timed no host probe" in cal["note"]


def test_calibration_of_the_gpu_figure(isolated: TestClient) -> None:
    # a run timed as if the host were free: asked for the GPU figure, it recovers the GEMMs'
    job_id = _store_measurement(isolated, _predicted_step(0.17, host=1e-12))
    r = isolated.post("/v1/calibrations", json={"measurement_id": job_id, "figure": "gpu"})
    assert r.status_code == 201, r.text
    cal = r.json()
    assert cal["figure"] == "gpu" and "GPU-bound" in cal["note"]
    assert cal["efficiency"] == pytest.approx(0.17, rel=1e-6)
    body = post(isolated, SMALL)
    assert body["calibration"]["calibration_id"] == cal["id"]
    assert body["calibration"]["efficiency"] == pytest.approx(0.17, rel=1e-6)
    assert body["calibration"]["host_calibration_id"] is None


def test_calibration_refuses_a_cpu_measurement(isolated: TestClient) -> None:
    job_id = _store_measurement(isolated, 1.0, device="cpu")
    r = isolated.post("/v1/calibrations", json={"measurement_id": job_id})
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "measurement_id"
    assert "GPU" in r.json()["detail"][0]["msg"]


def test_calibration_refuses_a_step_shorter_than_its_communication(isolated: TestClient) -> None:
    job_id = _store_measurement(isolated, 1e-9)
    r = isolated.post("/v1/calibrations", json={"measurement_id": job_id})
    assert r.status_code == 422
    assert "nothing left for the micro-steps" in r.json()["detail"][0]["msg"]


def test_calibration_of_an_unknown_job_is_a_404(isolated: TestClient) -> None:
    r = isolated.post("/v1/calibrations", json={"measurement_id": "nope"})
    assert r.status_code == 404
    assert r.json()["detail"][0]["field"] == "measurement_id"


def test_calibration_of_a_missing_stage(isolated: TestClient) -> None:
    job_id = _store_measurement(isolated, 1.0)
    r = isolated.post("/v1/calibrations", json={"measurement_id": job_id, "stage": 3})
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "stage"


def test_openapi_carries_the_example(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/plan"]["post"]["requestBody"]["content"]["application/json"]
    assert "llama3_8b_on_8_h100" in body["examples"]
    assert Engine.DEEPSPEED.value == body["examples"]["llama3_8b_on_8_h100"]["value"]["engine"]


def test_a_given_efficiency_is_stored_and_used(isolated: TestClient) -> None:
    r = isolated.post(
        "/v1/calibrations",
        json={"gpu": "l4", "efficiency": 0.31, "engine": "torch", "source": "our logs"},
    )
    assert r.status_code == 201, r.text
    cal = r.json()
    assert cal["measurement_id"] is None and cal["stage"] is None
    assert "given by the request" in cal["note"] and "our logs" in cal["note"]
    body = post(isolated, SMALL)
    assert body["calibration"]["calibration_id"] == cal["id"]
    assert body["calibration"]["efficiency"] == 0.31
    # a calibration of the same GPU by the planned engine wins over another engine's
    r = isolated.post(
        "/v1/calibrations",
        json={"gpu": "l4", "efficiency": 0.5, "engine": "deepspeed", "source": "other"},
    )
    assert r.status_code == 201
    assert post(isolated, SMALL)["calibration"]["efficiency"] == 0.31
    assert post(isolated, {**SMALL, "engine": "deepspeed"})["calibration"]["efficiency"] == 0.5


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gpu": "l4"}, "body"),
        ({"efficiency": 0.3}, "body"),
        ({"measurement_id": "x", "gpu": "l4", "efficiency": 0.3}, "body"),
        ({"gpu": "l4", "efficiency": 0.3, "figure": "host"}, "body"),
        ({"measurement_id": "x", "figure": "disk"}, "figure"),
        ({"gpu": "nope", "efficiency": 0.3}, "gpu"),
        ({"gpu": "l4", "efficiency": 1.5}, "efficiency"),
    ],
)
def test_bad_calibrations_name_the_field(
    isolated: TestClient, body: dict[str, Any], field: str
) -> None:
    r = isolated.post("/v1/calibrations", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == field


def test_a_calibration_of_the_earlier_model_is_listed_but_not_used(isolated: TestClient) -> None:
    # stored before calibrations said which figure they set: a whole-step efficiency
    store = isolated.app.state.jobs.store  # type: ignore[attr-defined]
    store.add_calibration(
        "old", "l4", "mixed_bf16", "torch", 0.17, {"device_name": "NVIDIA L4", "source": "old"}
    )
    listed = isolated.get("/v1/calibrations").json()["data"]
    assert listed[0]["id"] == "old" and listed[0]["figure"] is None
    assert "earlier step-time model" in listed[0]["note"]
    body = post(isolated, SMALL)
    assert body["calibration"]["calibration_id"] is None
    assert body["calibration"]["efficiency"] == 0.75


@pytest.mark.parametrize("bandwidth", [5e-324, 0, -1.0, 1e14])
def test_a_host_optimizer_bandwidth_out_of_range_is_a_422(
    client: TestClient, bandwidth: float
) -> None:
    r = client.post("/v1/plan", json={**SMALL, "host_optimizer_bandwidth": bandwidth})
    assert r.status_code == 422, r.text
    assert "host_optimizer_bandwidth" in r.text
