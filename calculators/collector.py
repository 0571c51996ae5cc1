"""The cyclic garbage collector paused around a long walk.

The engine walks (the stage-3 coordinator, the caching-allocator replay) allocate hundreds of
thousands of short-lived lists and tuples and form no reference cycles among them. With the
collector running, those allocations set off its passes, and each full pass scans every
tracked object in the process (a third of a long walk's time in a large process). Paused,
the walk's containers are freed by reference counting as usual; anything cyclic left behind
is collected after it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from functools import wraps
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def collector_paused(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` with the cyclic collector paused while it runs (left paused if it already was)."""

    @wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return run
