"""A corpus of malformed bodies against every POST endpoint: each gets a readable 4xx, none a 5xx.

The endpoints are read from ``app.openapi()`` when the tests are collected, so an endpoint added
later is covered without touching this file. Each endpoint's request examples (the ones Swagger
shows) are the valid bodies the corpus mutates; every mutation makes the body invalid, so each
must be refused with 4xx and a reason, and the service must answer normally afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import app
from tests.api.fakes import fake_runner

OPENAPI = app.openapi()
POST_PATHS = sorted(
    path for path, ops in OPENAPI["paths"].items() if "post" in ops and "{" not in path
)
# For an endpoint without examples: a small GPT every training question accepts (a measure
# needs an architecture, not a bare parameter count).
FALLBACK_BODY: dict[str, Any] = {
    "model": {
        "architecture": {
            "layers": 2,
            "hidden": 256,
            "heads": 4,
            "vocab_size": 1000,
            "max_seq_len": 128,
        }
    },
    "dp": 4,
}

# json.dumps cannot write these; they go into the raw text (Python's json.loads reads the first
# three; 1e400 overflows to inf).
NAN, INF, NEG_INF, OVERFLOW = "NaN", "Infinity", "-Infinity", "1e400"
DIGITS_5000 = "9" * 5000  # above CPython's 4300-digit int limit: the parser itself refuses it
DIGITS_4000 = "9" * 4000  # parses, then must fail a bound
DEEP = 100_000


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes | Iterator[bytes]
    content_type: str = "application/json"


def resolve(schema: dict[str, Any]) -> dict[str, Any]:
    """Follow ``$ref`` and take the non-null branch of ``anyOf``."""
    while True:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            schema = OPENAPI["components"]["schemas"][name]
        elif "anyOf" in schema:
            branches = [s for s in schema["anyOf"] if s.get("type") != "null"]
            if len(branches) != 1:
                return schema
            schema = branches[0]
        else:
            return schema


def request_schema(path: str) -> dict[str, Any]:
    content = OPENAPI["paths"][path]["post"].get("requestBody", {}).get("content", {})
    return resolve(content.get("application/json", {}).get("schema", {}))


def examples(path: str) -> list[dict[str, Any]]:
    """The endpoint's documented request bodies (valid by construction)."""
    content = OPENAPI["paths"][path]["post"].get("requestBody", {}).get("content", {})
    found = [
        e["value"]
        for e in content.get("application/json", {}).get("examples", {}).values()
        if isinstance(e.get("value"), dict)
    ]
    return found or [FALLBACK_BODY]


def sub_schema(schema: dict[str, Any], keys: tuple[str | int, ...]) -> dict[str, Any]:
    for key in keys:
        schema = resolve(schema)
        if isinstance(key, int):
            schema = schema.get("items", {})
        else:
            schema = schema.get("properties", {}).get(key, {})
    return resolve(schema)


def leaves(value: Any, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Paths of every scalar in a JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, (*prefix, i))
    elif value is not None:
        yield prefix


MARKER = "\u0000MUTATION\u0000"


def with_raw(body: dict[str, Any], keys: tuple[str | int, ...], raw: str) -> bytes:
    """``body`` with the value at ``keys`` replaced by raw JSON text (which may be invalid)."""
    copy = json.loads(json.dumps(body))
    target = copy
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = MARKER
    return json.dumps(copy).replace(json.dumps(MARKER), raw).encode()


