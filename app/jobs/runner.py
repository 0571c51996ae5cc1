"""One measurement at a time: a bounded queue, a worker thread, and a spawned child per job.

The child (``app.jobs.child``) is started with the ``spawn`` method, so it begins with a fresh
interpreter and no CUDA state of ours, and whatever happens in it (an exception, a CUDA
out-of-memory, a segfault, ``kill -9``) fails that job alone with a readable error. The worker
kills the child's whole process group at the wall-clock limit, on cancel and at shutdown, which
frees the GPU before the next job starts.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import signal
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from app.jobs import child
from app.jobs.store import Job, JobStatus, JobStore

log = logging.getLogger("zerocalc.jobs")

RESTARTED_RUNNING = "service restarted while the job ran"
RESTARTED_QUEUED = "service restarted before the job ran"
STOPPED_RUNNING = "service stopped while the job ran"
STOPPED_QUEUED = "service stopped before the job ran"


class QueueFull(Exception):
    """No room in the queue; ``retry_after_s`` is when the running job must have ended."""

    def __init__(self, queue_size: int, retry_after_s: int) -> None:
        super().__init__(f"the measure queue is full ({queue_size} jobs wait)")
        self.queue_size = queue_size
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Outcome:
    status: JobStatus
    error: str | None = None
    result: str | None = None


def death_message(exitcode: int | None) -> str:
    """Why a child that sent neither result nor error ended, in words."""
    if exitcode is None:
        return "child process did not exit"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "unknown signal"
        hint = ""
        if -exitcode == signal.SIGKILL:
            hint = ": killed from outside (kill -9, or the kernel's out-of-memory killer)"
        elif -exitcode == signal.SIGSEGV:
            hint = ": a crash in native code"
        return f"child process died with signal {-exitcode} ({name}){hint}"
    if exitcode > 0:
        return f"child process exited with code {exitcode} before reporting a result"
    return "child process exited without reporting a result"


def kill_group(proc: BaseProcess) -> None:
    """SIGKILL the child and everything in its process group (its per-GPU workers)."""
    if proc.pid is None:
        return
    try:
        # the child made itself leader of group ``pid``; before it did, no such group exists
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.exitcode is None:
        proc.kill()


class JobManager:
    """The queue and the worker thread; ``start``/``stop`` run in the app's lifespan."""

    def __init__(
        self,
        store: JobStore,
        queue_size: int,
        *,
        poll_s: float = 0.25,
        exit_grace_s: float = 10.0,
    ) -> None:
        self.store = store
        self.queue_size = queue_size
        self.poll_s = poll_s
        self.exit_grace_s = exit_grace_s
        self._ctx = mp.get_context("spawn")
        self._cond = threading.Condition()
        self._pending: deque[str] = deque()
        self._current: str | None = None
        self._proc: BaseProcess | None = None
        self._deadline: float | None = None
        self._cancelled = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Fail what a previous process left live, then start the worker thread."""
        stale = self.store.fail_live(RESTARTED_QUEUED, RESTARTED_RUNNING)
        if stale:
            log.warning("marked %d job(s) of a previous run failed: %s", len(stale), stale)
        self._thread = threading.Thread(target=self._work, name="zerocalc-jobs", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Kill the running child, fail what is live, close the store."""
        with self._cond:
            self._stopping = True
            if self._proc is not None:
                kill_group(self._proc)
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.store.fail_live(STOPPED_QUEUED, STOPPED_RUNNING)
        self.store.close()

    # -- requests ---------------------------------------------------------------------------

    def submit(self, request: dict[str, Any], runner: str, time_limit_s: float) -> Job:
        """Queue a job; :class:`QueueFull` when ``queue_size`` jobs already wait."""
        with self._cond:
            if self._stopping:
                raise QueueFull(self.queue_size, 1)
            if len(self._pending) >= self.queue_size:
                raise QueueFull(self.queue_size, self._retry_after())
            job = self.store.create(uuid.uuid4().hex, request, runner, time_limit_s)
            self._pending.append(job.id)
            self._cond.notify_all()
        return job

    def cancel(self, job_id: str) -> Job | None:
        """Cancel a live job (a queued one leaves the queue, a running one's child is killed);
        a final job is answered unchanged; None for an unknown id."""
        with self._cond:
            job = self.store.get(job_id)
            if job is None or job.status.final:
                return job
            if job_id in self._pending:
                self._pending.remove(job_id)
            elif job_id == self._current:
                self._cancelled = True
                if self._proc is not None:
                    kill_group(self._proc)
            self.store.finish(job_id, JobStatus.CANCELLED, message="cancelled")
        return self.store.get(job_id)

    def state(self) -> dict[str, Any]:
        """The worker's state, for /readyz."""
        with self._cond:
            alive = self._thread is not None and self._thread.is_alive()
            return {
                "worker": "running" if alive and not self._stopping else "stopped",
                "running": self._current,
                "queued": len(self._pending),
                "queue_size": self.queue_size,
            }

    def counts(self) -> dict[str, int]:
        """Stored jobs by state, for /metrics."""
        return {state.value: n for state, n in self.store.count_by_status().items()}

    def _retry_after(self) -> int:
        """Seconds until the running job is done at the latest (it then frees a queue slot)."""
        if self._deadline is None:
            return 1
        return max(1, math.ceil(self._deadline - time.monotonic()))

    # -- the worker -------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                job_id = self._pending.popleft()
                self._current, self._cancelled = job_id, False
            try:
                job = self.store.start(job_id)
                if job is not None:
                    self._run(job)
            except Exception as exc:  # the worker must outlive any job
                log.exception("job %s failed in the worker", job_id)
                try:
                    self.store.finish(job_id, JobStatus.FAILED, error=f"internal error: {exc}")
                except Exception:
                    log.exception("could not store the failure of job %s", job_id)
            finally:
                with self._cond:
                    self._current, self._proc, self._deadline = None, None, None

    def _run(self, job: Job) -> None:
        recv, send = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(
            target=child.main,
            args=(job.runner, job.request, send),
            name=f"zerocalc-job-{job.id[:8]}",
        )
        with self._cond:
            if not (self._cancelled or self._stopping):
                self._deadline = time.monotonic() + job.time_limit_s
                proc.start()
                self._proc = proc
        send.close()  # the child holds the only write end: EOF once it is gone
        if self._proc is not proc:
            recv.close()
            return
        try:
            outcome = self._supervise(job, proc, recv)
        finally:
            recv.close()
            with self._cond:
                self._proc = None  # cancel and stop no longer reach for it
            kill_group(proc)  # whatever the child left behind in its group
            proc.join()
            proc.close()
        with self._cond:
            if self._stopping and outcome.status is JobStatus.FAILED:
                outcome = Outcome(JobStatus.FAILED, STOPPED_RUNNING)
        message = "done" if outcome.status is JobStatus.SUCCEEDED else "failed"
        if self.store.finish(
            job.id, outcome.status, error=outcome.error, result=outcome.result, message=message
        ):
            log.info(
                "job %s %s%s",
                job.id,
                outcome.status.value,
                f": {outcome.error}" if outcome.error else "",
            )

    def _supervise(self, job: Job, proc: BaseProcess, recv: Connection) -> Outcome:
        """Relay progress until the child reports, dies or runs out of time."""
        assert self._deadline is not None
        deadline = self._deadline
        outcome: Outcome | None = None
        pipe_open = True
        progress: tuple[float, str] | None = None  # not yet stored
        stored_at = 0.0
        while outcome is None:
            now = time.monotonic()
            if now >= deadline:
                while pipe_open and outcome is None and recv.poll():  # a report just in time
                    outcome, pipe_open, progress = self._relay(recv, progress)
                if outcome is not None:
                    break
                kill_group(proc)
                return Outcome(
                    JobStatus.FAILED,
                    f"time limit of {job.time_limit_s:g} s exceeded; the child process was killed",
                )
            if progress is not None and now - stored_at >= self.poll_s:
                self.store.progress(job.id, *progress)
                progress, stored_at = None, now
            ready = wait(
                [proc.sentinel, *([recv] if pipe_open else [])],
                timeout=min(deadline - now, self.poll_s),
            )
            if pipe_open and recv in ready:
                outcome, pipe_open, progress = self._relay(recv, progress)
            elif proc.sentinel in ready:
                proc.join()
                while pipe_open and outcome is None and recv.poll():  # sent just before exit
                    outcome, pipe_open, progress = self._relay(recv, progress)
                if outcome is None:
                    outcome = Outcome(JobStatus.FAILED, death_message(proc.exitcode))
        proc.join(self.exit_grace_s)  # it reported; give it time to release the GPU cleanly
        return outcome

    @staticmethod
    def _relay(
        recv: Connection, progress: tuple[float, str] | None
    ) -> tuple[Outcome | None, bool, tuple[float, str] | None]:
        """Read what the child has sent: the outcome if it reported one, whether the pipe is
        still open, and the latest progress (stored at most every ``poll_s``)."""
        while True:
            try:
                kind, *body = recv.recv()
            except (EOFError, OSError):
                return None, False, progress
            if kind == "progress":
                progress = (float(body[0]), str(body[1]))
            elif kind == "result":
                return Outcome(JobStatus.SUCCEEDED, result=str(body[0])), True, progress
            elif kind == "error":
                return Outcome(JobStatus.FAILED, error=str(body[0])), True, progress
            if not recv.poll():
                return None, True, progress
