"""Settings from the environment (prefix ``ZEROCALC_``), served through ``get_settings``."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Service settings; every one can be set as ``ZEROCALC_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="ZEROCALC_", extra="ignore")

    data_dir: Path = Field(Path("var"), description="Folder for the SQLite store of measurements.")
    api_key: str | None = Field(None, description="When set, /v1/measure needs X-API-Key.")
    max_body_bytes: int = Field(1_000_000, description="Largest request body accepted.")
    cors_origins: list[str] = Field(default_factory=list, description="Allowed CORS origins.")

    @property
    def db_path(self) -> Path:
        return self.data_dir / "zerocalc.sqlite3"


@lru_cache
def get_settings() -> Settings:
    return Settings()
