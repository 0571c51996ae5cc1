"""``zerocalc plan``: the API's numbers, a ranked table, errors that name the option or field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from app import cli

runner = CliRunner()
ARCH = "layers=4,hidden=256,heads=8,vocab_size=1000,max_seq_len=512"
BODY: dict[str, Any] = {
    "model": {
        "architecture": {
            "layers": 4,
            "hidden": 256,
            "heads": 8,
            "vocab_size": 1000,
            "max_seq_len": 512,
        }
    },
    "gpu": "l4",
    "gpus": 2,
    "global_batch_size": 8,
    "seq_len": 512,
    "search": {"stages": [0, 3], "activation_checkpointing": ["none", "full"]},
}
ARGS = [
    "--arch", ARCH, "--gpu", "l4", "--gpus", "2", "--global-batch", "8", "--seq-len", "512",
    "--stages", "0,3", "--checkpointing", "none,full",
]  # fmt: skip


def invoke(*args: str) -> Any:
    return runner.invoke(cli.cli, ["plan", *args])


def test_json_equals_the_api(client: TestClient) -> None:
    result = invoke(*ARGS, "--json")
    assert result.exit_code == 0, result.output
    r = client.post("/v1/plan", json=BODY)
    assert r.status_code == 200
    assert json.loads(result.stdout) == r.json()


def test_table_ranks_the_candidates() -> None:
    result = invoke(*ARGS, "--top", "3")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "Plan" in text and "tokens/s" in text and "GiB = 2^30 bytes" in text
    assert (
        "configurations evaluated" in text
        and "GEMM efficiency 0.750" in text
        and "µs per kernel" in text
    )
    rows = [line for line in text.splitlines() if line.startswith("│ ")]
    assert [row.split("│")[1].strip() for row in rows] == ["1", "2", "3"]


def test_host_optimizer_threads_reach_the_plan() -> None:
    offload = [
        "--arch", ARCH, "--gpu", "l4", "--gpus", "2", "--gpus-per-node", "1",
        "--global-batch", "8", "--seq-len", "512", "--stages", "2,3",
        "--offload", "optimizer_and_params",
    ]  # fmt: skip
    told = invoke(*offload, "--host-optimizer-threads", "one", "--json")
    assert told.exit_code == 0, told.output
    assert json.loads(told.stdout)["assumptions"]["host_optimizer_threads"] == "one"
    table = invoke(*offload, "--top", "2")
    assert table.exit_code == 0, table.output
    assert "on all thread(s) per rank" in table.stdout and "every core" in table.stdout


def test_custom_gpu_from_two_figures() -> None:
    result = invoke(
        "--arch", ARCH, "--gpu-memory", "16GiB", "--gpu-flops", "1e14", "--gpus", "2",
        "--global-batch", "8", "--seq-len", "512", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    gpu = json.loads(result.stdout)["gpu"]
    assert gpu["memory"] == 16 * 2**30 and gpu["peak_flops"] == 1e14


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpu", "l4", "--gpu-memory", "1GiB", "--gpu-flops", "1"], "not both"),
        (["--gpu-memory", "1GiB"], "needs both"),
        (["--gpu", "l4", "--stages", "a,b"], "--stages"),
        (["--gpu", "nope"], "gpu: unknown GPU"),
        (["--gpu", "l4", "--global-batch", "7"], "global_batch_size"),
    ],
)
def test_refusals_name_the_option_or_field(args: list[str], says: str) -> None:
    base = ["--arch", ARCH, "--gpus", "2", "--global-batch", "8", "--seq-len", "512"]
    result = invoke(*base, *args)
    assert result.exit_code == 2
    assert says in result.output


def test_checkpoint_offload_candidates_from_the_option() -> None:
    # a transformers model (the llama3-8b preset): full checkpointing with its layers' inputs in
    # host memory only, and a value that is not a boolean names the option
    args = [
        "--preset", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64",
        "--seq-len", "4096", "--stages", "3", "--micro-batch", "2", "--checkpointing", "full",
        "--offload", "none",
    ]  # fmt: skip
    result = invoke(*args, "--checkpoint-offload", "true", "--json")
    assert result.exit_code == 0, result.output
    (found,) = json.loads(result.stdout)["candidates"]
    assert found["config"]["checkpoint_offload"] is True
    assert found["step_time"]["checkpoint_transfer"] > 0
    table = invoke(*args, "--checkpoint-offload", "true")
    assert "inputs on host" in table.stdout
    bad = invoke(*args, "--checkpoint-offload", "yes")
    assert bad.exit_code == 2
    assert "--checkpoint-offload" in bad.output


def test_every_n_layers_candidates_from_the_option() -> None:
    args = [
        "--preset", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64",
        "--seq-len", "4096", "--stages", "3", "--micro-batch", "2", "--checkpointing", "full",
        "--offload", "none", "--checkpoint-offload", "false",
    ]  # fmt: skip
    result = invoke(*args, "--checkpoint-every-n-layers", "1,2", "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)["candidates"]
    assert sorted(c["config"]["checkpoint_every_n_layers"] for c in found) == [1, 2]
    table = invoke(*args, "--checkpoint-every-n-layers", "2")
    assert "full, every 2 layers" in table.stdout
    bad = invoke(*args, "--checkpoint-every-n-layers", "two")
    assert bad.exit_code == 2
    assert "--checkpoint-every-n-layers" in bad.output
