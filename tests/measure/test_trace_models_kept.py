"""A traced config's fake model is built once and reused: every trace on it equals a trace on a
model built for it alone, whatever ran on it before, and concurrent traces take turns."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

import pytest

trace = pytest.importorskip("measure.trace", reason="the trace needs torch", exc_type=ImportError)
pytest.importorskip("transformers", reason="install the hf extra: pip install 'zerocalc[hf]'")

from measure.hf_families import family_config  # noqa: E402

# (regime, checkpointing, padded, micro-batch, tokens): each changes what the forward wraps
CALLS = [
    ("half", True, False, 2, 24),
    ("half", False, True, 1, 16),
    ("autocast", True, True, 2, 16),
    ("half", False, False, 2, 24),
]


def _fresh(config: dict[str, Any], call: tuple[str, bool, bool, int, int]) -> dict[str, Any]:
    regime, checkpointing, padded, batch, seq = call
    trace._built.cache_clear()
    return asdict(trace.trace(config, batch, seq, regime, checkpointing, padded=padded))


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen2_moe", "deepseek_v3"])
def test_a_kept_model_traces_as_a_fresh_one(family: str) -> None:
    config = dict(family_config(family, "tiny"))
    expected = [_fresh(config, call) for call in CALLS]
    trace._built.cache_clear()
    for call, want in zip(CALLS + CALLS, expected + expected, strict=True):
        regime, checkpointing, padded, batch, seq = call
        got = trace.trace(config, batch, seq, regime, checkpointing, padded=padded)
        assert asdict(got) == want, call
    # two dtypes (half; autocast builds fp32 parameters): two models, reused from then on
    assert trace._built.cache_info().misses == 2


def test_concurrent_traces_of_one_config_take_turns() -> None:
    config = dict(family_config("llama", "tiny"))
    want = _fresh(config, CALLS[0])
    regime, checkpointing, padded, batch, seq = CALLS[0]
    with ThreadPoolExecutor(4) as pool:
        got = list(
            pool.map(
                lambda _: asdict(trace.trace(config, batch, seq, regime, checkpointing)), range(8)
            )
        )
    assert all(g == want for g in got)
