"""The answers' JSON: orjson's bytes are pydantic-core's, on every body the figures cover."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from pydantic_core import to_json

from app.api import presenters
from app.api.routes.communication import answer as communication_answer
from app.api.routes.memory import answer
from app.api.routes.sweep import sweep
from app.schemas.communication import CommunicationRequest
from app.schemas.memory import MemoryRequest
from app.schemas.sweep import MemorySweepRequest
from calculators.errors import InputError
from tests.api.test_figures_unchanged import cases


def test_every_answer_encodes_as_pydantic_core_would(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[bytes] = []
    dumps = orjson.dumps

    def checked(body: Any) -> bytes:
        out = dumps(body)
        assert out == to_json(body)
        encoded.append(out)
        return out

    monkeypatch.setattr(presenters.orjson, "dumps", checked)
    for i, (key, body) in enumerate(sorted(cases().items())):
        try:
            if key.startswith("mem/"):
                answer(MemoryRequest(**body))
                if i % 10 == 0:  # the sweeps repeat the memory answers per Nd
                    sweep(MemorySweepRequest(**body))
            else:
                communication_answer(CommunicationRequest(**body))
        except InputError:
            pass
    assert len(encoded) > 1000


def test_integers_past_64_bits_fall_back_to_pydantic_core() -> None:
    body = {"params": 2**70, "notes": ["beyond 64 bits"]}
    with pytest.raises(TypeError):
        orjson.dumps(body)
    assert presenters.encode(body) == to_json(body)
    assert json.loads(presenters.encode(body))["params"] == 2**70
