"""The OpenAPI document: every status code the service answers, with one error schema.

Routes declare what they answer on success; the refusals that come from the layers around them
(the middleware, the validation and error handlers, the API-key check) are the same for every
operation, so they are documented here, once, from what each operation takes: a body, parameters,
a job id, the measure key. ``/v1/measure`` also gets its stateful links (the id that POST answers
→ GET and DELETE of that job), which fuzzers and generated clients follow.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.api.examples import EXAMPLES
from app.core.errors import JSON_HINT
from app.core.middleware import UNLIMITED_PATHS
from app.schemas.common import ErrorResponse

ERROR_REF = "#/components/schemas/ErrorResponse"

# What each refusal means, as the document says it.
REFUSALS: dict[int, str] = {
    400: "The request is malformed (a Content-Length that is not a number).",
    401: "The service has ZEROCALC_API_KEY set and X-API-Key is missing or wrong.",
    403: "The request came over the network (not loopback) and the service has no "
    "ZEROCALC_API_KEY: measurements run real GPU jobs, so they need a key there.",
    404: "No measure job with this id.",
    413: "The request body is larger than ZEROCALC_MAX_BODY_BYTES.",
    415: f"The body is not JSON: {JSON_HINT}.",
    422: "The request does not fit its schema (`type` as pydantic names it; a query parameter "
    "the operation does not take is `extra_forbidden`), is not valid JSON "
    "(`json_invalid`, with line and column), breaks a rule between values that the schema "
    "cannot state (`rule`), or asks more than this service allows (`limit`). `field` names "
    "the value.",
    429: "The measure queue is full; retry after Retry-After seconds.",
    503: "The service is answering ZEROCALC_MAX_CONCURRENT_REQUESTS requests; retry after "
    "Retry-After seconds.",
}

RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again.",
        "schema": {"type": "integer"},
    }
}

MEASURE_LINKS = {
    "GetMeasureJob": {
        "operationId": "get_measure_v1_measure__job_id__get",
        "parameters": {"job_id": "$response.body#/id"},
        "description": "The job this POST queued: its status, progress and result.",
    },
    "CancelMeasureJob": {
        "operationId": "cancel_measure_v1_measure__job_id__delete",
        "parameters": {"job_id": "$response.body#/id"},
        "description": "Cancel the job this POST queued.",
    },
}


def refusals(path: str, method: str, operation: dict[str, Any]) -> list[int]:
    """The error statuses one operation can answer."""
    codes = [400, 413, 422]  # 422: every operation refuses query parameters it does not take
    if path not in UNLIMITED_PATHS:
        codes.append(503)
    if "requestBody" in operation:
        codes.append(415)
    if operation.get("security"):
        codes += [401, 403]
    if any(p.get("in") == "path" for p in operation.get("parameters", ())):
        codes.append(404)
    if path == "/v1/measure" and method == "post":
        codes.append(429)
    return sorted(set(codes))


def document(app: FastAPI) -> dict[str, Any]:
    """The document ``/openapi.json`` serves (built once)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        openapi_version=app.openapi_version,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
        servers=app.servers,
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    error_schema = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(error_schema.pop("$defs", {}))
    schemas["ErrorResponse"] = error_schema
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    # the free-form hf_config object by name: client generators make one type of it, not one
    # per place the model appears
    for form in schemas.get("ModelSpec", {}).get("oneOf", ()):
        if form["required"] == ["hf_config"]:
            schemas["HfConfig"] = form["properties"]["hf_config"]
            form["properties"]["hf_config"] = {"$ref": "#/components/schemas/HfConfig"}
    for path, operations in doc.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for code in refusals(path, method, operation):
                answer = responses.setdefault(str(code), {})
                answer["description"] = REFUSALS[code]
                answer["content"] = {"application/json": {"schema": {"$ref": ERROR_REF}}}
                if code in (429, 503):
                    answer["headers"] = RETRY_AFTER
            for code, answer in responses.items():  # a route's own refusals (e.g. a 404 of its)
                if code >= "400":
                    answer["content"] = {"application/json": {"schema": {"$ref": ERROR_REF}}}
            if method == "post":
                content = operation["requestBody"]["content"]["application/json"]
                content["examples"] = EXAMPLES[path]
            if path == "/v1/measure" and method == "post":
                accepted = responses["202"]
                accepted["links"] = MEASURE_LINKS
                accepted["headers"] = {
                    "Location": {
                        "description": "The job's URL: GET it to poll, DELETE it to cancel.",
                        "schema": {"type": "string"},
                    }
                }
    app.openapi_schema = doc
    return doc


def install(app: FastAPI) -> None:
    app.openapi = lambda: document(app)  # type: ignore[method-assign]
