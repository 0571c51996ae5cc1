"""The ``zerocalc`` command: same numbers as the API, tables with named units, JSON, errors."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from app import cli
from app.cli import transport as cli_transport
from app.main import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def invoke(*args: str) -> Any:
    return runner.invoke(cli.cli, list(args))


def api(client: TestClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


@pytest.fixture
def client() -> Any:
    with TestClient(app) as c:
        yield c


def forward_to(client: TestClient) -> httpx.MockTransport:
    """A transport that hands each request to the app, as a running service would."""

    def handle(request: httpx.Request) -> httpx.Response:
        r = client.request(
            request.method, request.url.path, content=request.content, headers=dict(request.headers)
        )
        return httpx.Response(r.status_code, content=r.content, headers=r.headers)

    return httpx.MockTransport(handle)


@pytest.mark.parametrize(
    ("args", "body"),
    [
        # ZeRO paper Figure 1: 7.5B, Nd = 64, K = 12.
        (["--params", "7.5B", "--dp", "64"], {"model": {"params": 7_500_000_000}, "dp": 64}),
        (
            [
                "--preset",
                "llama3-8b",
                "-n",
                "8",
                "--precision",
                "mixed_bf16",
                "-s",
                "1,2,3",
                "--offload-optimizer",
                "cpu",
                "-m",
                "80GB",
            ],
            {
                "model": {"preset": "llama3-8b"},
                "dp": 8,
                "precision": "mixed_bf16",
                "stages": [1, 2, 3],
                "offload": {"optimizer": "cpu"},
                "device_memory": 80 * 10**9,
            },
        ),
        (
            [
                "--arch",
                "layers=12,hidden=1024,heads=16,vocab_size=32000,ffn_hidden=4096,max_seq_len=512",
                "--dp",
                "8",
                "--micro-batch",
                "8",
                "--seq-len",
                "512",
                "--device-memory",
                "24GiB",
            ],
            {
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
                "batch": {"micro_batch_size": 8, "seq_len": 512},
                "device_memory": 24 * 2**30,
            },
        ),
        (
            ["--preset", "llama3-8b", "--dp", "8", "--micro-batch", "2", "--seq-len", "4096"]
            + ["--padded"],
            {
                "model": {"preset": "llama3-8b"},
                "dp": 8,
                "batch": {"micro_batch_size": 2, "seq_len": 4096, "padded": True},
            },
        ),
        (
            ["--preset", "llama3-8b", "--dp", "8", "--micro-batch", "1", "--seq-len", "8192"]
            + ["--checkpointing", "full", "--checkpoint-offload"],
            {
                "model": {"preset": "llama3-8b"},
                "dp": 8,
                "batch": {
                    "micro_batch_size": 1,
                    "seq_len": 8192,
                    "activation_checkpointing": "full",
                    "checkpoint_offload": True,
                },
            },
        ),
        (
            ["--preset", "llama3-8b", "--dp", "8", "--micro-batch", "1", "--seq-len", "8192"]
            + ["--engine", "torch", "--checkpointing", "full", "--checkpoint-every-n-layers", "4"],
            {
                "model": {"preset": "llama3-8b"},
                "dp": 8,
                "engine": "torch",
                "batch": {
                    "micro_batch_size": 1,
                    "seq_len": 8192,
                    "activation_checkpointing": "full",
                    "checkpoint_every_n_layers": 4,
                },
            },
        ),
    ],
)
def test_memory_json_equals_the_api(
    client: TestClient, args: list[str], body: dict[str, Any]
) -> None:
    result = invoke("memory", *args, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == api(client, "/v1/memory", body)


def test_memory_table_names_units(client: TestClient) -> None:
    result = invoke("memory", "--params", "7.5e9", "--dp", "64")
    assert result.exit_code == 0, result.output
    expected = api(client, "/v1/memory", {"model": {"params": 7_500_000_000}, "dp": 64})
    for stage in expected["stages"]:
        # Each figure as the API writes it, e.g. '31.41 GB (29.25 GiB)' for stage 1.
        assert stage["per_device_readable"]["model_states"] in result.stdout
    assert "31.41 GB (29.25 GiB)" in result.stdout
    assert "GB = 10^9 bytes, GiB = 2^30 bytes" in result.stdout


def test_memory_over_http_sends_the_same_body(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    transport = forward_to(client)

    def remote(url: str, api_key: str | None = None) -> httpx.Client:
        seen.append(url)
        headers = {"X-API-Key": api_key} if api_key else {}
        return httpx.Client(base_url=url, transport=transport, headers=headers)

    monkeypatch.setattr(cli_transport, "remote_client", remote)
    local = invoke("memory", "--params", "13B", "--dp", "16", "--json")
    remote_run = invoke(
        "memory", "--params", "13B", "--dp", "16", "--json", "--url", "http://gpu-node:8000"
    )
    assert remote_run.exit_code == 0, remote_run.output
    assert seen == ["http://gpu-node:8000"]
    assert json.loads(remote_run.stdout) == json.loads(local.stdout)


def test_capacity_json_and_table(client: TestClient) -> None:
    body = {"device_memory": 32 * 10**9, "dp": 64}  # ZeRO paper Table 2
    result = invoke("capacity", "-m", "32GB", "--dp", "64", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == api(client, "/v1/capacity", body)
    table = invoke("capacity", "-m", "32GB", "--dp", "64", "--preset", "llama2-70b")
    assert table.exit_code == 0, table.output
    assert "7,641,791,044" in table.stdout and "32.00 GB (29.80 GiB)" in table.stdout


def test_comm_json_equals_the_api(client: TestClient) -> None:
    body = {"model": {"preset": "gpt2"}, "dp": 16, "stages": [0, 3]}
    if client.post("/v1/communication", json=body).status_code == 404:
        pytest.skip("this tree has no POST /v1/communication")
    result = invoke("comm", "--preset", "gpt2", "--dp", "16", "-s", "0,3", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == api(client, "/v1/communication", body)
    table = invoke("comm", "--preset", "gpt2", "--dp", "16", "-s", "0,3")
    assert table.exit_code == 0, table.output
    assert "GiB" in table.stdout and "all_reduce" in table.stdout


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["memory", "--params", "7.5B", "--dp", "0"], "dp"),
        (["memory", "--preset", "no-such-model", "--dp", "8"], "model.preset"),
        (["memory", "--params", "7.5B", "--dp", "8", "-s", "0,0"], "stages"),
        (["capacity", "-m", "0", "--dp", "8"], "device_memory"),
    ],
)
def test_refusals_name_the_field(args: list[str], field: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert f"{field}:" in result.stderr


@pytest.mark.parametrize(
    ("text", "n_bytes"),
    [
        ("80GB", 80_000_000_000),  # GB = 10^9 bytes
        ("80 GiB", 85_899_345_920),  # GiB = 2^30 bytes
        ("1.5TB", 1_500_000_000_000),
        ("40960MiB", 42_949_672_960),
        ("123", 123),
        ("0.5KiB", 512),
    ],
)
def test_sizes_parse_exactly(text: str, n_bytes: int) -> None:
    assert cli.parse_size(text) == n_bytes


@pytest.mark.parametrize("text", ["80 GX", "1.5", "0.1B", "lots"])
def test_sizes_refuse_what_is_not_whole_bytes(text: str) -> None:
    with pytest.raises(cli.CliError):
        cli.parse_size(text)


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("7.5B", 7_500_000_000),
        ("7.5e9", 7_500_000_000),
        ("175b", 175_000_000_000),
        ("124,439,808", 124_439_808),
        ("350M", 350_000_000),
    ],
)
def test_counts_parse_exactly(text: str, count: int) -> None:
    assert cli.parse_count(text) == count


def test_measure_polls_with_progress_and_prints_the_comparison(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client side of /v1/measure against a job whose answers this test scripts."""
    posted: list[dict[str, Any]] = []
    states = iter(
        [
            {
                "status": "running",
                "progress": {"fraction": 0.5, "message": "stage 2"},
                "result": None,
            },
            {
                "status": "succeeded",
                "progress": {"fraction": 1.0, "message": "done"},
                "result": {
                    "runs": [
                        {
                            "stage": 2,
                            "measured": {"resident": 1_000_000_000, "peak": 2_000_000_000},
                            "predicted": {"resident": 1_100_000_000, "peak": 1_900_000_000},
                            "relative_error": {"resident": 0.1, "peak": -0.05},
                            "communication": {
                                "measured_sent_bytes_per_rank": 4_000_000,
                                "predicted_sent_bytes_per_rank": 4_200_000,
                                "relative_error": 0.05,
                            },
                        }
                    ],
                },
            },
        ]
    )

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.headers.get("X-API-Key") == "s3cret"
        if request.method == "POST":
            posted.append(json.loads(request.content))
            return httpx.Response(
                202, json={"id": "j1", "status": "queued"}, headers={"Location": "/v1/measure/j1"}
            )
        assert request.url.path == "/v1/measure/j1"
        return httpx.Response(200, json={"id": "j1", "error": None, **next(states)})

    def remote(url: str, api_key: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=url,
            transport=httpx.MockTransport(handle),
            headers={"X-API-Key": api_key} if api_key else {},
        )

    monkeypatch.setattr(cli_transport, "remote_client", remote)
    result = invoke(
        "measure",
        "--preset",
        "gpt2",
        "--dp",
        "4",
        "-s",
        "2",
        "--mode",
        "simulated",
        "--device",
        "cpu",
        "--micro-batch",
        "2",
        "--seq-len",
        "128",
        "--interval",
        "0",
        "--api-key",
        "s3cret",
    )
    assert result.exit_code == 0, result.output
    assert posted == [
        {
            "model": {"preset": "gpt2"},
            "dp": 4,
            "stages": [2],
            "batch": {"micro_batch_size": 2, "seq_len": 128},
            "mode": "simulated",
            "device": "cpu",
        }
    ]
    assert "2.00 GB (1.86 GiB)" in result.stdout  # measured peak
    assert "+10.00%" in result.stdout and "-5.00%" in result.stdout
    # Below 0.01 GB the table writes MB / MiB rather than 0.00 GB.
    assert "4.00 MB (3.81 MiB)" in result.stdout and "+5.00%" in result.stdout
    assert "succeeded" in result.stderr  # the progress bar's last state


