"""The host probe: the training micro-step (forward + backward, same model, engine and stage) at
one sequence of a few tokens, timed after the main steps.

Its GPU work is small (the GEMMs shrink with the tokens; what stays is the per-parameter casts
and copies), so its time is close to the host's dispatch of one micro-step: the figure
``calculators.plan.calibrate`` divides by the kernels and engine-hook steps the planner counts
per micro-step to get the host cost per kernel. The optimizer step is left out of the timed
region, as the planner's host term leaves it out (multi-tensor kernels keep it GPU-bound).

Each repetition starts synchronised and ends synchronised; the median is reported. The time at
which the host returned from backward (before the final synchronisation) is reported too: the
host's own dispatch, a lower bound where the GPU still had work queued.

Same kernel sequence: the op sequence of one micro-step at the probe's batch is compared with
one at the training batch (``torch.utils._python_dispatch.TorchDispatchMode`` recording the
ATen ops, untimed). An SDPA backend chosen by shape, or a different number of ops, shows up
there and the result says so.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from measure.session import sync

# One sequence of 32 tokens: GEMMs of 32 rows, a few µs each, so the GPU stays ahead of the
# host; the op-sequence comparison below says whether a kernel choice changed with the shape.
PROBE_MICRO_BATCH = 1
PROBE_SEQ_LEN = 32
PROBE_WARMUP = 3
PROBE_REPETITIONS = 10


def probe_batch(batch: Sequence[torch.Tensor], seq_len: int) -> tuple[torch.Tensor, ...]:
    """The first sequence of a training batch, cut to ``seq_len`` tokens (integer token
    tensors of shape (batch, seq)); other tensors keep their first row only."""
    out = []
    for t in batch:
        first = t[:PROBE_MICRO_BATCH]
        if t.dim() >= 2 and not t.is_floating_point():
            first = first[:, :seq_len]
        out.append(first.contiguous())
    return tuple(out)


def probe_seq_len(training_seq_len: int | None) -> int:
    """The probe's tokens per sequence: :data:`PROBE_SEQ_LEN`, or fewer for a shorter run."""
    if training_seq_len is None:
        return PROBE_SEQ_LEN
    return min(PROBE_SEQ_LEN, training_seq_len)


def time_micro_steps(
    micro_step: Callable[[], None],
    after: Callable[[], None],
    device: torch.device,
    warmup: int = PROBE_WARMUP,
    repetitions: int = PROBE_REPETITIONS,
) -> dict[str, Any]:
    """Median seconds of ``micro_step`` (synchronised on both ends) over ``repetitions`` runs
    after ``warmup``; ``after`` runs untimed between repetitions (the optimizer's zero_grad or
    the engine's step)."""
    total: list[float] = []
    dispatch: list[float] = []
    for i in range(warmup + repetitions):
        sync(device)
        t0 = time.perf_counter()
        micro_step()
        t1 = time.perf_counter()
        sync(device)
        t2 = time.perf_counter()
        after()
        if i >= warmup:
            total.append(t2 - t0)
            dispatch.append(t1 - t0)
    return {
        "seconds": statistics.median(total),
        "dispatch_seconds": statistics.median(dispatch),
        "repetitions": repetitions,
        "warmup": warmup,
        "min_seconds": min(total),
        "max_seconds": max(total),
    }


def op_sequence(micro_step: Callable[[], None]) -> list[str]:
    """The ATen ops one call of ``micro_step`` dispatches, in order (autograd's backward ops
    included: the dispatch mode travels with the autograd engine's thread-local state)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: list[str] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            ops.append(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    with Record():  # type: ignore[no-untyped-call]
        micro_step()
    return ops


def compare_ops(training: list[str], probe: list[str]) -> dict[str, Any]:
    """Whether the probe dispatched the training micro-step's op sequence, and where not."""
    out: dict[str, Any] = {
        "ops_per_micro_step": len(training),
        "probe_ops_per_micro_step": len(probe),
        "same_ops_as_training": training == probe,
    }
    if training != probe:
        at = next(
            (i for i, (a, b) in enumerate(zip(training, probe, strict=False)) if a != b),
            min(len(training), len(probe)),
        )
        out["first_difference"] = {
            "index": at,
            "training": training[at] if at < len(training) else None,
            "probe": probe[at] if at < len(probe) else None,
        }
    return out


def run_probe(
    micro_step_at: Callable[[tuple[torch.Tensor, ...]], None],
    after: Callable[[], None],
    training_batch: Sequence[torch.Tensor],
    seq_len: int | None,
    device: torch.device,
) -> dict[str, Any]:
    """Time the micro-step at the probe's batch and compare its op sequence with the training
    batch's; the result's ``host_probe`` entry."""
    seq = probe_seq_len(seq_len)
    small = probe_batch(training_batch, seq)
    found: dict[str, Any] = {"micro_batch_size": PROBE_MICRO_BATCH, "seq_len": seq}
    found.update(time_micro_steps(lambda: micro_step_at(small), after, device))
    notes: list[str] = [
        "forward and backward of one micro-step at the probe's batch, synchronised at both "
        "ends, median of the repetitions; the optimizer step is not timed"
    ]
    try:
        training = op_sequence(lambda: micro_step_at(tuple(training_batch)))
        after()
        probe = op_sequence(lambda: micro_step_at(small))
        after()
    except Exception as err:  # noqa: BLE001 - the timing stands without the comparison
        found["same_ops_as_training"] = None
        notes.append(f"op sequences not compared ({type(err).__name__}: {err})")
    else:
        found.update(compare_ops(training, probe))
        if not found["same_ops_as_training"]:
            notes.append(
                "the probe's op sequence differs from the training micro-step's (see "
                "first_difference): its time is not exactly the training step's host dispatch"
            )
    found["notes"] = notes
    return found
