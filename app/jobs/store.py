"""Jobs in SQLite (stdlib ``sqlite3``, WAL): one transaction per state change, so a stored result
survives a crash or a restart of the service.

The file is created on the first submitted job; until then every read answers as an empty store,
so a service that never measures leaves no file behind.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2  # 2: calibrations table

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id           TEXT PRIMARY KEY,
    status       TEXT NOT NULL,
    request      TEXT NOT NULL,
    runner       TEXT NOT NULL,
    time_limit_s REAL NOT NULL,
    progress     REAL NOT NULL DEFAULT 0,
    message      TEXT NOT NULL DEFAULT '',
    error        TEXT,
    result       TEXT,
    created_at   REAL NOT NULL,
    started_at   REAL,
    finished_at  REAL
);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at DESC);
CREATE TABLE IF NOT EXISTS calibrations (
    id           TEXT PRIMARY KEY,
    gpu          TEXT NOT NULL,
    precision    TEXT NOT NULL,
    engine       TEXT NOT NULL,
    efficiency   REAL NOT NULL,
    detail       TEXT NOT NULL,
    created_at   REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS calibrations_gpu ON calibrations (gpu, precision, created_at DESC);
"""


class JobStatus(StrEnum):
    """Where a job is in its life; the last three are final."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.RUNNING)


_LIVE = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


@dataclass(frozen=True)
class Job:
    """One row of the store, decoded."""

    id: str
    status: JobStatus
    request: dict[str, Any]
    runner: str
    time_limit_s: float
    progress: float
    message: str
    error: str | None
    result: dict[str, Any] | None
    created_at: float
    started_at: float | None
    finished_at: float | None


@dataclass(frozen=True)
class Calibration:
    """One stored calibration: the efficiency a measured run achieved on a GPU."""

    id: str
    gpu: str
    precision: str
    engine: str
    efficiency: float
    detail: dict[str, Any]
    created_at: float


def _decode(row: sqlite3.Row) -> Job:
    return Job(
        id=row["id"],
        status=JobStatus(row["status"]),
        request=json.loads(row["request"]),
        runner=row["runner"],
        time_limit_s=row["time_limit_s"],
        progress=row["progress"],
        message=row["message"],
        error=row["error"],
        result=None if row["result"] is None else json.loads(row["result"]),
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
    )


class JobStore:
    """All job rows; safe to share between the request threads and the worker thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    # -- connection -------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            # FULL: a transaction that returned is on disk, even if the host loses power.
            conn.execute("PRAGMA synchronous=FULL")
            with conn:
                conn.executescript(_SCHEMA)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._conn = conn
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        with self._lock:
            conn = self._open()
            with conn:
                yield conn

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection | None]:
        with self._lock:
            if self._conn is None and not self.path.exists():
                yield None
            else:
                yield self._open()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- writes (each one transaction) ------------------------------------------------------

    def create(self, job_id: str, request: dict[str, Any], runner: str, time_limit_s: float) -> Job:
        now = time.time()
        with self._write() as conn:
            conn.execute(
                "INSERT INTO jobs (id, status, request, runner, time_limit_s, message, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    JobStatus.QUEUED.value,
                    json.dumps(request),
                    runner,
                    time_limit_s,
                    "queued",
                    now,
                ),
            )
        job = self.get(job_id)
        assert job is not None  # just inserted
        return job

    def start(self, job_id: str) -> Job | None:
        """queued → running; None when the job is no longer queued (cancelled meanwhile)."""
        with self._write() as conn:
            changed = conn.execute(
                "UPDATE jobs SET status = ?, started_at = ?, message = 'starting'"
                " WHERE id = ? AND status = ?",
                (JobStatus.RUNNING.value, time.time(), job_id, JobStatus.QUEUED.value),
            ).rowcount
        return self.get(job_id) if changed else None

    def progress(self, job_id: str, fraction: float, message: str) -> None:
        with self._write() as conn:
            conn.execute(
                "UPDATE jobs SET progress = ?, message = ? WHERE id = ? AND status = ?",
                (fraction, message, job_id, JobStatus.RUNNING.value),
            )

    def finish(
        self,
        job_id: str,
        status: JobStatus,
        *,
        error: str | None = None,
        result: str | None = None,
        message: str | None = None,
    ) -> bool:
        """A live job → a final state; False (and no change) when it was already final.

        ``result`` is the JSON text the child produced, stored as it came.
        """
        assert status.final
        with self._write() as conn:
            changed = conn.execute(
                "UPDATE jobs SET status = ?, error = ?, result = ?, finished_at = ?,"
                " message = COALESCE(?, message),"
                " progress = CASE WHEN ? = 'succeeded' THEN 1.0 ELSE progress END"
                " WHERE id = ? AND status IN (?, ?)",
                (status.value, error, result, time.time(), message, status.value, job_id, *_LIVE),
            ).rowcount
        return bool(changed)

    def fail_live(self, queued_error: str, running_error: str) -> list[str]:
        """Every job still queued or running fails with the matching error; their ids."""
        with self._read() as existing:
            if existing is None:
                return []
        with self._write() as conn:
            ids = [
                row["id"]
                for row in conn.execute(
                    "SELECT id FROM jobs WHERE status IN (?, ?)", _LIVE
                ).fetchall()
            ]
            now = time.time()
            for status, error in (
                (JobStatus.QUEUED, queued_error),
                (JobStatus.RUNNING, running_error),
            ):
                conn.execute(
                    "UPDATE jobs SET status = ?, error = ?, finished_at = ?, message = 'failed'"
                    " WHERE status = ?",
                    (JobStatus.FAILED.value, error, now, status.value),
                )
        return ids

    # -- reads ------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job | None:
        with self._read() as conn:
            if conn is None:
                return None
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _decode(row)

    def page(self, limit: int, offset: int, status: JobStatus | None = None) -> list[Job]:
        """Newest first."""
        where, args = ("WHERE status = ?", (status.value,)) if status else ("", ())
        with self._read() as conn:
            if conn is None:
                return []
            rows = conn.execute(
                f"SELECT * FROM jobs {where} ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?",
                (*args, limit, offset),
            ).fetchall()
        return [_decode(row) for row in rows]

    def count(self, status: JobStatus | None = None) -> int:
        where, args = ("WHERE status = ?", (status.value,)) if status else ("", ())
        with self._read() as conn:
            if conn is None:
                return 0
            (n,) = conn.execute(f"SELECT COUNT(*) FROM jobs {where}", args).fetchone()
        return int(n)

    # -- calibrations: achieved compute efficiency per GPU and precision ----------------------

    def add_calibration(
        self,
        cal_id: str,
        gpu: str,
        precision: str,
        engine: str,
        efficiency: float,
        detail: dict[str, Any],
    ) -> Calibration:
        now = time.time()
        with self._write() as conn:
            conn.execute(
                "INSERT INTO calibrations (id, gpu, precision, engine, efficiency, detail,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (cal_id, gpu, precision, engine, efficiency, json.dumps(detail), now),
            )
        return Calibration(cal_id, gpu, precision, engine, efficiency, detail, now)

    def calibrations(
        self, gpu: str | None = None, precision: str | None = None
    ) -> list[Calibration]:
        """Newest first, optionally only one GPU's (and precision's)."""
        where, args = [], []
        for column, value in (("gpu", gpu), ("precision", precision)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        with self._read() as conn:
            if conn is None:
                return []
            rows = conn.execute(
                f"SELECT * FROM calibrations {clause} ORDER BY created_at DESC, rowid DESC",
                args,
            ).fetchall()
        return [
            Calibration(
                row["id"],
                row["gpu"],
                row["precision"],
                row["engine"],
                row["efficiency"],
                json.loads(row["detail"]),
                row["created_at"],
            )
            for row in rows
        ]

    def count_by_status(self) -> dict[JobStatus, int]:
        """Jobs per state (every state present, zero where none): for /metrics and /readyz."""
        counts = dict.fromkeys(JobStatus, 0)
        with self._read() as conn:
            if conn is not None:
                for row in conn.execute("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status"):
                    counts[JobStatus(row["status"])] = int(row["n"])
        return counts