def field_cases(path: str) -> list[Case]:
    """Every scalar of every example replaced by values no schema may accept there."""
    schema = request_schema(path)
    cases = []
    for n, body in enumerate(examples(path)):
        for keys in leaves(body):
            where = ".".join(map(str, keys))
            bad = {
                "nan": NAN,
                "inf": INF,
                "-inf": NEG_INF,
                "1e400": OVERFLOW,
                "-1e400": "-1e400",
                "5000_digits": DIGITS_5000,
                "-5000_digits": "-" + DIGITS_5000,
                "4000_digits": DIGITS_4000,
                "-4000_digits": "-" + DIGITS_4000,
                "word": '"twelve"',
                "list": "[]",
                "object": "{}",
                "deep_list": "[" * DEEP + "]" * DEEP,
            }
            field = sub_schema(schema, keys)
            if field.get("type") == "integer":
                bad |= {"bool_for_int": "true", "numeric_string": '"8"'}
            if field.get("type") in ("integer", "number"):
                if field.get("minimum", float("-inf")) >= 1:
                    bad |= {"zero": "0", "negative": "-1"}
                elif field.get("minimum", float("-inf")) >= 0:
                    bad |= {"negative": "-1"}
            if "enum" in field:
                bad |= {"unknown_choice": '"no-such-choice"'}
            if field.get("type") == "string" and "enum" not in field:
                bad |= {"too_long": json.dumps("x" * 100_000)}
            cases += [
                Case(f"example{n}.{where}={name}", with_raw(body, keys, raw))
                for name, raw in bad.items()
            ]
    return cases


def body_cases(path: str) -> list[Case]:
    """Whole-body and structural mutations."""
    schema = request_schema(path)
    base = examples(path)[0]
    props = schema.get("properties", {})
    five_mb = json.dumps({**base, "padding": "x" * 5_000_000}).encode()
    cases = [
        Case("not_json", b"this is not json"),
        Case("truncated_json", json.dumps(base).encode()[:-3]),
        Case("form_encoded", b"dp=8&model=x", "application/x-www-form-urlencoded"),
        Case("non_utf8_bytes", b"\xff\xfe\xfa\x80\x81" * 64),
        Case("non_utf8_in_string", b'{"model": {"preset": "\xff\xfe\xfa"}, "dp": 8}'),
        Case("empty", b""),
        Case("null", b"null"),
        Case("top_level_array", b"[]"),
        Case("top_level_string", b'"memory"'),
        Case("top_level_number", b"42"),
        Case("top_level_nan", NAN.encode()),
        Case("top_level_5000_digits", DIGITS_5000.encode()),
        Case("deep_array_100000", b"[" * DEEP + b"]" * DEEP),
        Case("deep_object_100000", b'{"a":' * DEEP + b"1" + b"}" * DEEP),
        Case("five_mb", five_mb),
        Case("five_mb_chunked", (five_mb[i : i + 65536] for i in range(0, len(five_mb), 65536))),
        Case("unknown_field", json.dumps({**base, "no_such_field": 1}).encode()),
        Case("missing_everything", b"{}"),
    ]
    for key, prop in props.items():
        prop = resolve(prop)
        cases.append(
            Case(
                f"{key}=deep_object_100000",
                with_raw(base, (key,), '{"a":' * DEEP + "1" + "}" * DEEP),
            )
        )
        if prop.get("type") == "array":
            item = resolve(prop.get("items", {}))
            filler = json.dumps(base.get(key, [item.get("minimum", 0)])[:1] or [0])[1:-1] or "0"
            cases.append(
                Case(
                    f"{key}=100000_items",
                    with_raw(base, (key,), "[" + ",".join([filler] * 100_000) + "]"),
                )
            )
        if prop.get("type") == "object" and prop.get("additionalProperties") is True:
            # Free-form objects (a DeepSpeed config, an HF config.json) reach the core as parsed:
            # nesting the parser accepts must still be refused or ignored, never a crash.
            nested = '{"a":' * 500 + "1" + "}" * 500
            cases.append(Case(f"{key}=nested_500", with_raw(base, (key,), nested)))
            cases.append(Case(f"{key}=nan_values", with_raw(base, (key,), '{"a": NaN}')))
    if "model" in props:
        model_cases = {
            "unknown_preset": '{"preset": "no-such-model"}',
            "two_models": '{"params": 1000, "preset": "gpt2"}',
            "no_model": "{}",
            "unknown_model_field": '{"params": 1000, "weights": "x"}',
            "hf_config_empty": '{"hf_config": {}}',
            "hf_config_nan": '{"hf_config": {"model_type": "llama", "hidden_size": NaN, '
            '"num_hidden_layers": 2, "num_attention_heads": 2, '
            '"vocab_size": 10, "intermediate_size": 8}}',
            "hf_config_huge": '{"hf_config": {"model_type": "llama", "hidden_size": 1e400, '
            '"num_hidden_layers": ' + DIGITS_4000 + ", "
            '"num_attention_heads": -1, "vocab_size": 0, '
            '"intermediate_size": "eight"}}',
            "hf_config_wrong_types": '{"hf_config": {"model_type": ["llama"], '
            '"hidden_size": {"a": 1}, "num_hidden_layers": "2"}}',
            "architecture_zero": '{"architecture": {"layers": 0, "hidden": 0, "heads": 0, '
            '"vocab_size": 0}}',
            "architecture_negative": '{"architecture": {"layers": -1, "hidden": -8, '
            '"heads": -1, "vocab_size": -1}}',
            "architecture_heads_not_dividing": '{"architecture": {"layers": 2, "hidden": 10, '
            '"heads": 3, "vocab_size": 10}}',
        }
        cases += [
            Case(f"model.{name}", with_raw(base, ("model",), raw))
            for name, raw in model_cases.items()
        ]
    return cases


