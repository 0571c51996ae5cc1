"""Schemathesis against ``/openapi.json``, in process: generated requests never get a 5xx.

Every operation of the schema gets ``EXAMPLES_PER_OPERATION`` generated cases, valid and invalid
(schemathesis' positive and negative modes), more than 1000 in all. ``/v1/measure`` goes to the
job tests' stand-in runner (``tests/api/fakes.py``), so an accepted measurement builds no model.

The application is a private one from ``create_app()``: schemathesis starts its lifespan on first
use and keeps it until told to stop, which must not touch the ``app.main.app`` other tests use.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi as schemathesis_asgi

from app.main import create_app
from tests.api.fakes import fake_runner

EXAMPLES_PER_OPERATION = 110
MIN_CASES = 1000

app = create_app()
schema = schemathesis.openapi.from_dict(app.openapi())
schema.app = app  # calls go through schemathesis' in-process ASGI client
schema.location = "/openapi.json"
OPERATIONS = sum(1 for result in schema.get_all_operations() if result.ok())
calls: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _fake_measure_runner() -> Iterator[None]:
    with fake_runner(app):
        yield
        schemathesis_asgi.shutdown_lifespans()  # the job runner stops before its folder goes


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,  # the same cases on every run: CI failures reproduce
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_generated_requests_get_no_server_error(case: schemathesis.Case) -> None:
    calls.append(case.operation.label)
    case.call_and_validate(checks=[not_a_server_error])


def test_enough_cases_were_generated() -> None:
    """Runs after the generated tests (file order); meaningless when some were deselected."""
    if len(set(calls)) < OPERATIONS:
        pytest.skip("not every operation ran (tests deselected)")
    assert len(calls) >= MIN_CASES, f"{len(calls)} cases over {OPERATIONS} operations"
