"""Request counts, latencies and jobs by state, written in the Prometheus text format (0.0.4).

One :class:`Metrics` per application (``app.state.metrics``). The HTTP middleware feeds it; the
job runner plugs in a callable that counts jobs by state (``register_job_counts``), so this
module needs nothing from ``app.jobs``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Latency bucket bounds in seconds: 0.5 ms (a /healthz) to 10 s (a slow sweep), as Prometheus's
# client libraries space them (≈ 1-2.5-5 per decade).
BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

# The job states of the public contract (shared/API.md, GET /v1/measure/{id}).
JOB_STATES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelled")

JobCounts = Callable[[], Mapping[str, int]]


def _escape(value: str) -> str:
    """A label value as the text format writes it: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value))


class _Histogram:
    """Cumulative-on-output latency histogram for one (route, method)."""

    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last slot is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1


class Metrics:
    """In-process counters for one application (one uvicorn worker, one event loop)."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = {}
        self.latency: dict[tuple[str, str], _Histogram] = {}
        self.in_flight = 0
        self.rejected: dict[str, int] = {}
        self._job_counts: JobCounts | None = None

    def register_job_counts(self, counts: JobCounts | None) -> None:
        """Plug in the job runner's ``state -> count`` view (``None`` unplugs it)."""
        self._job_counts = counts

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one answered request and its latency."""
        key = (route, method, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        hist = self.latency.get((route, method))
        if hist is None:
            hist = self.latency[(route, method)] = _Histogram()
        hist.observe(seconds)

    def reject(self, reason: str) -> None:
        """Count a request refused before it reached a route (``too_large``, ``busy``)."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def job_counts(self) -> dict[str, int] | None:
        """Jobs by state from the registered source; ``None`` when no runner is plugged in."""
        if self._job_counts is None:
            return None
        counts = dict.fromkeys(JOB_STATES, 0)
        for state, n in self._job_counts().items():
            counts[str(state)] = int(n)
        return counts

    def render(self) -> str:
        """Everything, in the Prometheus text exposition format."""
        lines = [
            "# HELP zerocalc_http_requests_total HTTP requests answered, by route template, "
            "method and status.",
            "# TYPE zerocalc_http_requests_total counter",
        ]
        for (route, method, status), n in sorted(self.requests.items()):
            lines.append(
                f'zerocalc_http_requests_total{{route="{_escape(route)}",method="{method}",'
                f'status="{status}"}} {n}'
            )
        lines += [
            "# HELP zerocalc_http_request_duration_seconds Time from the request's arrival to "
            "the end of its answer, by route template and method.",
            "# TYPE zerocalc_http_request_duration_seconds histogram",
        ]
        for (route, method), hist in sorted(self.latency.items()):
            labels = f'route="{_escape(route)}",method="{method}"'
            cumulative = 0
            for le, n in zip((*map(_number, BUCKETS), "+Inf"), hist.counts, strict=True):
                cumulative += n
                lines.append(
                    f'zerocalc_http_request_duration_seconds_bucket{{{labels},le="{le}"}} '
                    f"{cumulative}"
                )
            lines.append(
                f"zerocalc_http_request_duration_seconds_sum{{{labels}}} {_number(hist.total)}"
            )
            lines.append(f"zerocalc_http_request_duration_seconds_count{{{labels}}} {hist.count}")
        lines += [
            "# HELP zerocalc_http_requests_in_flight Requests being answered now.",
            "# TYPE zerocalc_http_requests_in_flight gauge",
            f"zerocalc_http_requests_in_flight {self.in_flight}",
            "# HELP zerocalc_http_requests_rejected_total Requests refused before routing "
            "(too_large: body over the cap; busy: over the concurrency limit).",
            "# TYPE zerocalc_http_requests_rejected_total counter",
        ]
        for reason in sorted({"too_large", "busy", *self.rejected}):
            lines.append(
                f'zerocalc_http_requests_rejected_total{{reason="{_escape(reason)}"}} '
                f"{self.rejected.get(reason, 0)}"
            )
        jobs = self.job_counts()
        if jobs is not None:
            lines += [
                "# HELP zerocalc_jobs Measurement jobs by state.",
                "# TYPE zerocalc_jobs gauge",
            ]
            for state, n in sorted(jobs.items()):
                lines.append(f'zerocalc_jobs{{state="{_escape(state)}"}} {n}')
        return "\n".join(lines) + "\n"
