"""The measure job API under success and faults, with jobs routed to ``tests/api/fake_runner.py``.

Every fault (an exception, the time limit, cancel, kill -9, a restart of the service, a full
queue) fails or cancels that job alone; the test then runs the next job to its result.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.core.config import Settings, get_settings
from app.main import create_app

RUNNER = "tests.api.fake_runner"
ROOT = Path(__file__).resolve().parents[2]
FINAL = {"succeeded", "failed", "cancelled"}

BODY: dict[str, Any] = {
    "model": {"preset": "gpt2"},
    "dp": 4,
    "stages": [0, 1, 2, 3],
    "precision": "fp32",
    "mode": "simulated",
    "device": "cpu",
    "steps": 1,
    "warmup_steps": 1,
}


class Service:
    """A fresh app on ``data_dir`` whose settings a test swaps between requests."""

    def __init__(self, data_dir: Path, **settings: Any) -> None:
        """``settings`` hold for the app's life (queue_size is read once, at startup)."""
        self.base = {"data_dir": data_dir, **settings}
        self.app = create_app()
        self.headers: dict[str, str] = {}
        self.use("succeed")

    def use(self, runner: str, **settings: Any) -> None:
        """Route the next jobs to ``fake_runner.<runner>`` under these settings."""
        chosen = Settings(**{**self.base, "measure_runner": f"{RUNNER}:{runner}", **settings})
        self.app.dependency_overrides[get_settings] = lambda: chosen

    def __enter__(self) -> Service:
        self.client = TestClient(self.app).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.__exit__(*exc)

    def submit(self, body: dict[str, Any] | None = None) -> str:
        answer = self.client.post("/v1/measure", json=body or BODY, headers=self.headers)
        assert answer.status_code == 202, answer.text
        job_id: str = answer.json()["id"]
        assert answer.headers["location"] == f"/v1/measure/{job_id}"
        return job_id

    def get(self, job_id: str) -> dict[str, Any]:
        answer = self.client.get(f"/v1/measure/{job_id}", headers=self.headers)
        assert answer.status_code == 200, answer.text
        job: dict[str, Any] = answer.json()
        return job

    def wait(
        self,
        job_id: str,
        done: Callable[[dict[str, Any]], bool] = lambda j: j["status"] in FINAL,
        timeout: float = 30,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.get(job_id)
            if done(job):
                return job
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} never got there: {job}")

    def running_pids(self, job_id: str) -> list[int]:
        """The child's and its grandchild's pids, once the sleeping runner reported them."""
        job = self.wait(job_id, lambda j: j["progress"]["message"].startswith("pids "))
        assert job["status"] == "running"
        return [int(pid) for pid in job["progress"]["message"].split()[1:]]

    def next_job_succeeds(self) -> dict[str, Any]:
        self.use("succeed")
        job = self.wait(self.submit())
        assert job["status"] == "succeeded", job
        return job


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    with Service(tmp_path) as s:
        yield s


