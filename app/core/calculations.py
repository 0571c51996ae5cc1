"""Where the calculators' heavier answers run: off the event loop, one at a time, in arrival
order.

An answer that walks a model's tensors (an engine's layouts, a sweep over Nd) is pure Python:
under the GIL two of them never run at once, so a thread each only makes them take turns. With
32 such requests in flight, 32 threads taking turns gave every answer about the latency of all
of them, and the hand-offs cost CPU of their own (the heavy sweep at 32 connections: p99 165 ms,
2.7 ms of server CPU per request, against 82 ms and 2.2 ms one at a time; docs/BENCHMARKS.md §1).
One worker thread answers them in the order they came, while the event loop keeps answering
probes and the light questions.
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
