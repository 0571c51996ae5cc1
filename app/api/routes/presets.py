"""GET /v1/presets."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

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
            architecture=asdict(p.architecture),
        )
        for p in PRESETS.values()
    ]
