"""Stand-ins for ``measure.runner.run`` that the job tests route jobs to by settings.

Each runs in the job's spawned child, so this module imports only the standard library (no
torch): a child starts in well under a second.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

Progress = Callable[[float, str], None]


class OutOfMemoryError(RuntimeError):
    """Named like ``torch.OutOfMemoryError``, the error a CUDA OOM raises in a real job."""


def succeed(spec: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """A result shaped like the real one, one run per requested stage."""
    progress(0.5, "measuring")
    runs = [
        {
            "stage": stage,
            "measured": {"resident": 1000 * (stage + 1)},
            "predicted": {"resident": 1000 * (stage + 1)},
            # a ratio with a zero denominator: the service stores it as null
            "relative_error": {"resident": 0.0, "peak": float("nan")},
        }
        for stage in spec["stages"]
    ]
    return {"runs": runs, "model": spec["model"], "dp": spec["dp"]}


def fail(spec: dict[str, Any], progress: Progress) -> dict[str, Any]:  # noqa: ARG001
    progress(0.2, "allocating")
    raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def sleep(spec: dict[str, Any], progress: Progress) -> dict[str, Any]:  # noqa: ARG001
    """Runs for a minute with a grandchild (as a distributed job has one per GPU); reports both
    process ids in its progress message so tests can see them killed."""
    worker = subprocess.Popen(["sleep", "600"])
    for step in range(1200):
        progress(step / 1200, f"pids {os.getpid()} {worker.pid}")
        time.sleep(0.05)
    return {"runs": []}


def die(spec: dict[str, Any], progress: Progress) -> dict[str, Any]:  # noqa: ARG001
    """A crash nothing can catch: the child is killed like the kernel's OOM killer kills."""
    progress(0.1, "about to crash")
    os.kill(os.getpid(), signal.SIGKILL)
    return {"runs": []}
