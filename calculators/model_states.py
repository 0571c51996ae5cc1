"""Model-state memory per device: 2Ψ + 2Ψ + KΨ with Nd partitioning per stage (ZeRO §5).

This is the ``paper`` accounting. Engine profiles (``calculators/engines``) start from the same
:class:`TrainingSetup` and say what a real engine allocates on top of, or instead of, it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache
from typing import Any

from calculators.architecture import Architecture, split_for_model_parallel
from calculators.batch import Batch
from calculators.conventions import (
    PRECISION_BYTES,
    Engine,
    GradientConvention,
    OffloadDevice,
    Optimizer,
    Precision,
    Stage,
    gradient_bytes,
    k_bytes,
)
from calculators.errors import InputError


def ceil_div(numerator: Fraction | int, denominator: int = 1) -> int:
    """Smallest integer ≥ numerator / denominator (bytes are never fractional)."""
    # ⌈n / (d·m)⌉ = -⌊-n / (d·m)⌋ in integers: no intermediate Fraction (the hot path)
    if type(numerator) is int:
        return -(-numerator // denominator)
    return -((-numerator.numerator) // (numerator.denominator * denominator))


@dataclass(frozen=True)
class Offload:
    """Where optimizer states and parameters live when not on the device."""

    optimizer: OffloadDevice = OffloadDevice.NONE
    params: OffloadDevice = OffloadDevice.NONE


@dataclass(frozen=True)
class TrainingSetup:
    """Everything the memory formulas need about one training run.

    Attributes:
        params: Ψ, the whole model's parameter count.
        dp: Nd, the data-parallel degree ZeRO partitions over.
        tp: tensor-parallel degree (divides the model before ZeRO).
        pp: pipeline-parallel degree (divides the model before ZeRO).
        precision: training precision.
        optimizer: optimizer (sets K unless ``k`` is given).
        k: optimizer-state bytes per parameter, overriding the optimizer's.
        gradients: gradient-dtype convention (16-bit as the paper, or fp32 buffers).
        master_weights: mixed precision keeps an fp32 master copy (the paper does; a 16-bit
            count of 2 + 2 + 8 B/param with Adam does not).
        offload: optimizer / parameter offload targets.
        engine: whose accounting to follow.
        architecture: the decoder, when known (exact TP/PP split, activations).
        batch: the micro-batch, when known (activations and peak).
        engine_config: engine knobs (a DeepSpeed config body for ``deepspeed``).
    """

    params: int
    dp: int
    tp: int = 1
    pp: int = 1
    precision: Precision = Precision.MIXED_FP16
    optimizer: Optimizer = Optimizer.ADAM
    k: Fraction | None = None
    gradients: GradientConvention = GradientConvention.PAPER
    master_weights: bool = True
    offload: Offload = field(default_factory=Offload)
    engine: Engine = Engine.PAPER
    architecture: Architecture | None = None
    batch: Batch | None = None
    engine_config: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("params", "dp", "tp", "pp"):
            if getattr(self, name) < 1:
                raise InputError(name if name != "params" else "model.params", "must be at least 1")
        if self.k is not None and self.k < 0:
            raise InputError("k", "must not be negative")

    @property
    def k_value(self) -> Fraction:
        """K: the override if given, else the optimizer's under this precision."""
        return (
            self.k
            if self.k is not None
            else k_bytes(self.optimizer, self.precision, self.master_weights)
        )

    @property
    def params_per_device(self) -> int:
        """Parameters one device holds after TP and PP split the model, before ZeRO."""
        if self.tp == 1 and self.pp == 1:
            return self.params
        if self.architecture is not None:
            return split_for_model_parallel(self.architecture, self.tp, self.pp).params
        return ceil_div(self.params, self.tp * self.pp)


@dataclass(frozen=True)
class BytesPerParam:
    """Bytes each parameter costs in each model state, before partitioning."""

    parameters: Fraction
    gradients: Fraction
    optimizer_states: Fraction

    @property
    def total(self) -> Fraction:
        return self.parameters + self.gradients + self.optimizer_states


