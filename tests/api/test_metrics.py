"""GET /metrics: Prometheus text with request counts, latency histograms and jobs by state."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from app.core.metrics import BUCKETS, CONTENT_TYPE, Metrics
from app.main import create_app

# One sample line of the text format: name, optional {labels}, value.
SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_]+="([^"\\]|\\.)*",?)*\})? \S+$')


def samples(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) \S+ .+$", line), line
            continue
        assert SAMPLE.match(line), line
        key, value = line.rsplit(" ", 1)
        found[key] = float(value)
    return found


def test_requests_are_counted_by_route_template_and_status() -> None:
    with TestClient(create_app()) as client:
        for _ in range(3):
            assert client.post("/v1/memory", json={"model": {"params": 10**9}, "dp": 8}).is_success
        client.post("/v1/memory", json={"dp": 0})
        client.get("/no/such/page")
        response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE
    found = samples(response.text)
    assert found['zerocalc_http_requests_total{route="/v1/memory",method="POST",status="200"}'] == 3
    assert found['zerocalc_http_requests_total{route="/v1/memory",method="POST",status="422"}'] == 1
    assert found['zerocalc_http_requests_total{route="<unrouted>",method="GET",status="404"}'] == 1
    count = found['zerocalc_http_request_duration_seconds_count{route="/v1/memory",method="POST"}']
    inf = (
        'zerocalc_http_request_duration_seconds_bucket{route="/v1/memory",method="POST",le="+Inf"}'
    )
    assert count == found[inf] == 4
    assert found['zerocalc_http_request_duration_seconds_sum{route="/v1/memory",method="POST"}'] > 0


def test_histogram_buckets_are_cumulative() -> None:
    metrics = Metrics()
    for seconds in (0.0001, 0.0005, 0.003, 0.003, 20.0):
        metrics.observe("/x", "GET", 200, seconds)
    found = samples(metrics.render())
    bucket = 'zerocalc_http_request_duration_seconds_bucket{{route="/x",method="GET",le="{}"}}'
    assert found[bucket.format("0.0005")] == 2  # le is inclusive
    assert found[bucket.format("0.0025")] == 2
    assert found[bucket.format("0.005")] == 4
    assert found[bucket.format(repr(BUCKETS[-1]))] == 4
    assert found[bucket.format("+Inf")] == 5


def test_jobs_by_state_come_from_the_registered_source() -> None:
    metrics = Metrics()
    assert "zerocalc_jobs" not in metrics.render()  # no runner plugged in: no job figures
    metrics.register_job_counts(lambda: {"running": 1, "succeeded": 4})
    found = samples(metrics.render())
    assert found['zerocalc_jobs{state="running"}'] == 1
    assert found['zerocalc_jobs{state="succeeded"}'] == 4
    assert found['zerocalc_jobs{state="queued"}'] == 0
    assert found['zerocalc_jobs{state="cancelled"}'] == 0


def test_the_service_plugs_in_its_job_runner() -> None:
    with TestClient(create_app()) as client:
        found = samples(client.get("/metrics").text)
    assert {
        f'zerocalc_jobs{{state="{s}"}}'
        for s in ("queued", "running", "succeeded", "failed", "cancelled")
    } <= set(found)


def test_label_values_are_escaped() -> None:
    metrics = Metrics()
    metrics.observe('/a"b\\c\nd', "GET", 200, 0.001)
    samples(metrics.render())  # every line still parses
    assert 'route="/a\\"b\\\\c\\nd"' in metrics.render()


def test_invented_methods_are_counted_as_other_and_probes_are_counted() -> None:
    with TestClient(create_app()) as client:
        client.request("BREW", "/v1/memory")
        assert client.get("/healthz").status_code == 200
        found = samples(client.get("/metrics").text)
    assert (
        found['zerocalc_http_requests_total{route="/v1/memory",method="OTHER",status="405"}'] == 1
    )
    assert found['zerocalc_http_requests_total{route="/healthz",method="GET",status="200"}'] == 1
    assert found["zerocalc_http_requests_in_flight"] == 1  # the /metrics request itself
