"""Dependencies as ``Annotated`` aliases, so route signatures read as sentences."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security, status
from fastapi.security import APIKeyHeader

from app.core.config import Settings, get_settings
from app.jobs.runner import JobManager

SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_jobs(request: Request) -> JobManager:
    """The job manager the lifespan started."""
    jobs: JobManager = request.app.state.jobs
    return jobs


JobsDep = Annotated[JobManager, Depends(get_jobs)]

API_KEY_HEADER = "X-API-Key"
_api_key_header = APIKeyHeader(
    name=API_KEY_HEADER,
    auto_error=False,
    description="Needed on the measure endpoints when the service has ZEROCALC_API_KEY set.",
)


def require_api_key(
    settings: SettingsDep, given: Annotated[str | None, Security(_api_key_header)]
) -> None:
    """401 unless the key matches (compared in constant time) or no key is configured."""
    if not settings.api_key:
        return
    if given is None or not hmac.compare_digest(
        given.encode("utf-8"), settings.api_key.encode("utf-8")
    ):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail=[
                {
                    "field": API_KEY_HEADER,
                    "msg": f"missing or wrong {API_KEY_HEADER} header",
                    "type": "unauthorized",
                }
            ],
            headers={"WWW-Authenticate": "ApiKey"},
        )


ApiKeyDep = Depends(require_api_key)