def test_measure_reports_a_failed_job(monkeypatch: pytest.MonkeyPatch) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(202, json={"id": "j2", "status": "queued"})
        return httpx.Response(
            200,
            json={
                "id": "j2",
                "status": "failed",
                "error": "CUDA OOM",
                "progress": {"fraction": 0.3, "message": ""},
                "result": None,
            },
        )

    def remote(url: str, api_key: str | None = None) -> httpx.Client:
        assert api_key is None
        return httpx.Client(base_url=url, transport=httpx.MockTransport(handle))

    monkeypatch.setattr(cli_transport, "remote_client", remote)
    result = invoke("measure", "--preset", "gpt2", "--dp", "2", "--interval", "0")
    assert result.exit_code == 2
    assert "CUDA OOM" in result.stderr


def test_serve_runs_one_uvicorn_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: calls.append((args, kwargs)))
    result = invoke("serve", "--port", "8123")
    assert result.exit_code == 0, result.output
    assert calls == [(("app.main:app",), {"host": "127.0.0.1", "port": 8123, "workers": 1})]


def test_console_script_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["zerocalc"] == "app.cli:main"


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["memory", "--params", "7,5B", "--dp", "8"], "--params"),
        (["capacity", "--device-memory", "80,5GB", "--dp", "8"], "--device-memory"),
        (["comm", "-p", "1,5e9", "--dp", "8"], "--params"),
    ],
)
def test_an_ambiguous_comma_exits_2_naming_the_option(args: list[str], option: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert f"{option}: " in result.stderr and "comma is ambiguous" in result.stderr


def test_too_large_says_too_large() -> None:
    result = invoke("memory", "--params", "1e30", "--dp", "8")
    assert result.exit_code == 2
    assert "--params: " in result.stderr and "too large" in result.stderr


def test_k_means_optimizer_state_bytes_and_grad_accum_means_steps(client: TestClient) -> None:
    """--k is K (bytes per parameter) everywhere; --grad-accum is accumulation steps everywhere."""
    memory = invoke("memory", "-p", "7.5B", "--dp", "64", "--k", "16", "--json")
    assert memory.exit_code == 0, memory.output
    body = {"model": {"params": 7_500_000_000}, "dp": 64, "k": 16}
    assert json.loads(memory.stdout) == api(client, "/v1/memory", body)
    comm_body = {"model": {"preset": "gpt2"}, "dp": 8, "grad_accumulation_steps": 4}
    comm = invoke("comm", "--preset", "gpt2", "--dp", "8", "--grad-accum", "4", "--json")
    assert comm.exit_code == 0, comm.output
    assert json.loads(comm.stdout) == api(client, "/v1/communication", comm_body)
    batch = {"micro_batch_size": 2, "seq_len": 128, "grad_accumulation_steps": 4}
    args = ["--micro-batch", "2", "--seq-len", "128", "--grad-accum", "4"]
    # memory and measure send it in the batch; comm beside the model, as each API takes it
    assert cli.build_request(None, {"grad_accum": 4}) == {"batch": {"grad_accumulation_steps": 4}}
    assert cli.build_request(None, {"grad_accumulation_steps": 4}) == {"grad_accumulation_steps": 4}
    mem = invoke("memory", "--preset", "gpt2", "--dp", "8", *args, "--json")
    assert mem.exit_code == 0, mem.output
    expected = api(client, "/v1/memory", {"model": {"preset": "gpt2"}, "dp": 8, "batch": batch})
    assert json.loads(mem.stdout) == expected


def test_options_override_the_body_file(client: TestClient, tmp_path: Path) -> None:
    base = tmp_path / "request.json"
    base.write_text(
        json.dumps(
            {
                "model": {"preset": "gpt2"},
                "dp": 4,
                "stages": [1, 2],
                "offload": {"optimizer": "cpu"},
            }
        )
    )
    result = invoke("memory", "--body", str(base), "--params", "7.5B", "--dp", "64", "--json")
    assert result.exit_code == 0, result.output
    body = {
        "model": {"params": 7_500_000_000},
        "dp": 64,
        "stages": [1, 2],
        "offload": {"optimizer": "cpu"},
    }
    assert json.loads(result.stdout) == api(client, "/v1/memory", body)


def test_capacity_table_names_the_model_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where /v1/capacity names the model it found per stage, the table prints it."""
    answer = {
        "device_memory": 80 * 10**9,
        "dp": 8,
        "criterion": "peak <= device_memory",
        "stages": [
            {
                "stage": 0,
                "max_params": None,
                "model": None,
                "min_dp": None,
                "notes": ["the replicated states alone exceed the device"],
            },
            {
                "stage": 3,
                "max_params": 31_000_000_000,
                "model": {"name": "llama3-8b shape, 40 × 7168", "params": 31_000_000_000},
                "min_dp": None,
                "notes": [],
            },
        ],
    }

    def remote(url: str, api_key: str | None = None) -> httpx.Client:  # noqa: ARG001
        handler = httpx.MockTransport(lambda _: httpx.Response(200, json=answer))
        return httpx.Client(base_url=url, transport=handler)

    monkeypatch.setattr(cli_transport, "remote_client", remote)
    result = invoke("capacity", "-m", "80GB", "--dp", "8", "--url", "http://gpu-node:8000")
    assert result.exit_code == 0, result.output
    assert "llama3-8b shape, 40 × 7168" in result.stdout
    assert "31,000,000,000" in result.stdout
    assert "stage 0: the replicated states alone exceed the device" in result.stdout


HELP = [[], ["memory"], ["capacity"], ["comm"], ["measure"], ["serve"]]


@pytest.mark.parametrize("command", HELP, ids=lambda c: " ".join(c) or "zerocalc")
def test_help_runs(command: list[str]) -> None:
    result = invoke(*command, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.stdout


def readme_examples() -> list[str]:
    """The ``zerocalc`` lines of the README's command section, comments stripped."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## The `zerocalc` command", 1)[1].split("\n## ", 1)[0]
    lines = [
        line.split("  #", 1)[0].strip()
        for block in section.split("```bash")[1:]
        for line in block.split("```", 1)[0].splitlines()
    ]
    return [line for line in lines if line.startswith("zerocalc ")]


def test_the_readme_has_examples_of_every_command() -> None:
    commands = {line.split()[1] for line in readme_examples()}
    assert commands >= {"memory", "capacity", "comm", "measure", "serve"}


@pytest.mark.parametrize(
    "line",
    [line for line in readme_examples() if line.split()[1] not in ("serve", "measure")],
)
def test_readme_example_runs_as_written(line: str) -> None:
    result = invoke(*shlex.split(line)[1:])
    assert result.exit_code == 0, f"{line}\n{result.output}"
    assert result.stdout.strip()
