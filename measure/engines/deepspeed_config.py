"""The DeepSpeed config body one stage runs with (torch-free: the request is checked with it).

``engine_config`` is a DeepSpeed config body; the request's own fields (precision, batch, stage,
offload) fill the keys they own, and an ``engine_config`` that sets one of them too is refused.
The calculator's parser (:func:`calculators.engines.deepspeed.parse_config`) reads the result,
so a knob it cannot model is a 422 before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calculators.conventions import Precision, Stage
from calculators.engines.deepspeed import parse_config
from calculators.errors import InputError

# Keys the request's own fields set; an engine_config that sets them too is refused.
OWNED_KEYS = {
    "fp16": "precision",
    "bf16": "precision",
    "optimizer": "optimizer",
    "train_batch_size": "batch",
    "train_micro_batch_size_per_gpu": "batch.micro_batch_size",
    "gradient_accumulation_steps": "batch.grad_accumulation_steps",
}
OWNED_ZERO_KEYS = {"stage": "stages", "offload_optimizer": "offload", "offload_param": "offload"}
SECTIONS = {Precision.MIXED_BF16: "bf16", Precision.MIXED_FP16: "fp16"}


def check_precision(precision: Precision) -> None:
    if precision not in SECTIONS:
        raise InputError(
            "precision",
            "the deepspeed engine runs its bf16 or fp16 section: mixed_bf16 or mixed_fp16",
        )


def deepspeed_config(
    stage: Stage,
    precision: Precision,
    micro_batch: int,
    grad_accumulation: int,
    offload: Mapping[str, Any],
    engine_config: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The DeepSpeed config body of one stage: ``engine_config``'s knobs plus the request's
    fields (which ``engine_config`` may not contradict).

    Raises:
        InputError: a key the request's fields own, or a knob the calculator cannot read.
    """
    check_precision(precision)
    body = dict(engine_config or {})
    for key, field in OWNED_KEYS.items():
        if key in body:
            raise InputError(f"engine_config.{key}", f"set by the request's {field}")
    zero_in = body.get("zero_optimization", {})
    zero_in = {} if zero_in is None else zero_in
    if not isinstance(zero_in, Mapping):
        raise InputError("engine_config.zero_optimization", "must be an object")
    for key, field in OWNED_ZERO_KEYS.items():
        if key in zero_in:
            raise InputError(
                f"engine_config.zero_optimization.{key}", f"set by the request's {field}"
            )
    zero: dict[str, Any] = {**zero_in, "stage": int(stage)}
    config: dict[str, Any] = {
        "steps_per_print": 1_000_000,
        **body,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accumulation,
        SECTIONS[precision]: {"enabled": True},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
    }
    optimizer_off = offload.get("optimizer") or "none"
    params_off = offload.get("params") or "none"
    if optimizer_off != "none":
        if stage is Stage.NONE:
            raise InputError("offload.optimizer", "optimizer offload needs ZeRO stage 1 or higher")
        zero["offload_optimizer"] = {"device": optimizer_off}
        config["zero_force_ds_cpu_optimizer"] = False  # keep the client optimizer
    if params_off != "none":
        if stage is not Stage.PARAMETERS:
            raise InputError("offload.params", "parameter offload needs ZeRO stage 3")
        zero["offload_param"] = {"device": params_off}
    parse_config(config)  # the calculator's reading of the same body: bad knobs are 422s
    return config
