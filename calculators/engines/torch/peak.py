"""Peak memory of one training step under PyTorch's engines, phase by phase.

The step the ``torch`` engine models (and ``measure/`` runs) is a plain training loop::

    logits = model(x)                       # autocast (DDP) or MixedPrecisionPolicy (FSDP2)
    loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

``logits`` and ``loss`` stay referenced until the next iteration rebinds them, so they are part
of what is allocated between steps (``held_outputs``); ``engine_config["holds_outputs"] = false``
models a loop that deletes them. The peak is the largest of these moments, each one a sum of
tensors whose lifetimes come from autograd and the engines' source:

- ``loss_backward``: everything forward saved (``calculators.activations``), the unsharded
  16-bit parameters FSDP2 keeps after forward when ``reshard_after_forward=False``, and the two
  fp32 ``tokens × vocab`` gradients of the loss (nll_loss's grad input and log_softmax's).
- ``recompute`` (activation checkpointing): the first block recomputed in backward.
- ``optimizer_step``: the gradients the optimizer reads plus one temporary list the size of
  the local parameters that torch's foreach Adam allocates (``torch/optim/adam.py``
  ``_multi_tensor_adam``: ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)``).

Runtime allocations that ``torch.cuda.memory_allocated`` also counts: the cuBLAS workspaces,
one per (handle, stream), and a handle per thread — the forward runs in the caller's thread and
backward in autograd's device thread, so two. Their size is ``4096 × 8 KiB`` = 32 MiB on sm_90
and newer (``aten/src/ATen/cuda/CublasHandlePool.cpp``, ``parseChosenWorkspaceSize``), else
``4096 KiB × 2 + 16 KiB × 8``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from calculators.activations import Regime, activations
from calculators.architecture import Architecture
from calculators.batch import Batch
from calculators.conventions import FP32_BYTES, HALF_BYTES
from calculators.errors import InputError

KIB = 1024
CUBLAS_WORKSPACE_SM90 = 4096 * 8 * KIB
CUBLAS_WORKSPACE_OLDER = 4096 * KIB * 2 + 16 * KIB * 8
CUBLAS_HANDLES = 2  # the caller's thread (forward, step) and autograd's device thread (backward)
DEFAULT_COMPUTE_CAPABILITY = 9  # H100 / H200


def cublas_workspace_bytes(config: Mapping[str, Any]) -> int:
    """Workspaces the caching allocator holds after the first step (0 on CPU)."""
    if "cublas_workspace_bytes" in config:
        value = config["cublas_workspace_bytes"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError("engine_config.cublas_workspace_bytes", "must be a byte count >= 0")
        return value
    major = config.get("compute_capability_major", DEFAULT_COMPUTE_CAPABILITY)
    if isinstance(major, bool) or not isinstance(major, int) or major < 1:
        raise InputError("engine_config.compute_capability_major", "must be an integer >= 1")
    per_handle = CUBLAS_WORKSPACE_SM90 if major >= 9 else CUBLAS_WORKSPACE_OLDER
    return CUBLAS_HANDLES * per_handle


def holds_outputs(config: Mapping[str, Any]) -> bool:
    value = config.get("holds_outputs", True)
    if not isinstance(value, bool):
        raise InputError("engine_config.holds_outputs", "must be true or false")
    return value


@dataclass(frozen=True)
class StepMemory:
    """Memory of one step beyond the engine's model states.

    Attributes:
        activations: what forward saves for backward, at the end of forward.
        held_outputs: ``logits`` and ``loss`` of the last step, alive between steps.
        workspaces: cuBLAS workspaces in the caching allocator.
        end_of_forward: bytes above model states when forward and the loss are done
            (activations plus parameters still gathered).
        step_gradients: gradient bytes alive from the end of backward through the step.
        moments: bytes above model states + workspaces at each candidate moment.
        peak_moment: which moment is the peak.
    """

    activations: int
    held_outputs: int
    workspaces: int
    end_of_forward: int = 0
    step_gradients: int = 0
    moments: Mapping[str, int] = field(default_factory=dict)

    @property
    def peak_moment(self) -> str:
        return max(self.moments, key=lambda k: self.moments[k])

    @property
    def above_states(self) -> int:
        return self.moments[self.peak_moment]


def step_memory(
    arch: Architecture,
    batch: Batch,
    regime: Regime,
    *,
    unsharded_after_forward: int,
    step_gradients: int,
    optimizer_temporary: int,
    accumulated_gradients: int = 0,
    gathered_for_loss: int = 0,
    root_reduction: int = 0,
    reductions: tuple[tuple[int, int], ...] = (),
    forward_gathered: int = 0,
    last_gather: int = 0,
    config: Mapping[str, Any],
) -> StepMemory:
    """The moments of one step, in bytes above the resident model states.

    Args:
        arch: the decoder.
        batch: the micro-batch.
        regime: dtypes during forward (``autocast`` for DDP, ``half`` for FSDP2 mixed).
        unsharded_after_forward: 16-bit parameter bytes still gathered when forward ends.
        step_gradients: gradient bytes alive during the optimizer step (beyond buckets).
        optimizer_temporary: bytes of the optimizer's temporaries during step.
        accumulated_gradients: gradients already held when a later micro-batch's loss runs
            backward (gradient accumulation).
        gathered_for_loss: 16-bit parameter bytes gathered again before the loss's backward
            (FSDP2 with ``reshard_after_forward=True`` when the loss is the root's output).
        root_reduction: bytes of gradients alive when FSDP2 reduces its root unit at the end of
            backward (0: no such moment).
        reductions: FSDP2's gradient-reduction moments in backward, each (blocks in backward
            after the last one, bytes of gathered-parameter change, reduction buffers and
            gradients beyond the end of forward).
        forward_gathered: FSDP2's gathered parameter bytes at the last block's all-gather in
            forward, its flat all-gather output and the previous block's included (0: none).
        last_gather: the flat all-gather output still alive while a loss inside the root
            module runs (0: none).
        config: engine knobs (``holds_outputs``, ``cublas_workspace_bytes``).
    """
    acts = activations(arch, batch, regime)
    # logits + the loss scalar; a transformers model's key/value cache dies with its output
    # object, which the loop (like transformers' Trainer) does not keep
    held = acts.logits + FP32_BYTES if holds_outputs(config) else 0
    loss_grads = 2 * FP32_BYTES * batch.tokens * arch.vocab_size
    end_of_forward = unsharded_after_forward + acts.end_of_forward
    moments = {
        "loss_forward": end_of_forward + acts.loss_transient + last_gather,
        "loss_backward": end_of_forward + loss_grads + accumulated_gradients + gathered_for_loss,
        "optimizer_step": held + step_gradients + optimizer_temporary,
    }
    if root_reduction:
        moments["root_reduction"] = held + root_reduction + accumulated_gradients
    if forward_gathered:
        moments["last_block_gather"] = (
            forward_gathered + acts.layers - acts.layers // arch.layers + acts.embedding
        )
    # a reduction moment: the last block's activations, the head's and the loss's are freed;
    # a block in backward after it holds its own (recomputed under checkpointing) and the
    # gradient of its output flows in
    res = FP32_BYTES if regime is Regime.AUTOCAST or regime is Regime.FP32 else HALF_BYTES
    for later, extra in reductions:
        alive = acts.end_of_forward - acts.layers // arch.layers - acts.head - acts.loss
        moments[f"block_reduction_{later + 1}"] = (
            unsharded_after_forward
            + alive
            + later * acts.recompute
            + res * batch.tokens * arch.hidden
            + extra
            + accumulated_gradients
        )
    if acts.recompute:
        # backward of the last checkpointed block: the saved block inputs, the caller's logits,
        # the recomputed block and the gradient flowing in and out of it.
        res = FP32_BYTES if regime is Regime.AUTOCAST or regime is Regime.FP32 else HALF_BYTES
        moments["recompute"] = (
            unsharded_after_forward
            + acts.layers
            + acts.embedding
            + acts.logits
            + acts.recompute
            + 2 * res * batch.tokens * arch.hidden
            + accumulated_gradients
        )
    return StepMemory(
        activations=acts.end_of_forward,
        held_outputs=held,
        workspaces=cublas_workspace_bytes(config),
        end_of_forward=end_of_forward,
        step_gradients=step_gradients,
        moments=moments,
    )
