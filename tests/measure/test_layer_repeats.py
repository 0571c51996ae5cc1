"""Decoder layers played from an earlier layer's recipe count what running them counts.

``measure.trace.trace`` plays every layer that repeats an earlier one (``measure/layer_repeats``)
instead of running it under fake tensors. For a small config of every supported family, with
layers enough to repeat (and Gemma 3's sliding and full layers interleaved), every figure the
trace reports (saved bytes in total and per layer, weight copies, RNG state, logits, the loss's
transients, the key/value cache) equals the trace that runs every layer, in each dtype regime,
with and without transformers' gradient checkpointing.
"""

from __future__ import annotations

from typing import Any

import pytest

trace = pytest.importorskip("measure.trace", reason="the trace needs torch", exc_type=ImportError)
pytest.importorskip("transformers", reason="install the hf extra: pip install 'zerocalc[hf]'")

from tests.calculators.test_transformers_activations import CONFIGS, _config  # noqa: E402

LAYERS = 5
FIELDS = (
    "activations",
    "autocast_weights",
    "rng_state",
    "logits",
    "loss_transient",
    "cache",
    "cache_only",
    "by_layer",
)


def _deep(family: str) -> dict[str, Any]:
    config = {**_config(family), "num_hidden_layers": LAYERS}
    if "layer_types" in config:
        config["layer_types"] = [
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
        ]
    if "no_rope_layers" in config:  # NoPE layers between rotary ones
        config["no_rope_layers"] = [1, 0, 1, 1, 0]
    return config


def _figures(result: Any) -> dict[str, Any]:
    return {name: getattr(result, name) for name in FIELDS}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["none", "full"])
@pytest.mark.parametrize("regime", trace.REGIMES)
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_played_layers_count_what_running_them_counts(
    family: str, regime: str, checkpointing: bool
) -> None:
    config = _deep(family)
    ran = trace.trace(config, 2, 24, regime, checkpointing, play_repeats=False)
    played = trace.trace(config, 2, 24, regime, checkpointing)
    assert ran.played_layers == 0
    assert played.played_layers >= 1
    assert _figures(played) == _figures(ran)
    assert sorted(played.tensors) == sorted(ran.tensors)


def test_a_layer_with_output_hooks_runs() -> None:
    """Transformers' output capturing (``output_hidden_states``) hooks the layers: what a hook
    keeps is not in a recipe, so every layer runs."""
    config = {**_deep("llama"), "output_hidden_states": True}
    ran = trace.trace(config, 2, 24, "half", play_repeats=False)
    played = trace.trace(config, 2, 24, "half")
    assert played.played_layers == 0
    assert _figures(played) == _figures(ran)
