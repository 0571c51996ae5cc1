"""The ``preload_trace`` setting: what ``activation_model: traced`` needs, loaded at startup."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.api import convert
from app.main import app
from tests.api.fakes import fake_runner


def test_startup_preloads_the_trace_only_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr("app.main.preload_trace", lambda: calls.append(True) or True)
    with fake_runner(app), TestClient(app):
        pass
    assert calls == []
    with fake_runner(app, preload_trace=True), TestClient(app):
        pass
    assert calls == [True]


def test_preload_traces_a_config_and_keeps_it() -> None:
    trace = pytest.importorskip("measure.trace", exc_type=ImportError)
    pytest.importorskip("transformers")
    trace._kept_trace.cache_clear()
    assert convert.preload_trace()
    assert trace._kept_trace.cache_info().currsize == 1


def test_without_transformers_preload_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = pytest.importorskip("measure.trace", exc_type=ImportError)
    monkeypatch.setattr(trace, "transformers_available", lambda: False)
    assert not convert.preload_trace()
