"""Parameter tensors as the engines see them: one type, one cached list per architecture."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from calculators.architecture import Architecture, tensor_counts

ROOT_GROUP = "root"
"""The FSDP2 unit of everything outside the blocks (embeddings, final norm, head)."""


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor.

    Attributes:
        name: dotted name as ``nn.Module.named_parameters`` gives it.
        shape: its shape.
        group: the FSDP2 unit that owns it (``blocks.<i>`` or ``root``).
        numel: elements (derived from ``shape``).
        module: the owning module's path, ``name`` without ``.weight``/``.bias``.
    """

    name: str
    shape: tuple[int, ...]
    group: str = ROOT_GROUP
    # derived once: the stage-3 coordinator and bucket walks read them per tensor, many times
    numel: int = field(init=False, repr=False, compare=False)
    module: str = field(init=False, repr=False, compare=False)

    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "numel", math.prod(self.shape))
        object.__setattr__(self, "module", self.name.rsplit(".", 1)[0])
        object.__setattr__(self, "_hash", hash((self.name, self.shape, self.group)))

    def __hash__(self) -> int:
        # once: the stage-3 caches key on whole parameter lists (tens of thousands for MoE)
        return self._hash

    def fsdp_shard_numel(self, world: int) -> int:
        """Rank 0's padded dim-0 chunk: ceil(dim0 / N) rows (``_fsdp_param.py``)."""
        if not self.shape:
            return 1
        return -(-self.shape[0] // world) * math.prod(self.shape[1:])


def tally(values: Iterable[int]) -> Counter[int]:
    """How many times each value occurs: a sum of ``f(value)`` over tensors is a sum over the
    distinct values (blocks repeat the same shapes, experts are identical)."""
    return Counter(values)


def fsdp_shard_total(params: Sequence[ParamTensor], world: int) -> int:
    """Σ ``fsdp_shard_numel(world)`` over ``params``, once per distinct shape."""
    shapes = Counter(p.shape for p in params)
    return sum(
        count * ParamTensor("", shape).fsdp_shard_numel(world) for shape, count in shapes.items()
    )


def fsdp_padded_total(params: Sequence[ParamTensor], world: int) -> int:
    """Σ ``ceil(dim0 / N) · N · rest`` over ``params``: every dim 0 padded to a multiple of N
    (FSDP2 ``_get_dim0_padded_size``), once per distinct shape."""
    shapes = Counter(p.shape for p in params)
    return sum(
        count * (-(-shape[0] // world) * world if shape else world) * math.prod(shape[1:])
        for shape, count in shapes.items()
    )


def _param(name: str, shape: tuple[int, ...], group: str) -> ParamTensor:
    """``ParamTensor(name, shape, group)`` without the dataclass's per-field frozen setattr."""
    p = object.__new__(ParamTensor)
    p.__dict__.update(
        name=name,
        shape=shape,
        group=group,
        numel=math.prod(shape),
        module=name.rpartition(".")[0] if "." in name else name,
        _hash=hash((name, shape, group)),
    )
    return p


@lru_cache(maxsize=16)  # few: a MoE model's list runs to ~50k tensors
def architecture_params(arch: Architecture) -> tuple[ParamTensor, ...]:
    """Every parameter of ``arch`` in ``named_parameters`` order, once per architecture (a sweep
    asks for the same list per Nd and stage).

    Built from ``tensor_counts``: block 0 (and its expert 0) named again for every block and
    expert, the same list ``tensors(arch)`` gives.
    """
    counts = tensor_counts(arch)
    first = [t for t, _ in counts if t.layer is None and t.stage_hint == "first"]
    last = [t for t, _ in counts if t.layer is None and t.stage_hint != "first"]
    moe = arch.num_experts > 1
    shared = [t for t, c in counts if t.layer is not None and not (moe and c != arch.layers)]
    expert = [t for t, c in counts if t.layer is not None and moe and c != arch.layers]
    block0, expert0 = "blocks.0.", "blocks.0.experts.0."
    out = [_param(t.name, t.shape, ROOT_GROUP) for t in first]
    for i in range(arch.layers):
        group = f"blocks.{i}"
        out += [_param(f"{group}.{t.name[len(block0) :]}", t.shape, group) for t in shared]
        for e in range(arch.num_experts if moe else 0):
            prefix = f"{group}.experts.{e}."
            out += [_param(prefix + t.name[len(expert0) :], t.shape, group) for t in expert]
    out += [_param(t.name, t.shape, ROOT_GROUP) for t in last]
    return tuple(out)
