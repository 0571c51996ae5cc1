"""Dependencies as ``Annotated`` aliases, so route signatures read as sentences."""

from __future__ import annotations

import hmac
import ipaddress
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security, status
from fastapi.exceptions import RequestValidationError
from fastapi.security import APIKeyHeader

from app.api.convert import resolve_model
from app.core.config import Settings, get_settings
from app.core.errors import LimitError
from app.jobs.runner import JobManager
from app.schemas.measure import MeasureRequest
from measure.mlp_presets import mlp_preset

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
    description="The measure endpoints run GPU jobs: they need this key when the service has "
    "ZEROCALC_API_KEY set, and are refused (403) over the network when it has none.",
)


def arrived_on_loopback(request: Request) -> bool:
    """Whether the request reached the service on a loopback address (so came from this host).

    The ASGI ``server`` is the address the connection was accepted on: a service bound to
    127.0.0.1 only ever sees loopback; one bound to 0.0.0.0 sees its network address for
    requests from other hosts. A Unix socket (or an in-process client) has no IP address and
    is local too.
    """
    server = request.scope.get("server")
    host = server[0] if server else None
    try:
        address = ipaddress.ip_address(str(host).strip("[]"))
    except ValueError:
        return True
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def require_api_key(
    request: Request,
    settings: SettingsDep,
    given: Annotated[str | None, Security(_api_key_header)],
) -> None:
    """401 unless the key matches (compared in constant time); with no key configured, 403 for
    requests from other hosts: a service on a network address never runs GPU jobs for anyone."""
    if not settings.api_key:
        if arrived_on_loopback(request):
            return
        raise HTTPException(
            status_code=status.HTTP_403_FORBIDDEN,
            detail=[
                {
                    "loc": ["header", API_KEY_HEADER],
                    "field": API_KEY_HEADER,
                    "msg": "this service runs GPU jobs only for its own host until "
                    "ZEROCALC_API_KEY is set; set it and send the key in X-API-Key",
                    "type": "forbidden",
                }
            ],
        )
    if given is None or not hmac.compare_digest(
        given.encode("utf-8"), settings.api_key.encode("utf-8")
    ):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail=[
                {
                    "loc": ["header", API_KEY_HEADER],
                    "field": API_KEY_HEADER,
                    "msg": f"missing or wrong {API_KEY_HEADER} header",
                    "type": "unauthorized",
                }
            ],
            headers={"WWW-Authenticate": "ApiKey"},
        )


ApiKeyDep = Depends(require_api_key)


def check_measure_limits(req: MeasureRequest, settings: Settings) -> None:
    """422 (``type: limit``) naming the setting when a measure job asks more than it allows."""
    world = req.dp * req.tp * req.pp
    if world > settings.measure_max_world_size:
        raise LimitError(
            "dp",
            f"dp × tp × pp = {world} is over this service's limit of "
            f"{settings.measure_max_world_size} (ZEROCALC_MEASURE_MAX_WORLD_SIZE)",
        )
    steps = req.steps + req.warmup_steps
    if steps > settings.measure_max_steps:
        raise LimitError(
            "steps",
            f"steps + warmup_steps = {steps} is over this service's limit of "
            f"{settings.measure_max_steps} (ZEROCALC_MEASURE_MAX_STEPS)",
        )
    params = measured_params(req)
    if params > settings.measure_max_params:
        raise LimitError(
            "model",
            f"the model has {params:,} parameters, over this service's limit of "
            f"{settings.measure_max_params:,} (ZEROCALC_MEASURE_MAX_PARAMS)",
        )


def measured_params(req: MeasureRequest) -> int:
    """Parameters of the model a measure job builds (measure's MLP presets included)."""
    mlp = mlp_preset(req.model.preset) if req.model.preset is not None else None
    if mlp is not None:
        return mlp.layers * mlp.hidden * (mlp.hidden + 1)  # Linear(h, h) with bias, per layer
    params, _ = resolve_model(req.model)
    return params


async def reject_unknown_query(request: Request) -> None:
    """422 for a query parameter the operation does not take, as bodies refuse unknown fields
    (async: on the event loop, so no request waits for a worker thread to pass this check)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.query_params:
        return
    if not getattr(route, "include_in_schema", False):
        return
    known = {p.alias for p in dependant.query_params}
    for name in request.query_params:
        if name not in known:
            raise RequestValidationError(
                [
                    {
                        "type": "extra_forbidden",
                        "loc": ("query", name),
                        "msg": "this operation takes no such query parameter",
                    }
                ]
            )
