"""Shared fixtures; the ``gpu`` marker skips where CUDA is not visible."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(
    config: pytest.Config,  # noqa: ARG001 (hook signature)
    items: list[pytest.Item],
) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs CUDA (gpu marker); run on a GPU host")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture
def client() -> Iterator[object]:
    """A TestClient on the real app, lifespan included."""
    from fastapi.testclient import TestClient

    from app.main import app

    with TestClient(app) as c:
        yield c