# Cases the service does not refuse yet, each with what it does instead and the fix; the
# matching test is a strict xfail, so it fails (XPASS) once the gap is closed: then delete the
# entry. Keys match the end of a case name.
def readable_reason(response: Any) -> str:
    """The refusal's reason as a person reads it (``detail`` as a string or a list of msgs)."""
    detail = response.json()["detail"]
    if isinstance(detail, str):
        return detail
    return "; ".join(f"{d.get('field', '')}: {d['msg']}" for d in detail)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with fake_runner(), TestClient(app, raise_server_exceptions=False) as c:
        yield c


def assert_refused(client: TestClient, path: str, cases: list[Case]) -> None:
    """Each case answered 4xx with a JSON reason, and the service still alive after them."""
    failures = []
    for case in cases:
        response = client.post(path, content=case.body, headers={"content-type": case.content_type})
        if not 400 <= response.status_code < 500:
            failures.append(f"{case.name}: {response.status_code} {response.text[:200]}")
            continue
        try:
            reason = readable_reason(response)
        except (ValueError, KeyError, TypeError):
            failures.append(
                f"{case.name}: {response.status_code} without a JSON reason: {response.text[:200]}"
            )
            continue
        if not reason.strip() or len(reason) > 10_000:
            failures.append(f"{case.name}: unreadable reason {reason[:200]!r}")
    assert not failures, f"{len(failures)} of {len(cases)} not refused cleanly:\n" + "\n".join(
        failures[:40]
    )
    assert client.get("/healthz").status_code == 200


def test_corpus_covers_every_post_endpoint() -> None:
    assert {"/v1/memory", "/v1/capacity"} <= set(POST_PATHS)


@pytest.mark.parametrize("path", POST_PATHS)
def test_examples_are_valid(client: TestClient, path: str) -> None:
    """The corpus mutates valid bodies: each example must itself be accepted."""
    for body in examples(path):
        response = client.post(path, json=body)
        assert response.status_code < 300, (body, response.text[:300])


@pytest.mark.parametrize("path", POST_PATHS)
def test_malformed_bodies_get_a_readable_4xx(client: TestClient, path: str) -> None:
    assert_refused(client, path, body_cases(path))


@pytest.mark.parametrize("path", POST_PATHS)
def test_bad_field_values_get_a_readable_4xx(client: TestClient, path: str) -> None:
    assert_refused(client, path, field_cases(path))


def test_service_answers_normally_afterwards(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    response = client.post("/v1/memory", json={"model": {"params": 7_500_000_000}, "dp": 64})
    assert response.status_code == 200
    assert response.json()["stages"][0]["per_device"]["model_states"] == 120_000_000_000
