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
    api_key: str | None = Field(
        None,
        description="When set, the measure endpoints need it in X-API-Key. When not set, they "
        "answer only requests that reach the service on a loopback address (403 otherwise).",
    )
    measure_max_world_size: int = Field(
        8, ge=1, le=65536, description="Largest dp × tp × pp one measure job may ask for."
    )
    measure_max_steps: int = Field(
        120, ge=2, le=10_000, description="Largest steps + warmup_steps of one measure job."
    )
    measure_max_params: int = Field(
        10_000_000_000, ge=1, description="Largest model (parameters) one measure job may build."
    )
    measure_runner: str = Field(
        "measure.runner:run",
        description="module:function that runs one measurement in the job's child process.",
    )
    job_time_limit_s: float = Field(
        1800.0, gt=0, le=86_400, description="Wall-clock limit of one measure job (seconds)."
    )
    queue_size: int = Field(
        8, ge=1, le=1000, description="Measure jobs that may wait; more get 429 with Retry-After."
    )
    max_body_bytes: int = Field(1_000_000, description="Largest request body accepted.")
    cors_origins: list[str] = Field(default_factory=list, description="Allowed CORS origins.")
    max_concurrent_requests: int = Field(
        64, ge=1, description="Requests answered at once; more get 503 with Retry-After."
    )
    busy_retry_after_seconds: int = Field(1, ge=1, description="Retry-After of that 503.")
    preload_trace: bool = Field(
        False,
        description="Import torch and transformers and trace a two-layer config while the "
        "service starts, so that the first activation_model traced request does not pay for "
        "them (bench/trace_cold.py). Off: that request imports them. Ignored without "
        "transformers installed.",
    )

    @property
    def db_path(self) -> Path:
        return self.data_dir / "zerocalc.sqlite3"


@lru_cache
def get_settings() -> Settings:
    return Settings()
