"""PyTorch's own ZeRO-like engines, exactly as a typical training script sets them up.

- stage 0: ``DistributedDataParallel`` over fp32 parameters with autocast (mixed precision);
- stage 1: the same plus ``ZeroRedundancyOptimizer(optimizer_class=Adam)``;
- stage 2 / 3: FSDP2 ``fully_shard`` on every block, then the root, with
  ``MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32)`` and
  ``reshard_after_forward`` False / True.

``fp32`` uses no autocast and no policy; pure ``bf16`` casts the parameters to bf16.
In a simulated world (the fake process group) DDP gets a communication hook that all-reduces
the bucket in place, because the fake group's work objects carry no result for the Reducer's
built-in hook; it is the same all-reduce, divided by N first as the built-in one divides.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from calculators.conventions import Optimizer, Precision, Stage
from calculators.errors import InputError

LEARNING_RATE = 1e-4


def half_dtype(precision: Precision) -> torch.dtype | None:
    return {
        Precision.MIXED_BF16: torch.bfloat16,
        Precision.MIXED_FP16: torch.float16,
        Precision.BF16: torch.bfloat16,
    }.get(precision)


def make_optimizer_class(
    optimizer: Optimizer,
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    if optimizer is Optimizer.ADAM:
        return torch.optim.Adam, {"lr": LEARNING_RATE}
    if optimizer is Optimizer.ADAMW:
        return torch.optim.AdamW, {"lr": LEARNING_RATE}
    if optimizer is Optimizer.SGD:
        return torch.optim.SGD, {"lr": LEARNING_RATE}
    if optimizer is Optimizer.SGD_MOMENTUM:
        return torch.optim.SGD, {"lr": LEARNING_RATE, "momentum": 0.9}
    raise InputError("optimizer", "the torch engine runs adam, adamw, sgd and sgd_momentum")


@dataclass
class Engine:
    """A wrapped module, its optimizer, and the autocast context forward runs in."""

    stage: Stage
    name: str
    module: nn.Module
    optimizer: torch.optim.Optimizer
    autocast: Callable[[], contextlib.AbstractContextManager[Any]]


def _sim_allreduce_hook(world: int) -> Callable[[Any, Any], torch.futures.Future[torch.Tensor]]:
    # no annotations: DDP's _check_comm_hook compares them with dist.GradBucket / Future
    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        tensor = bucket.buffer()
        tensor.div_(world)
        fut = dist.all_reduce(tensor, async_op=True).get_future()  # type: ignore[union-attr]
        return fut.then(lambda _f: tensor)

    return hook


def root_reshards_after_forward() -> bool:
    """Whether this torch's FSDP2 honours an explicit ``reshard_after_forward=True`` on the root.

    Recent ``_fsdp_state.FSDPState`` records ``_auto_reshard_after_forward`` and keeps the root
    unsharded only when the flag was defaulted; older releases never reshard the root.
    """
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    return hasattr(FSDPState(), "_auto_reshard_after_forward")


def build_engine(
    model: nn.Module,
    shard_units: list[nn.Module],
    stage: Stage,
    precision: Precision,
    optimizer: Optimizer,
    device: torch.device,
    simulated: bool,
) -> Engine:
    world = dist.get_world_size()
    half = half_dtype(precision)
    opt_cls, opt_kwargs = make_optimizer_class(optimizer)
    if precision is Precision.BF16:
        model.to(torch.bfloat16)
    mixed = precision.is_mixed

    def autocast() -> contextlib.AbstractContextManager[Any]:
        if mixed and stage <= Stage.OPTIMIZER:
            assert half is not None
            return torch.autocast(device.type, dtype=half)
        return contextlib.nullcontext()

    if stage <= Stage.OPTIMIZER:
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
        if simulated:
            ddp.register_comm_hook(None, _sim_allreduce_hook(world))
        if stage is Stage.NONE:
            opt: torch.optim.Optimizer = opt_cls(ddp.parameters(), **opt_kwargs)
            name = "DistributedDataParallel"
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=opt_cls, **opt_kwargs)
            name = "DistributedDataParallel + ZeroRedundancyOptimizer"
        return Engine(stage, name, ddp, opt, autocast)

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": stage is Stage.PARAMETERS}
    if mixed:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
    for unit in shard_units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    opt = opt_cls(model.parameters(), **opt_kwargs)
    flag = "True" if stage is Stage.PARAMETERS else "False"
    return Engine(stage, f"FSDP2 fully_shard(reshard_after_forward={flag})", model, opt, autocast)