def bytes_per_param(setup: TrainingSetup) -> BytesPerParam:
    """2 + 2 + K in mixed precision (paper §3.1); other precisions per ``conventions``."""
    return _bytes_per_param(
        setup.precision, setup.gradients, setup.optimizer, setup.master_weights, setup.k
    )


@cache  # a table look-up over a few enums: asked once per stage and once per answer
def _bytes_per_param(
    precision: Precision,
    gradients: GradientConvention,
    optimizer: Optimizer,
    master_weights: bool,
    k: Fraction | None,
) -> BytesPerParam:
    return BytesPerParam(
        parameters=Fraction(PRECISION_BYTES[precision].parameter),
        gradients=Fraction(gradient_bytes(precision, gradients)),
        optimizer_states=k if k is not None else k_bytes(optimizer, precision, master_weights),
    )


@cache
def _share_terms(
    precision: Precision,
    gradients: GradientConvention,
    optimizer: Optimizer,
    master_weights: bool,
    k: Fraction | None,
) -> tuple[int, int, int, int, int, int]:
    """Numerator and denominator of each state's bytes per parameter (``_bytes_per_param``)."""
    per = _bytes_per_param(precision, gradients, optimizer, master_weights, k)
    p, g, o = per.parameters, per.gradients, per.optimizer_states
    return p.numerator, p.denominator, g.numerator, g.denominator, o.numerator, o.denominator


@dataclass(frozen=True)
class Placement:
    """Bytes of each model state in one place (device, CPU memory or NVMe), per rank."""

    parameters: int = 0
    gradients: int = 0
    optimizer_states: int = 0

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states


NOWHERE = Placement()
"""No model state in a place (CPU memory or NVMe without offload)."""

# positions of the states in a Placement's fields
PARAMETERS, GRADIENTS, OPTIMIZER_STATES = 0, 1, 2


@dataclass(frozen=True)
class ModelStateMemory:
    """Where one rank's model states live under one stage."""

    stage: Stage
    device: Placement
    cpu: Placement
    nvme: Placement


def partitioned(stage: Stage) -> tuple[bool, bool, bool]:
    """Which of (parameters, gradients, optimizer states) a stage splits across Nd (§5)."""
    return (
        stage >= Stage.PARAMETERS,
        stage >= Stage.GRADIENTS,
        stage >= Stage.OPTIMIZER,
    )


_PARTITIONED = {stage: partitioned(stage) for stage in Stage}  # looked up per stage and answer


def check_offload(offload: Offload, stage: Stage) -> None:
    """Reject offload a stage cannot do (DeepSpeed: optimizer offload needs ZeRO ≥ 1,
    parameter offload needs ZeRO-3, deepspeed/runtime/zero/config.py)."""
    if offload.optimizer is not OffloadDevice.NONE and stage < Stage.OPTIMIZER:
        raise InputError(
            "offload.optimizer",
            "optimizer offload needs ZeRO stage 1 or higher; remove stage 0 from stages",
        )
    if offload.params is not OffloadDevice.NONE and stage < Stage.PARAMETERS:
        raise InputError(
            "offload.params",
            f"parameter offload needs ZeRO stage 3; stage {int(stage)} cannot offload parameters",
        )


def model_state_memory(setup: TrainingSetup, stage: Stage) -> ModelStateMemory:
    """Per-rank model states for ``stage``, split between device, CPU memory and NVMe.

    Device bytes without offload (ZeRO paper §5, Ψ after TP/PP, N = dp):
        stage 0: (2 + 2 + K)Ψ; stage 1: (2 + 2)Ψ + KΨ/N; stage 2: 2Ψ + (2 + K)Ψ/N;
        stage 3: (2 + 2 + K)Ψ/N.
    Optimizer offload moves the optimizer-state share to CPU or NVMe and, from stage 2 on, the
    gradient partition to CPU memory (ZeRO-Offload, arXiv 2101.06840 §4). Parameter offload
    (stage 3, ZeRO-Infinity) moves the parameter partition.
    """
    return ModelStateMemory(stage, *model_state_placements(setup, stage))


