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

from collections.abc import Callable
from typing import TypeVar

from anyio import CapacityLimiter, to_thread

T = TypeVar("T")
R = TypeVar("R")

# one answer computing at a time; the others wait their turn (first come, first served)
CALCULATIONS = CapacityLimiter(1)


async def calculate(answer: Callable[[T], R], request: T) -> R:
    """``answer(request)`` on the calculators' worker thread, after the answers asked before."""
    return await to_thread.run_sync(answer, request, limiter=CALCULATIONS)
