"""The DeepSpeed config body one stage runs with (torch-free: the request is checked with it).

``engine_config`` is a DeepSpeed config body as :func:`measure.spec.parse_spec` resolved it: every
"auto" filled as transformers' Trainer fills it, and the keys the request's fields own (fp16 /
bf16, micro-batch, accumulation, stage, offload) agreeing with the request, which has taken the
config's values where the user left the field out. The request's fields are written over those
keys here (the stage is the one this run measures), the rest of each section is kept. The
calculator's parser (:func:`calculators.engines.deepspeed.parse_config`) reads the result, so a
knob it cannot model is a 422 before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calculators.conventions import Precision, Stage
from calculators.engines.deepspeed import parse_config
from calculators.errors import InputError

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
    """The DeepSpeed config body of one stage: ``engine_config``'s sections and knobs with the
    request's precision, micro-batch, accumulation, stage and offload written in.

    Raises:
        InputError: an offload the stage cannot run, or a knob the calculator cannot read.
    """
    check_precision(precision)
    body = dict(engine_config or {})
    zero_in = body.get("zero_optimization", {})
    zero_in = {} if zero_in is None else zero_in
    if not isinstance(zero_in, Mapping):
        raise InputError("engine_config.zero_optimization", "must be an object")
    zero: dict[str, Any] = {**zero_in, "stage": int(stage)}
    # DeepSpeed derives train_batch_size from the two it is given (runtime/config.py
    # _set_batch_related_parameters) with the world size it runs on
    body.pop("train_batch_size", None)
    config: dict[str, Any] = {
        "steps_per_print": 1_000_000,
        **body,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accumulation,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
    }
    for chosen, name in SECTIONS.items():
        section = body.get(name)
        if chosen is precision or isinstance(section, Mapping):
            # the config's own section (loss scaling, ...) with enabled as the precision says
            config[name] = {**(section or {}), "enabled": chosen is precision}
    optimizer_off = offload.get("optimizer") or "none"
    params_off = offload.get("params") or "none"
    for key, device in (("offload_optimizer", optimizer_off), ("offload_param", params_off)):
        section = zero_in.get(key)
        if device != "none":
            zero[key] = {**(section if isinstance(section, Mapping) else {}), "device": device}
    if optimizer_off != "none":
        if stage is Stage.NONE:
            raise InputError("offload.optimizer", "optimizer offload needs ZeRO stage 1 or higher")
        config["zero_force_ds_cpu_optimizer"] = False  # keep the client optimizer
    if params_off != "none" and stage is not Stage.PARAMETERS:
        raise InputError("offload.params", "parameter offload needs ZeRO stage 3")
    parse_config(config)  # the calculator's reading of the same body: bad knobs are 422s
    return config
