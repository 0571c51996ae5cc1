"""Prediction vs measurement, field by field, with the engine's own convention."""

from __future__ import annotations

from typing import Any

from calculators import communication as comm
from calculators.conventions import Engine, Stage
from calculators.engines.torch.allocator import BLOCK_COMPONENTS
from calculators.estimates import StageEstimate
from calculators.memory import estimate
from calculators.model_states import TrainingSetup

MEMORY_KEYS = (
    "resident",
    "model_state_resident",
    "model_state_requested",
    "peak",
    "peak_requested",
    "parameters",
    "gradients",
    "optimizer_states",
    "after_forward",
    "after_backward",
    "after_step",
)


def relative_error(predicted: int | None, measured: int | None) -> float | None:
    """(predicted - measured) / measured; ``None`` when either side is missing or measured is 0
    (0 when both are 0)."""
    if predicted is None or measured is None:
        return None
    if measured == 0:
        return 0.0 if predicted == 0 else None
    return (predicted - measured) / measured


def predicted_memory(est: StageEstimate) -> dict[str, Any]:
    """The calculator's figures under the names ``measured`` uses.

    ``resident`` and ``peak`` are what ``memory_allocated`` shows (runtime workspaces, the batch
    and held outputs included, when the estimate knows the batch); ``model_state_resident`` is
    what the engine itself keeps, which ``measured`` gives over its runtime baseline.
    """
    states = est.components.get("model_states_resident")
    if states is None:  # deepspeed: resident less what the loop holds (workspaces stay in)
        states = est.resident - est.components.get("held_outputs", 0)
    # the blocks the allocator hands FSDP2's shards and states beyond their requests
    blocks = sum(est.components.get(k, 0) for k in BLOCK_COMPONENTS)
    return {
        "resident": est.resident,
        "model_state_resident": states,
        # what the tensors ask for: less those blocks
        "model_state_requested": states - blocks,
        "peak": est.peak,
        "peak_requested": None if est.peak is None else est.peak - blocks,
        "parameters": est.device.parameters,
        "gradients": est.device.gradients,
        "optimizer_states": est.device.optimizer_states,
        # the phases measure/ probes (activations, gradients), when the estimate has a batch
        **{k: est.components.get(k) for k in ("after_forward", "after_backward", "after_step")},
        "components": dict(est.components),
        "notes": list(est.notes),
    }


def predicted_communication(
    setup: TrainingSetup,
    stage: Stage,
    grad_sync: comm.GradSync = comm.GradSync.PER_MICRO_STEP,
) -> dict[str, Any]:
    """Bytes rank 0 sends per step: ``calculators.communication`` (the ``/v1/communication``
    model) with ``setup.engine``. The torch loop reduces as the request's ``grad_sync`` says
    (every micro-step unless DDP runs the others under ``no_sync``); DeepSpeed decides itself
    when it reduces, as its profile models."""
    micro = setup.batch.grad_accumulation_steps if setup.batch is not None else 1
    torch_loop = setup.engine is Engine.TORCH
    cs = comm.CommunicationSetup(
        training=setup,
        topology=comm.make_topology(setup.dp, setup.tp, setup.pp, None, None),
        grad_accumulation_steps=micro,
        grad_sync=grad_sync if torch_loop else comm.GradSync.PER_STEP,
    )
    sc = comm.stage_communication(cs, stage)
    return {
        "sent_bytes_per_rank": sc.sent_bytes_per_rank,
        "collectives": [
            {
                "op": c.collective.op.value,
                "phase": c.collective.phase.value,
                "dtype": c.collective.dtype,
                "calls": c.collective.calls,
                "payload_bytes": c.collective.payload_bytes,
                "sent_bytes_per_rank": c.collective.sent_bytes_per_rank,
            }
            for c in sc.collectives
        ],
        "source": f"calculators.communication (engine {setup.engine.value})",
    }


def compare_run(
    setup: TrainingSetup,
    stage: Stage,
    measured_run: dict[str, Any],
    grad_sync: comm.GradSync = comm.GradSync.PER_MICRO_STEP,
) -> dict[str, Any]:
    """Fill ``predicted``, ``relative_error`` and ``communication`` of one measured run."""
    est = estimate(setup, [stage]).stages[0]
    predicted = predicted_memory(est)
    measured = measured_run["measured"]
    errors = {k: relative_error(predicted.get(k), measured.get(k)) for k in MEMORY_KEYS}
    comm_pred = predicted_communication(setup, stage, grad_sync)
    comm_meas = measured_run["measured_sent_bytes_per_rank"]
    return {
        "predicted": predicted,
        "relative_error": errors,
        "communication": {
            "measured_sent_bytes_per_rank": comm_meas,
            "predicted_sent_bytes_per_rank": comm_pred["sent_bytes_per_rank"],
            "relative_error": relative_error(comm_pred["sent_bytes_per_rank"], comm_meas),
            "collectives": measured_run["collectives"],
            "predicted_collectives": comm_pred["collectives"],
            "predicted_by": comm_pred["source"],
        },
    }