def model_state_placements(
    setup: TrainingSetup, stage: Stage
) -> tuple[Placement, Placement, Placement]:
    """:func:`model_state_memory`'s device, CPU and NVMe placements, without the object that
    carries them (built per stage of every answer)."""
    offload = setup.offload
    if offload.optimizer is OffloadDevice.NONE and offload.params is OffloadDevice.NONE:
        return placement(*_device_shares(setup, stage)), NOWHERE, NOWHERE
    check_offload(offload, stage)  # its refusals before the shares'
    device = _device_shares(setup, stage)
    cpu = [0, 0, 0]
    nvme = [0, 0, 0]

    def move(state: int, target: OffloadDevice) -> None:
        (cpu if target is OffloadDevice.CPU else nvme)[state] += device[state]
        device[state] = 0

    if offload.optimizer is not OffloadDevice.NONE:
        move(OPTIMIZER_STATES, offload.optimizer)
        if stage >= Stage.GRADIENTS:
            move(GRADIENTS, OffloadDevice.CPU)
    if offload.params is not OffloadDevice.NONE:
        move(PARAMETERS, offload.params)
    return placement(*device), placement(*cpu), placement(*nvme)


def model_state_placements_each(
    setup: TrainingSetup, stages: Iterable[Stage]
) -> Iterator[tuple[Placement, Placement, Placement]]:
    """:func:`model_state_placements` of each stage in turn (each stage's refusals when it
    comes), Ψ and the per-parameter bytes looked up once for all of them."""
    offload = setup.offload
    if offload.optimizer is not OffloadDevice.NONE or offload.params is not OffloadDevice.NONE:
        for stage in stages:
            yield model_state_placements(setup, stage)
        return
    psi = setup.params_per_device
    terms = _share_terms(
        setup.precision, setup.gradients, setup.optimizer, setup.master_weights, setup.k
    )
    for stage in stages:
        yield placement(*_shares(terms, psi, setup.dp, stage)), NOWHERE, NOWHERE


def model_state_total(setup: TrainingSetup, stage: Stage) -> int:
    """``model_state_memory(setup, stage).device.total``, without building the placements."""
    offload = setup.offload
    if offload.optimizer is OffloadDevice.NONE and offload.params is OffloadDevice.NONE:
        return sum(_device_shares(setup, stage))
    return model_state_placements(setup, stage)[0].total


def _device_shares(setup: TrainingSetup, stage: Stage) -> list[int]:
    """The device's bytes of each state before any offload moves them: parameters, gradients,
    optimizer states."""
    terms = _share_terms(
        setup.precision, setup.gradients, setup.optimizer, setup.master_weights, setup.k
    )
    return _shares(terms, setup.params_per_device, setup.dp, stage)


def _shares(
    terms: tuple[int, int, int, int, int, int], psi: int, dp: int, stage: Stage
) -> list[int]:
    """Each state's bytes on the device at ``stage`` from its bytes per parameter as
    (numerator, denominator) pairs (``_share_terms``)."""
    # ⌈b·Ψ / d⌉ with b = n/q in lowest terms is ⌈n·Ψ / (q·d)⌉: the same rational number, in
    # integers (no Fraction product per share)
    np_, qp, ng, qg, no, qo = terms
    split_p, split_g, split_o = _PARTITIONED[stage]
    return [
        -((-np_ * psi) // (qp * dp if split_p else qp)),
        -((-ng * psi) // (qg * dp if split_g else qg)),
        -((-no * psi) // (qo * dp if split_o else qo)),
    ]


def placement(parameters: int, gradients: int, optimizer_states: int) -> Placement:
    """``Placement(parameters, gradients, optimizer_states)``, its fields set at once: the
    frozen dataclass's ``__init__`` sets each through ``object.__setattr__``, and one is built
    per stage of every answer. Equal to the constructor's (tests/calculators/test_estimates.py)."""
    built = object.__new__(Placement)
    fields = built.__dict__
    fields["parameters"] = parameters
    fields["gradients"] = gradients
    fields["optimizer_states"] = optimizer_states
    return built
