"""The settings override that routes ``/v1/measure`` to a stand-in runner.

The job manager reads its settings from ``app.dependency_overrides[get_settings]`` when the
lifespan starts (``app/main.py``), and ``POST /v1/measure`` takes ``measure_runner`` from the
same dependency: overriding it before ``TestClient`` enters sends every job to the stand-in in
a temporary data folder, so tests that post valid measure bodies never build a model.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from app.core.config import Settings, get_settings

# The job tests' stand-in (tests/api/fake_runner.py): answers at once, measuring nothing.
FAKE_RUNNER = "tests.api.fake_runner:succeed"


@contextmanager
def fake_runner(app: FastAPI | None = None, **overrides: Any) -> Iterator[Settings]:
    """Settings with the fake runner and a throw-away data folder, installed on ``app``."""
    if app is None:
        from app.main import app as default_app

        app = default_app
    with tempfile.TemporaryDirectory(prefix="zerocalc-test-") as tmp:
        settings = Settings(
            data_dir=Path(tmp), measure_runner=FAKE_RUNNER, job_time_limit_s=30.0, **overrides
        )
        previous = app.dependency_overrides.get(get_settings)
        app.dependency_overrides[get_settings] = lambda: settings
        try:
            yield settings
        finally:
            if previous is None:
                app.dependency_overrides.pop(get_settings, None)
            else:
                app.dependency_overrides[get_settings] = previous
