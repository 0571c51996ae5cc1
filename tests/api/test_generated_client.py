"""A client generated from /openapi.json by openapi-python-client works against the service.

The client is generated into a temporary folder, imported, and driven in process through httpx's
ASGI transport: every documented example of every POST operation parses into its response type,
every GET answers its type, and every refusal the service answers (400, 401, 403, 404, 405, 413,
415, 422, 429) parses into the generated ``ErrorResponse``. ``/v1/measure`` goes to the tests'
stand-in runner.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx
import pytest

from app.api.examples import EXAMPLES
from app.main import create_app
from tests.api.fakes import fake_runner

GENERATOR = shutil.which("openapi-python-client")
if GENERATOR is None:
    pytest.skip(
        "openapi-python-client is missing (pip install openapi-python-client)",
        allow_module_level=True,
    )

PACKAGE = "zerocalc_generated_client"
API_KEY = "client-key"

# POST path → (generated module, request model)
POSTS = {
    "/v1/memory": ("memory.memory_v1_memory_post", "MemoryRequest", "MemoryResponse"),
    "/v1/memory/sweep": (
        "memory.memory_sweep_v1_memory_sweep_post",
        "MemorySweepRequest",
        "MemorySweepResponse",
    ),
    "/v1/capacity": ("memory.capacity_v1_capacity_post", "CapacityRequest", "CapacityResponse"),
    "/v1/communication": (
        "communication.communication_v1_communication_post",
        "CommunicationRequest",
        "CommunicationResponse",
    ),
    "/v1/inference": (
        "memory.inference_v1_inference_post",
        "InferenceRequest",
        "InferenceResponse",
    ),
    "/v1/measure": ("measure.submit_measure_v1_measure_post", "MeasureRequest", "JobAccepted"),
}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The generated package, importable."""
    folder = tmp_path_factory.mktemp("client")
    doc = folder / "openapi.json"
    doc.write_text(json.dumps(create_app().openapi()))
    run = subprocess.run(
        [str(GENERATOR), "generate", "--path", str(doc), "--output-path", str(folder / PACKAGE)]
        + ["--meta", "none"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Warning" not in run.stdout + run.stderr, run.stdout + run.stderr
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(folder))
        for name in [m for m in sys.modules if m.startswith(PACKAGE)]:
            del sys.modules[name]


def module(package: ModuleType, name: str) -> Any:
    return importlib.import_module(f"{package.__name__}.api.{name}")


def model(package: ModuleType, name: str) -> Any:
    return getattr(importlib.import_module(f"{package.__name__}.models"), name)


async def session(package: ModuleType, check: Any) -> None:
    """Runs ``check(client, raw)`` with the app's lifespan started, jobs on the stand-in."""
    app = create_app()
    with fake_runner(app, api_key=API_KEY, queue_size=2):
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            headers = {"X-API-Key": API_KEY}
            async with httpx.AsyncClient(
                transport=transport, base_url="http://127.0.0.1", headers=headers
            ) as raw:
                client = package.client.Client(base_url="http://127.0.0.1")
                client.set_async_httpx_client(raw)
                await check(client, raw)


def test_every_example_through_the_generated_client(generated: ModuleType) -> None:
    async def check(client: Any, raw: httpx.AsyncClient) -> None:  # noqa: ARG001
        job_ids = []
        for path, (name, request, response) in POSTS.items():
            for key, example in EXAMPLES[path].items():
                body = model(generated, request).from_dict(example["value"])
                answer = await module(generated, name).asyncio_detailed(client=client, body=body)
                assert 200 <= answer.status_code < 300, (path, key, answer.content[:300])
                assert isinstance(answer.parsed, model(generated, response)), (path, key)
                if path == "/v1/measure":
                    job_ids.append(answer.parsed.id)
        gets = {
            "models.presets_v1_presets_get": None,
            "communication.interconnects_v1_interconnects_get": None,
            "health.healthz_healthz_get": None,
            "health.readyz_readyz_get": None,
            "measure.list_measurements_v1_measurements_get": "JobsPublic",
        }
        for name, response in gets.items():
            answer = await module(generated, name).asyncio_detailed(client=client)
            assert answer.status_code == 200, (name, answer.content[:300])
            assert answer.parsed is not None
            if response:
                assert isinstance(answer.parsed, model(generated, response))
        for name in (
            "get_measure_v1_measure_job_id_get",
            "cancel_measure_v1_measure_job_id_delete",
        ):
            answer = await module(generated, f"measure.{name}").asyncio_detailed(
                job_ids[0], client=client
            )
            assert answer.status_code == 200
            assert isinstance(answer.parsed, model(generated, "JobPublic"))

    asyncio.run(session(generated, check))


def test_every_refusal_parses_into_the_generated_error_type(generated: ModuleType) -> None:
    error_type = model(generated, "ErrorResponse")
    problem_type = model(generated, "Problem")

    async def check(client: Any, raw: httpx.AsyncClient) -> None:
        answers: dict[int, httpx.Response] = {}
        memory = module(generated, "memory.memory_v1_memory_post")
        # typed: the generated function parses documented refusals itself
        bad = model(generated, "MemoryRequest").from_dict({"model": {"params": 1}, "dp": 1})
        bad.stages = [7]
        typed = await memory.asyncio_detailed(client=client, body=bad)
        assert typed.status_code == 422 and isinstance(typed.parsed, error_type)
        assert typed.parsed.detail[0].field == "stages.0"
        missing = await module(
            generated, "measure.get_measure_v1_measure_job_id_get"
        ).asyncio_detailed("no-such-job", client=client)
        assert missing.status_code == 404 and isinstance(missing.parsed, error_type)
        # raw: what a generated client cannot send
        answers[400] = await raw.post(
            "/v1/memory",
            content=b"{}",
            headers={"content-length": "x", "content-type": "application/json"},
        )
        answers[401] = await raw.get("/v1/measurements", headers={"X-API-Key": "wrong"})
        answers[405] = await raw.put("/v1/memory", json={})
        answers[413] = await raw.post(
            "/v1/memory", content=b" " * 2_000_000, headers={"content-type": "application/json"}
        )
        answers[415] = await raw.post("/v1/memory", content=b"dp=1")
        answers[422] = await raw.post(
            "/v1/memory",
            content=b'{"dp": 1,\n "model": {]}',
            headers={"content-type": "application/json"},
        )
        small = EXAMPLES["/v1/measure"]["mlp_all_stages"]["value"]
        for _ in range(4):  # a queue of 2: some POST is refused with 429
            answer = await raw.post("/v1/measure", json=small)
            if answer.status_code == 429:
                answers[429] = answer
                break
        assert sorted(answers) == [400, 401, 405, 413, 415, 422, 429]
        for status, answer in answers.items():
            assert answer.status_code == status, (status, answer.text)
            parsed = error_type.from_dict(answer.json())
            assert parsed.detail and all(isinstance(p, problem_type) for p in parsed.detail)
            assert all(p.msg for p in parsed.detail)
        assert "line 2 column 12" in answers[422].json()["detail"][0]["msg"]
        assert "application/json" in answers[415].json()["detail"][0]["msg"]

    asyncio.run(session(generated, check))
    # 403: the same service over the network without a key
    app = create_app()

    async def forbidden() -> httpx.Response:
        with fake_runner(app):
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://10.0.0.5"
                ) as raw:
                    return await raw.get("/v1/measurements")

    answer = asyncio.run(forbidden())
    assert answer.status_code == 403
    parsed = error_type.from_dict(answer.json())
    assert "ZEROCALC_API_KEY" in parsed.detail[0].msg
