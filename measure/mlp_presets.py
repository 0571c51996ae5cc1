"""The MLP presets by name (``mlp``, ``mlp-{L}x{h}``), without torch: the service checks names
with it up front."""

from __future__ import annotations

import re
from dataclasses import dataclass

from calculators.errors import InputError

# The reference MLP: 12 x Linear(2048, 2048) + ReLU, batch 32 (``mlp`` = ``mlp-12x2048``).
REFERENCE_MLP_LAYERS = 12
REFERENCE_MLP_HIDDEN = 2048
REFERENCE_MLP_BATCH = 32
MLP_ALIASES = ("mlp",)
_MLP_PRESET = re.compile(r"^mlp-(\d+)x(\d+)$")


@dataclass(frozen=True)
class MLPSpec:
    """``layers`` x (Linear(hidden, hidden) + ReLU) trained on ``batch`` random rows."""

    layers: int = REFERENCE_MLP_LAYERS
    hidden: int = REFERENCE_MLP_HIDDEN
    batch: int = REFERENCE_MLP_BATCH


def mlp_preset(name: str) -> MLPSpec | None:
    """``mlp`` (12 x 2048) or ``mlp-{L}x{h}``; ``None`` for other names."""
    if name in MLP_ALIASES:
        return MLPSpec()
    match = _MLP_PRESET.match(name)
    if match is None:
        return None
    layers, hidden = int(match.group(1)), int(match.group(2))
    if not (1 <= layers <= 1024 and 1 <= hidden <= 65536):
        raise InputError("model.preset", f"{name!r}: layers in 1..1024, hidden in 1..65536")
    return MLPSpec(layers, hidden)
