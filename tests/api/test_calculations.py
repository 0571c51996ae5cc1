"""The calculators' heavier answers run one at a time, in the order they were asked."""

from __future__ import annotations

import threading
import time

import anyio

from app.core.calculations import calculate


def test_answers_run_one_at_a_time_in_arrival_order() -> None:
    running = 0
    most = 0
    order: list[int] = []
    lock = threading.Lock()

    def answer(n: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)  # long enough for every other request to be waiting meanwhile
        with lock:
            running -= 1
            order.append(n)
        return n * n

    async def scenario() -> list[int]:
        results: dict[int, int] = {}

        async def ask(n: int) -> None:
            results[n] = await calculate(answer, n)

        async with anyio.create_task_group() as tg:
            for n in range(6):
                tg.start_soon(ask, n)
                await anyio.sleep(0.001)  # arrival order 0, 1, ..., 5
        return [results[n] for n in range(6)]

    assert anyio.run(scenario) == [n * n for n in range(6)]
    assert most == 1
    assert order == list(range(6))