def gone(pid: int) -> bool:
    """No such process, or a zombie (an orphan our container's init may never reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, it was read
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_gone(pids: list[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not all(gone(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still alive: {[p for p in pids if not gone(p)]}"
        time.sleep(0.05)


def test_job_succeeds_is_listed_and_survives_a_new_app(tmp_path: Path) -> None:
    with Service(tmp_path) as service:
        job_id = service.submit()
        job = service.wait(job_id)
        assert job["status"] == "succeeded", job
        assert job["progress"] == {"fraction": 1.0, "message": "done"}
        assert job["error"] is None
        assert [run["stage"] for run in job["result"]["runs"]] == [0, 1, 2, 3]
        assert job["result"]["runs"][0]["relative_error"]["peak"] is None  # NaN stored as null
        assert job["request"]["model"]["preset"] == "gpt2"
        assert job["request"]["engine"] == "torch"  # defaults filled in
        assert job["request"]["precision"] == "fp32"
        assert (job["request"]["steps"], job["request"]["warmup_steps"]) == (1, 1)
        times = [datetime.fromisoformat(job[f"{k}_at"]) for k in ("created", "started", "finished")]
        assert times == sorted(times)

        listed = service.client.get("/v1/measurements").json()
        assert listed["count"] == 1
        assert listed["data"][0]["id"] == job_id

    with Service(tmp_path) as again:
        assert again.get(job_id) == job
        newer = again.next_job_succeeds()
        listed = again.client.get("/v1/measurements", params={"limit": 1}).json()
        assert listed["count"] == 2
        assert [j["id"] for j in listed["data"]] == [newer["id"]]  # newest first
        older = again.client.get("/v1/measurements", params={"limit": 1, "offset": 1}).json()
        assert [j["id"] for j in older["data"]] == [job_id]
        failed = again.client.get("/v1/measurements", params={"status": "failed"}).json()
        assert failed == {"data": [], "count": 0, "limit": 20, "offset": 0}


# (runner, settings, the readable error the job fails with)
FAULTS = [
    ("fail", {}, "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ("sleep", {"job_time_limit_s": 1.0}, "time limit of 1 s exceeded; the child process was"),
    ("die", {}, "child process died with signal 9 (SIGKILL)"),
    ("no_such_runner", {}, "AttributeError: module 'tests.api.fake_runner' has no attribute"),
]


@pytest.mark.parametrize(("runner", "settings", "error"), FAULTS, ids=[f[0] for f in FAULTS])
def test_a_failing_job_fails_alone(
    service: Service, runner: str, settings: dict[str, Any], error: str
) -> None:
    service.use(runner, **settings)
    job = service.wait(service.submit())
    assert job["status"] == "failed"
    assert job["result"] is None
    assert job["error"].startswith(error), job["error"]
    service.next_job_succeeds()


def test_cancel_kills_the_running_child_and_its_workers(service: Service) -> None:
    service.use("sleep")
    job_id = service.submit()
    pids = service.running_pids(job_id)

    answer = service.client.delete(f"/v1/measure/{job_id}")
    assert answer.status_code == 200
    assert answer.json()["status"] == "cancelled"
    wait_gone(pids)
    assert service.get(job_id)["status"] == "cancelled"
    assert service.get(job_id)["error"] is None

    again = service.client.delete(f"/v1/measure/{job_id}")  # a final job is left as it is
    assert again.status_code == 200
    assert again.json() == service.get(job_id)
    service.next_job_succeeds()


def test_cancel_a_queued_job(service: Service) -> None:
    service.use("sleep")
    running = service.submit()
    queued = service.submit()
    service.running_pids(running)

    cancelled = service.client.delete(f"/v1/measure/{queued}").json()
    assert cancelled["status"] == "cancelled"
    assert cancelled["started_at"] is None
    service.client.delete(f"/v1/measure/{running}")
    service.next_job_succeeds()
    assert service.get(queued)["started_at"] is None  # never ran


def test_queue_full_is_429_with_retry_after(tmp_path: Path) -> None:
    with Service(tmp_path, queue_size=1) as service:
        _fill_the_queue_then_drain_it(service)


def _fill_the_queue_then_drain_it(service: Service) -> None:
    service.use("sleep", job_time_limit_s=30)
    running = service.submit()
    service.running_pids(running)
    queued = service.submit()

    refused = service.client.post("/v1/measure", json=BODY)
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 30
    assert refused.json()["detail"][0]["type"] == "queue_full"

    for job_id in (queued, running):
        service.client.delete(f"/v1/measure/{job_id}")
    service.next_job_succeeds()
    assert service.client.get("/v1/measurements").json()["count"] == 3  # the 429 stored nothing


def test_shutdown_mid_job_fails_it_and_kills_the_child(tmp_path: Path) -> None:
    with Service(tmp_path) as first:
        first.use("sleep")
        job_id = first.submit()
        pids = first.running_pids(job_id)
    wait_gone(pids)
    with Service(tmp_path) as second:
        job = second.get(job_id)
        assert (job["status"], job["error"]) == ("failed", "service stopped while the job ran")
        second.next_job_succeeds()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_restart_mid_job_fails_that_job_and_keeps_the_others(tmp_path: Path) -> None:
    with Service(tmp_path) as first:
        kept = first.next_job_succeeds()

    port = _free_port()
    env = {
        **os.environ,
        "ZEROCALC_DATA_DIR": str(tmp_path),
        "ZEROCALC_MEASURE_RUNNER": f"{RUNNER}:sleep",
    }
    env.pop("ZEROCALC_API_KEY", None)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "app.main:app",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            deadline = time.monotonic() + 20
            while True:
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the server did not start"
                    time.sleep(0.1)
            job_id = http.post("/v1/measure", json=BODY).json()["id"]
            while (
                not http.get(f"/v1/measure/{job_id}")
                .json()["progress"]["message"]
                .startswith("pids ")
            ):
                assert time.monotonic() < deadline + 20, "the job did not start"
                time.sleep(0.05)
            pids = [
                int(p)
                for p in http.get(f"/v1/measure/{job_id}").json()["progress"]["message"].split()[1:]
            ]
        server.send_signal(signal.SIGKILL)  # no lifespan shutdown: a crash
        server.wait(10)
        wait_gone(pids)  # the orphaned child killed its group itself
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)

    with Service(tmp_path) as restarted:
        job = restarted.get(job_id)
        assert job["status"] == "failed"
        assert job["error"] == "service restarted while the job ran"
        assert restarted.get(kept["id"]) == kept
        restarted.next_job_succeeds()


def test_api_key_guards_measure(service: Service) -> None:
    service.use("succeed", api_key="s3cret")
    for headers in ({}, {"X-API-Key": "wrong"}, {"X-API-Key": "s3cret-but-longer"}):
        answer = service.client.post("/v1/measure", json=BODY, headers=headers)
        assert answer.status_code == 401
        assert answer.json()["detail"][0]["field"] == "X-API-Key"
    assert service.client.get("/v1/measurements").status_code == 401

    service.headers = {"X-API-Key": "s3cret"}
    job = service.wait(service.submit())
    assert job["status"] == "succeeded"
    assert service.client.get("/v1/measurements", headers=service.headers).json()["count"] == 1


@pytest.mark.parametrize("preset", ["mlp", "mlp-12x2048", "mlp-4x256", "gpt2"])
def test_presets_measure_builds_are_accepted(service: Service, preset: str) -> None:
    job = service.wait(service.submit({**BODY, "model": {"preset": preset}}))
    assert job["status"] == "succeeded"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_the_real_runner_measures_a_small_gpt_on_cpu(tmp_path: Path) -> None:
    """measure.runner:run (the default setting) through the job API, end to end."""
    body = {
        "model": {
            "architecture": {
                "layers": 1,
                "hidden": 64,
                "heads": 2,
                "vocab_size": 128,
                "max_seq_len": 16,
            }
        },
        "dp": 4,
        "stages": [2],
        "precision": "fp32",
        "mode": "simulated",
        "device": "cpu",
        "batch": {"micro_batch_size": 1, "seq_len": 16},
        "steps": 1,
        "warmup_steps": 1,
    }
    with Service(tmp_path) as service:
        service.app.dependency_overrides[get_settings] = lambda: Settings(data_dir=tmp_path)
        job = service.wait(service.submit(body), timeout=120)
    assert job["status"] == "succeeded", job["error"]
    (run,) = job["result"]["runs"]
    assert run["stage"] == 2
    for key in ("measured", "predicted", "relative_error", "communication"):
        assert key in run
    assert run["measured"]["resident"] > 0


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_the_shipped_runner_refuses_a_long_cpu_run_up_front(tmp_path: Path) -> None:
    """A 7B model on the CPU: a 422 naming device and the flag, before any job exists."""
    body = {
        **BODY,
        "model": {"preset": "llama2-7b"},
        "batch": {"micro_batch_size": 1, "seq_len": 512},
    }
    with Service(tmp_path) as service:
        service.app.dependency_overrides[get_settings] = lambda: Settings(data_dir=tmp_path)
        answer = service.client.post("/v1/measure", json=body)
        listed = service.client.get("/v1/measurements").json()
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"][0]
    assert detail["field"] == "device" and "allow_slow_cpu" in detail["msg"]
    assert listed["count"] == 0


def test_hf_config_without_transformers_names_the_install(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    from measure import spec

    monkeypatch.setattr(spec, "transformers_available", lambda: False)
    body = {**BODY, "model": {"hf_config": {"model_type": "llama", "hidden_size": 64}}}
    answer = service.client.post("/v1/measure", json=body)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"][0]
    assert detail["field"] == "model.hf_config" and "pip install" in detail["msg"]


def _nested(depth: int) -> dict[str, Any]:
    body: dict[str, Any] = {"a": 1}
    for _ in range(depth):
        body = {"a": body}
    return body


# (a change to the body, the field the 422 names)
REFUSED = [
    ({"model": {"params": 1000}}, "model"),
    ({"model": {"preset": "no-such-model"}}, "model.preset"),
    ({"engine": "paper"}, "engine"),
    ({"tp": 2}, "tp"),
    ({"mode": "somewhere"}, "mode"),
    ({"device": "tpu"}, "device"),
    ({"steps": 0}, "steps"),
    ({"warmup_steps": 0}, "warmup_steps"),
    ({"seed": -1}, "seed"),
    ({"stages": [1, 1]}, "stages"),
    ({"extra": 1}, "extra"),
    ({"engine_config": {"zero_optimization": {"stage": float("nan")}}}, "engine_config"),
    ({"engine_config": _nested(40)}, "engine_config"),
    ({"model": {"hf_config": {"model_type": "gpt2", "x": _nested(40)}}}, "model.hf_config"),
]


@pytest.mark.parametrize(("change", "field"), REFUSED, ids=[r[1] for r in REFUSED])
def test_bad_requests_are_422_naming_the_field(
    service: Service, change: dict[str, Any], field: str
) -> None:
    body = json.dumps({**BODY, **change})  # NaN written as NaN, as Python's json.loads reads it
    answer = service.client.post(
        "/v1/measure", content=body, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["field"] == field


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/measure/0123abcd", 404),
        ("DELETE", "/v1/measure/0123abcd", 404),
        ("GET", "/v1/measure/" + "x" * 65, 422),
        ("GET", "/v1/measurements?limit=0", 422),
        ("GET", "/v1/measurements?limit=101", 422),
        ("GET", "/v1/measurements?offset=-1", 422),
        ("GET", "/v1/measurements?status=lost", 422),
    ],
)
def test_bad_ids_and_pages(service: Service, method: str, path: str, status: int) -> None:
    assert service.client.request(method, path).status_code == status
