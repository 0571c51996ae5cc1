"""Where the calculators' heavier answers run: off the event loop, one at a time, in arrival
order.

An answer that walks a model's tensors (an engine's layouts, a sweep over Nd) is pure Python:
under the GIL two of them never run at once, so a thread each only makes them take turns. With
32 such requests in flight, 32 threads taking turns gave every answer about the latency of all
of them (the heavy sweep's p99 at 32 connections near twice its median; docs/BENCHMARKS.md §1).
One worker thread answers them in the order they came, while the event loop keeps answering
probes and the light questions. The price: a long answer (up to a sweep's 5 s budget) makes
the heavier answers behind it wait until it is done, where taking turns would have let a short
one finish first; the probes and the paper question, answered on the event loop, never wait.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# one worker thread, its queue first come first served: one answer computing at a time, the
# others waiting their turn. Handed over with asyncio's own executor hook (a queue put and a
# future) rather than anyio's worker threads behind a capacity limiter: less CPU per hand-over
# (~37 against ~43 µs in process), and the worker takes the next answer as soon as it is done
# instead of waiting for the event loop to release the limiter to the next one.
CALCULATIONS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="calculations")


async def calculate(answer: Callable[[T], R], request: T) -> R:
    """``answer(request)`` on the calculators' worker thread, after the answers asked before
    (in the caller's context, as ``asyncio.to_thread`` runs it)."""
    loop = asyncio.get_running_loop()
    run = functools.partial(contextvars.copy_context().run, answer, request)
    return await loop.run_in_executor(CALCULATIONS, run)
