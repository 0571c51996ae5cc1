"""What each engine's figures cost per parameter, so the labels beside them say the same.

The paper's accounting follows the request (``model_states.bytes_per_param``: precision, K,
gradient convention, master copy). A real engine decides for itself, and the request's knobs it
does not follow must not reappear as labels:

- ``torch``: fp32 parameters in mixed precision (autocast for DDP, FSDP2's
  ``MixedPrecisionPolicy(reduce_dtype=fp32)``), gradients in the parameter dtype (DDP) or fp32
  (FSDP2's reduce dtype), each optimizer state ``zeros_like(param)`` (torch/optim/adam.py):
  4 + 4 + 8 B/param with Adam; no separate master copy (the parameters are the master).
- ``deepspeed``: 16-bit parameters and gradients, an fp32 master and fp32 optimizer states
  (fp16/bf16 sections, runtime/zero/stage_1_and_2.py ``single_partition_of_fp32_groups``):
  2 + 2 + (4 + 8) B/param with Adam, whatever ``master_weights`` or ``gradients`` say.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from calculators.conventions import (
    FP32_BYTES,
    HALF_BYTES,
    Engine,
    GradientConvention,
    Precision,
)
from calculators.engines.torch.memory import STATE_TENSORS  # torch.optim: exp_avg, exp_avg_sq
from calculators.model_states import BytesPerParam, TrainingSetup, bytes_per_param


@dataclass(frozen=True)
class Labels:
    """Per-parameter bytes and conventions that describe an engine's figures.

    Attributes:
        per_param: bytes of each model state per parameter, before partitioning.
        gradients: the gradient convention those bytes follow.
        ignored: request settings the engine does not follow, in short sentences.
    """

    per_param: BytesPerParam
    gradients: GradientConvention
    ignored: tuple[str, ...] = ()


def _torch(setup: TrainingSetup) -> Labels:
    param = FP32_BYTES if setup.precision is not Precision.BF16 else HALF_BYTES
    states = STATE_TENSORS.get(setup.optimizer, 0) * param
    ignored = []
    if setup.precision.is_mixed and not setup.master_weights:
        ignored.append(
            "master_weights false does not apply: the torch engine keeps fp32 parameters, "
            "which are the optimizer's master copy"
        )
    if setup.gradients is GradientConvention.FP32_GRADS and param != FP32_BYTES:
        ignored.append("gradients fp32_grads does not apply: pure bf16 keeps bf16 gradients")
    return Labels(
        BytesPerParam(Fraction(param), Fraction(param), Fraction(states)),
        GradientConvention.FP32_GRADS if setup.precision.is_mixed else GradientConvention.PAPER,
        tuple(ignored),
    )


def _deepspeed(setup: TrainingSetup) -> Labels:
    # fp32 master (4) plus each optimizer state in fp32
    states = FP32_BYTES + STATE_TENSORS.get(setup.optimizer, 0) * FP32_BYTES
    ignored = []
    if not setup.master_weights:
        ignored.append(
            "master_weights false does not apply: DeepSpeed's fp16/bf16 optimizers keep an "
            "fp32 master copy"
        )
    if setup.gradients is GradientConvention.FP32_GRADS:
        ignored.append(
            "gradients fp32_grads does not apply: DeepSpeed reduces and keeps 16-bit gradients "
            "(the fp32 copy exists only inside the step)"
        )
    return Labels(
        BytesPerParam(Fraction(HALF_BYTES), Fraction(HALF_BYTES), Fraction(states)),
        GradientConvention.PAPER,
        tuple(ignored),
    )


def labels(setup: TrainingSetup) -> Labels:
    """What ``setup.engine``'s model-state figures cost per parameter."""
    if setup.engine is Engine.TORCH:
        return _torch(setup)
    if setup.engine is Engine.DEEPSPEED:
        return _deepspeed(setup)
    return Labels(bytes_per_param(setup), setup.gradients)
