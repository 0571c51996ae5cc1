"""Device memory op by op: a dispatch mode that logs, for every ATen op, what is allocated after
it and the most allocated while it ran (the allocator's peak is reset before each op, so an
op's own temporaries count). Shared by ``eager_backward_probe.py`` and ``ds_peak_op.py``."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpMemory(TorchDispatchMode):
    """``log``: (op name, bytes allocated after it, most bytes allocated during it)."""

    def __init__(self, log: list[tuple[str, int, int]]) -> None:
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        torch.cuda.reset_peak_memory_stats()
        out: Any = func(*args, **(kwargs or {}))
        self.log.append(
            (str(func), torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated())
        )
        return out
