"""GET /v1/presets."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from calculators.architecture import count_active_params
from calculators.presets import PRESETS

router = APIRouter(prefix="/v1", tags=["models"])


class PresetPublic(BaseModel):
    name: str
    params: int
    active_params: int
    published_params: int
    source: str
    note: str
    architecture: dict[str, Any]
    family: str | None = Field(
        None,
        description="The transformers model_type whose modelling code sets activations and peak "
        "(null: the canonical GPT decoder).",
    )


@router.get("/presets", response_model=list[PresetPublic])
def presets() -> list[PresetPublic]:
    """Bundled models with their derived and published parameter counts."""
    from dataclasses import asdict

    return [
        PresetPublic(
            name=p.name,
            params=p.params,
            active_params=count_active_params(p.architecture),
            published_params=p.published_params,
            source=p.source,
            note=p.note,
            architecture={k: v for k, v in asdict(p.architecture).items() if k != "modelling"},
            family=None if p.architecture.modelling is None else p.architecture.modelling.family,
        )
        for p in PRESETS.values()
    ]
