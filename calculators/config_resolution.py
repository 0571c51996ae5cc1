"""What an engine config decides, value by value: the types both engines' config readers share.

A request may carry the config a user trains with (``engine_config``: a DeepSpeed config body,
FSDP2 settings). That config is the source of truth for what it names; the request's own fields
fill what it leaves out, and a request field the user set explicitly must agree with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from calculators.conventions import Optimizer, Precision, Stage
from calculators.errors import InputError
from calculators.model_states import Offload

CONFIG = "engine_config"


@dataclass(frozen=True)
class Resolved:
    """One value the config decided, and how.

    Attributes:
        key: dotted key inside ``engine_config``, e.g. ``zero_optimization.reduce_bucket_size``.
        value: the value used (JSON); None when it could not be resolved, ``source`` says why.
        source: where the value comes from (``config``, ``auto: hidden_size² ...``,
            ``request: precision``, ``DeepSpeed default ...``).
    """

    key: str
    value: Any
    source: str


@dataclass(frozen=True)
class Requested:
    """The request's training fields as a config reader sees them.

    Attributes:
        stages: the stages the request asks for.
        precision, offload, optimizer: the request's values (explicit or defaults).
        dp: the data-parallel world size.
        micro_batch: ``batch.micro_batch_size`` when the request has a batch.
        grad_accumulation: the request's gradient accumulation steps (explicit or 1).
        grad_accumulation_field: where the request carries it (``batch.grad_accumulation_steps``
            or ``grad_accumulation_steps``).
        checkpointing_full: whether the batch asks for full activation checkpointing (None: no
            batch).
        hidden: the model's hidden size (None for a bare parameter count).
        explicit: dotted request fields the user sent (pydantic ``model_fields_set``).
    """

    stages: tuple[Stage, ...]
    precision: Precision
    offload: Offload
    optimizer: Optimizer
    dp: int
    micro_batch: int | None = None
    grad_accumulation: int = 1
    grad_accumulation_field: str = "batch.grad_accumulation_steps"
    checkpointing_full: bool | None = None
    hidden: int | None = None
    explicit: frozenset[str] = frozenset()

    def given(self, field: str) -> bool:
        return field in self.explicit


@dataclass(frozen=True)
class Decided:
    """What the request means once the config is read.

    Attributes:
        config: the config body the engine model reads, every ``"auto"`` replaced or dropped.
        stages: the stages to answer.
        stage: the stage the config names (None: it names none).
        precision, offload, optimizer: the effective values.
        micro_batch: the micro-batch per device (None: neither config nor request gives one).
        grad_accumulation: micro-batches per optimizer step.
        train_batch: the global batch (None when the micro-batch is unknown).
        checkpointing_full: the config turns full activation checkpointing on (None: silent).
        values: every value read or resolved, with its source.
        notes: what the reader assumed.
    """

    config: Mapping[str, Any]
    stages: tuple[Stage, ...]
    stage: Stage | None
    precision: Precision
    offload: Offload
    optimizer: Optimizer
    micro_batch: int | None
    grad_accumulation: int
    train_batch: int | None
    values: tuple[Resolved, ...]
    notes: tuple[str, ...] = ()
    checkpointing_full: bool | None = None


def contradiction(request_field: str, config_key: str, message: str) -> InputError:
    """A request field set explicitly that disagrees with the config: names both fields."""
    return InputError(request_field, message, also=(f"{CONFIG}.{config_key}",))


def decided_stages(
    req: Requested, stage: Stage | None, config_key: str
) -> tuple[tuple[Stage, ...], str]:
    """The stages to answer and how: the config's stage alone unless the request lists stages
    explicitly (which must then include it)."""
    if stage is None:
        return req.stages, "the request's stages (the config names no stage)"
    if not req.given("stages"):
        return (stage,), "config"
    if stage not in req.stages:
        listed = ", ".join(str(int(s)) for s in req.stages)
        raise contradiction(
            "stages",
            config_key,
            f"the config names stage {int(stage)}; the request's stages [{listed}] leave it out",
        )
    return req.stages, "config (the request's explicit stages are answered)"
