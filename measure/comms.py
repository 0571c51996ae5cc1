"""Count every collective the engine issues, from the real c10d calls.

A ``TorchDispatchMode`` sees each ``c10d::*`` op the engines dispatch (DDP's Reducer,
ZeroRedundancyOptimizer's broadcasts, FSDP2's all-gathers and reduce-scatters) with its tensors,
as ``torch.distributed.tensor.debug.CommDebugMode`` does; here the element counts and dtypes are
kept and the bytes each rank sends follow the ring factors of
:func:`calculators.communication.sent_factor` (the model ``/v1/communication`` uses).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from calculators.topology import Op, sent_factor

# c10d op name -> (collective, which argument holds the full-size buffer)
_OPS: dict[str, tuple[str, str]] = {
    "allreduce_": ("all_reduce", "input"),
    "allreduce_coalesced_": ("all_reduce", "input"),
    "broadcast_": ("broadcast", "input"),
    "reduce_": ("reduce", "input"),
    "_allgather_base_": ("all_gather", "output"),
    "allgather_": ("all_gather", "output"),
    "allgather_into_tensor_coalesced_": ("all_gather", "output"),
    "allgather_coalesced_": ("all_gather", "output"),
    "_reduce_scatter_base_": ("reduce_scatter", "input"),
    "reduce_scatter_": ("reduce_scatter", "input"),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "input"),
    "alltoall_base_": ("all_to_all", "input"),
    "alltoall_": ("all_to_all", "input"),
}


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


@dataclass
class CollectiveRecord:
    """One kind of collective, summed over its calls."""

    op: str
    dtype: str
    phase: str | None = None
    calls: int = 0
    elements: int = 0
    payload_bytes: int = 0
    sent: Fraction = Fraction(0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            **({} if self.phase is None else {"phase": self.phase}),
            "dtype": self.dtype,
            "calls": self.calls,
            "elements": self.elements,
            "payload_bytes": self.payload_bytes,
            "sent_bytes_per_rank": round(self.sent),
        }


@dataclass
class CommCounter(TorchDispatchMode):
    """Records c10d collectives dispatched while active (group size ``world``)."""

    world: int
    records: dict[tuple[str, str | None, str], CollectiveRecord] = field(default_factory=dict)
    phase: str | None = None  # the loop's phase (forward, backward, step), where it sets one

    def __post_init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves it unannotated

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            name = func._schema.name.split("::")[-1]
            if name in _OPS:
                self._record(name, args)
        return func(*args, **kwargs)

    def _record(self, name: str, args: tuple[Any, ...]) -> None:
        op, which = _OPS[name]
        if name in ("_allgather_base_", "_reduce_scatter_base_"):
            output, inp = _tensors(args[0]), _tensors(args[1])
        elif name in ("allgather_", "allgather_coalesced_", "reduce_scatter_", "alltoall_"):
            output, inp = _tensors(args[0]), _tensors(args[1])
        elif name in (
            "allgather_into_tensor_coalesced_",
            "reduce_scatter_tensor_coalesced_",
            "alltoall_base_",
        ):
            output, inp = _tensors(args[0]), _tensors(args[1])
        else:  # in-place: allreduce_, broadcast_, reduce_
            output = inp = _tensors(args[0])
        buf = output if which == "output" else inp
        if not buf:
            return
        payload = sum(t.numel() * t.element_size() for t in buf)
        dtype = str(buf[0].dtype).removeprefix("torch.")
        rec = self.records.setdefault(
            (op, self.phase, dtype), CollectiveRecord(op, dtype, self.phase)
        )
        rec.calls += 1
        rec.elements += sum(t.numel() for t in buf)
        rec.payload_bytes += payload
        rec.sent += payload * sent_factor(Op(op), self.world)

    @property
    def sent_bytes_per_rank(self) -> int:
        return round(sum((r.sent for r in self.records.values()), Fraction(0)))

    def collectives(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.records.values()]
