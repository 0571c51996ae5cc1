"""The body of the spawned child process: run one measurement, report back through a pipe.

The child leads its own process group, so the service can kill it together with anything it
started (one process per GPU in distributed mode), and it kills that group itself if the service
dies, so an orphaned measurement never keeps a GPU.

Messages to the parent, each a tuple:
``("progress", fraction, message)``, then ``("result", json_text)`` or ``("error", text)``.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

Progress = Callable[[float, str], None]
Runner = Callable[[dict[str, Any], Progress], dict[str, Any]]

MAX_MESSAGE = 500
MAX_ERROR = 2000
PARENT_CHECK_S = 0.5


def load_runner(path: str) -> Runner:
    """The callable named ``package.module:function`` (or ``package.module.function``)."""
    module_name, sep, name = path.partition(":")
    if not sep:
        module_name, _, name = path.rpartition(".")
    runner = getattr(importlib.import_module(module_name), name)
    if not callable(runner):
        raise TypeError(f"measure runner {path!r} is not callable")
    return runner  # type: ignore[no-any-return]


def finite(value: Any) -> Any:
    """``value`` with NaN and ±Infinity replaced by null, so the stored result is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def _orphaned() -> None:
    """The service is gone: kill this process group, this process and its workers with it."""
    os.killpg(0, signal.SIGKILL)


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        _orphaned()

    threading.Thread(target=watch, name="zerocalc-orphan-watch", daemon=True).start()


def _send(conn: Connection, message: tuple[Any, ...]) -> None:
    try:
        conn.send(message)
    except OSError:  # the read end is closed: the service died
        _orphaned()


def main(runner_path: str, spec: dict[str, Any], conn: Connection) -> None:
    """Entry point of the child: ``spec`` is the POST /v1/measure body as a dict."""
    os.setpgrp()
    _watch_parent(os.getppid())

    def progress(fraction: float, message: str) -> None:
        fraction = float(fraction)
        fraction = min(max(fraction, 0.0), 1.0) if math.isfinite(fraction) else 0.0
        _send(conn, ("progress", fraction, str(message)[:MAX_MESSAGE]))

    try:
        result = load_runner(runner_path)(spec, progress)
        if not isinstance(result, dict):
            raise TypeError(f"the measure runner returned {type(result).__name__}, not a dict")
        text = json.dumps(finite(result), allow_nan=False)
    except BaseException as exc:  # every failure, SystemExit included, is the job's error
        sys.stderr.write(traceback.format_exc())
        _send(conn, ("error", f"{type(exc).__name__}: {exc}"[:MAX_ERROR]))
    else:
        _send(conn, ("result", text))
    finally:
        conn.close()
