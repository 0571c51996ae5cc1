"""Named conventions: ZeRO stages, precisions, optimizers and what each costs per parameter.

Every byte-per-parameter figure is born here, with where it comes from, so no formula elsewhere
carries a bare 2, 4 or 12.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum
from fractions import Fraction
from functools import cache


class Stage(IntEnum):
    """ZeRO stages, ordered so that ``stage >= Stage.GRADIENTS`` reads like the paper (§5)."""

    NONE = 0
    """Plain data parallelism: every rank holds all model states."""
    OPTIMIZER = 1
    """P_os: optimizer states partitioned across the Nd ranks."""
    GRADIENTS = 2
    """P_os+g: optimizer states and gradients partitioned."""
    PARAMETERS = 3
    """P_os+g+p: optimizer states, gradients and parameters partitioned."""


class Precision(StrEnum):
    """Training precision."""

    MIXED_FP16 = "mixed_fp16"
    MIXED_BF16 = "mixed_bf16"
    FP32 = "fp32"
    BF16 = "bf16"

    @property
    def is_mixed(self) -> bool:
        return self in (Precision.MIXED_FP16, Precision.MIXED_BF16)


class Optimizer(StrEnum):
    """Optimizer whose states set K."""

    ADAM = "adam"
    ADAMW = "adamw"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd_momentum"
    ADAFACTOR = "adafactor"
    ADAM_8BIT = "adam_8bit"


class GradientConvention(StrEnum):
    """How many bytes a gradient takes in mixed precision."""

    PAPER = "paper"
    """16-bit gradients (ZeRO paper §3.1): 2 + 2 + 12 = 16 B/param with Adam."""
    FP32_GRADS = "fp32_grads"
    """fp32 gradient accumulation buffers (Megatron-LM ``main_grad``; DeepSpeed's and
    llm-analysis' estimators): 2 + 4 + 12 = 18 B/param with Adam."""


class Engine(StrEnum):
    """Whose accounting a figure follows."""

    PAPER = "paper"
    DEEPSPEED = "deepspeed"
    TORCH = "torch"


class OffloadDevice(StrEnum):
    """Where offloaded states live."""

    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


# Bytes per element.
FP32_BYTES = 4
HALF_BYTES = 2  # fp16 or bf16


@dataclass(frozen=True)
class PrecisionBytes:
    """Per-parameter bytes of the working copies under one precision.

    Attributes:
        parameter: the copy forward and backward run on.
        gradient_16bit: a gradient in the parameter dtype.
        master: an fp32 master copy held by the optimizer (mixed precision only).
        state_element: one optimizer-state element (momentum, variance).
    """

    parameter: int
    gradient_16bit: int
    master: int
    state_element: int


PRECISION_BYTES: dict[Precision, PrecisionBytes] = {
    # ZeRO paper §3.1: fp16 params and grads, fp32 master params, momentum and variance.
    Precision.MIXED_FP16: PrecisionBytes(HALF_BYTES, HALF_BYTES, FP32_BYTES, FP32_BYTES),
    Precision.MIXED_BF16: PrecisionBytes(HALF_BYTES, HALF_BYTES, FP32_BYTES, FP32_BYTES),
    # Pure fp32 with Adam: 4 + 4 + 8 = 16 B/param (no master copy: the params are fp32).
    Precision.FP32: PrecisionBytes(FP32_BYTES, FP32_BYTES, 0, FP32_BYTES),
    # Pure bf16: params, grads and optimizer states all in bf16, no master copy.
    Precision.BF16: PrecisionBytes(HALF_BYTES, HALF_BYTES, 0, HALF_BYTES),
}

# bitsandbytes 8-bit blockwise optimizers: each state is 1 byte per element plus one fp32
# absmax per 256-element block (bitsandbytes/optim/optimizer.py, Optimizer8bit.init_state).
BNB_BLOCK = 256
ADAM_8BIT_STATE_BYTES = 2 * (1 + Fraction(FP32_BYTES, BNB_BLOCK))

OPTIMIZER_ASSUMPTIONS: dict[Optimizer, str] = {
    Optimizer.ADAM: "two states (momentum, variance) per parameter in the state dtype",
    Optimizer.ADAMW: "two states (momentum, variance) per parameter in the state dtype",
    Optimizer.SGD: "no state",
    Optimizer.SGD_MOMENTUM: "one momentum buffer per parameter in the state dtype",
    Optimizer.ADAFACTOR: (
        "factored second moment: rows + cols values per matrix, counted as 0 B/param "
        "(under 0.1% for hidden >= 1024); no first moment (beta1=None, the paper's default)"
    ),
    Optimizer.ADAM_8BIT: (
        "bitsandbytes blockwise 8-bit: two uint8 states plus one fp32 absmax per 256-element "
        "block = 2.03125 B/param"
    ),
}


def optimizer_state_bytes(optimizer: Optimizer, precision: Precision) -> Fraction:
    """Bytes per parameter of optimizer states, excluding any fp32 master copy."""
    element = PRECISION_BYTES[precision].state_element
    if optimizer in (Optimizer.ADAM, Optimizer.ADAMW):
        return Fraction(2 * element)
    if optimizer is Optimizer.SGD_MOMENTUM:
        return Fraction(element)
    if optimizer is Optimizer.ADAM_8BIT:
        return ADAM_8BIT_STATE_BYTES
    return Fraction(0)  # SGD, Adafactor (factored: see OPTIMIZER_ASSUMPTIONS)


@cache  # a pure table look-up, asked for once per stage and once per answer
def k_bytes(optimizer: Optimizer, precision: Precision, master_weights: bool = True) -> Fraction:
    """K of the ZeRO paper: optimizer-state bytes per parameter, fp32 master copy included.

    Mixed-precision Adam: 12 = 4 fp32 master + 4 momentum + 4 variance (paper §3.1).
    ``master_weights=False`` drops the fp32 master copy (16-bit params and grads plus fp32
    moments only: 2 + 2 + 8 = 12 B/param); it changes nothing outside mixed precision.
    """
    master = PRECISION_BYTES[precision].master if master_weights else 0
    return master + optimizer_state_bytes(optimizer, precision)


def gradient_bytes(precision: Precision, convention: GradientConvention) -> int:
    """Bytes per parameter of the gradient the optimizer consumes."""
    if convention is GradientConvention.FP32_GRADS:
        return FP32_BYTES
    return PRECISION_BYTES[precision].gradient_16bit
