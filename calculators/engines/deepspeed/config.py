"""The DeepSpeed config values the model reads, and the parameters DeepSpeed is given.

Defaults are DeepSpeed 0.19.8's (``deepspeed/runtime/zero/config.py``; paths relative to
``deepspeed/runtime/``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from calculators.conventions import FP32_BYTES, HALF_BYTES, OffloadDevice, Stage
from calculators.errors import InputError
from calculators.model_states import TrainingSetup
from calculators.parameters import ParamTensor, architecture_params, implied_params


@dataclass(frozen=True)
class Knobs:
    """The DeepSpeed config values the memory model reads (zero/config.py defaults)."""

    reduce_bucket_size: int = 500_000_000  # zero/config.py:113
    allgather_bucket_size: int = 500_000_000  # :132 (unused: all_gather_into_tensor, utils.py)
    overlap_comm: bool | None = None  # :138, None -> True only for stage 3 (:384-387)
    contiguous_gradients: bool = True  # :102
    reduce_scatter: bool = True  # :108
    use_multi_rank_bucket_allreduce: bool = True  # :119
    memory_efficient_linear: bool = True  # :346
    sub_group_size: int = 1_000_000_000  # :182
    prefetch_bucket_size: int = 50_000_000  # :222
    param_persistence_threshold: int = 100_000  # :228
    model_persistence_threshold: int = 2**63 - 1  # :235 (sys.maxsize)
    max_live_parameters: int = 1_000_000_000  # :245
    max_reuse_distance: int = 1_000_000_000  # :251
    hpz: int = 1  # zero_hpz_partition_size :324 (0 and 1 both mean off)
    qwz: bool = False  # zero_quantized_weights :328
    qgz: bool = False  # zero_quantized_gradients :340
    communication_bytes: int | None = None  # runtime/config.py get_communication_data_type
    offload_optimizer: OffloadDevice | None = None
    offload_param: OffloadDevice | None = None
    pin_memory: bool = True  # offload_config.py:45, :75
    force_ds_cpu_optimizer: bool = True  # constants.py:42
    fp16: bool | None = None
    bf16: bool | None = None
    micro_batch: int | None = None
    grad_accumulation: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def overlap(self, stage: Stage) -> bool:
        return self.overlap_comm if self.overlap_comm is not None else stage is Stage.PARAMETERS


_INT_KNOBS = {
    "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size",
    "sub_group_size": "sub_group_size",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_model_persistence_threshold": "model_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "zero_hpz_partition_size": "hpz",
}
_BOOL_KNOBS = {
    "overlap_comm": "overlap_comm",
    "contiguous_gradients": "contiguous_gradients",
    "reduce_scatter": "reduce_scatter",
    "use_multi_rank_bucket_allreduce": "use_multi_rank_bucket_allreduce",
    "memory_efficient_linear": "memory_efficient_linear",
    "zero_quantized_weights": "qwz",
    "zero_quantized_gradients": "qgz",
}
# runtime/config.py:119-130 _REMOVED_ZERO_CONFIG_KEYS, rejected by _reject_removed_config_keys
# (:133-141) with a DeepSpeedConfigError.
_REMOVED_ZERO_KEYS = {
    "mics_shard_size": "MiCS",
    "mics_hierarchical_params_gather": "MiCS",
    "zeropp_loco_param": "LoCo-Zero++",
}
# runtime/config.py:216-230 get_communication_data_type: lower-cased, these three only.
_COMMUNICATION_BYTES = {"fp16": HALF_BYTES, "bf16": HALF_BYTES, "fp32": FP32_BYTES}


def whole(value: Any, where: str, minimum: int = 0) -> int:
    finite = isinstance(value, int) or isinstance(value, float) and math.isfinite(value)
    if isinstance(value, bool) or not finite or value < minimum or value != int(value):
        raise InputError(where, f"must be a whole number >= {minimum}")
    return int(value)


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(where, "must be true or false")
    return value


def _section(config: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = config.get(key, {})
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(where, "must be an object")
    return value


def _offload_device(section: Mapping[str, Any], where: str) -> OffloadDevice | None:
    device = section.get("device", "none")
    try:
        parsed = OffloadDevice(device)
    except ValueError:
        raise InputError(f"{where}.device", "must be none, cpu or nvme") from None
    return None if parsed is OffloadDevice.NONE else parsed


def parse_config(config: Mapping[str, Any] | None) -> Knobs:
    """Read a DeepSpeed config body; unknown keys are ignored as DeepSpeed ignores them."""
    config = config or {}
    prefix = "engine_config"
    zero = _section(config, "zero_optimization", f"{prefix}.zero_optimization")
    values: dict[str, Any] = {}
    zp = f"{prefix}.zero_optimization"
    for key, feature in _REMOVED_ZERO_KEYS.items():
        if key in zero:
            raise InputError(
                f"{zp}.{key}",
                f"{feature} was removed in DeepSpeed 0.19.8 "
                "(runtime/config.py _REMOVED_ZERO_CONFIG_KEYS)",
            )
    for key, attr in _INT_KNOBS.items():
        if key in zero:
            least = 1 if key == "reduce_bucket_size" else 0
            values[attr] = whole(zero[key], f"{zp}.{key}", least)
    for key, attr in _BOOL_KNOBS.items():
        if key in zero and zero[key] is not None:
            values[attr] = _flag(zero[key], f"{zp}.{key}")
    pin = True
    for key in ("offload_optimizer", "offload_param"):
        section = _section(zero, key, f"{zp}.{key}")
        if section:
            values[key] = _offload_device(section, f"{zp}.{key}")
            if "pin_memory" in section:
                pin = pin and _flag(section["pin_memory"], f"{zp}.{key}.pin_memory")
    values["pin_memory"] = pin
    if "zero_force_ds_cpu_optimizer" in config:
        values["force_ds_cpu_optimizer"] = _flag(
            config["zero_force_ds_cpu_optimizer"], f"{prefix}.zero_force_ds_cpu_optimizer"
        )
    for key in ("fp16", "bf16"):
        section = _section(config, key, f"{prefix}.{key}")
        if "enabled" in section:
            values[key] = _flag(section["enabled"], f"{prefix}.{key}.enabled")
    comm = config.get("communication_data_type")
    if comm is not None:
        if not isinstance(comm, str) or comm.lower() not in _COMMUNICATION_BYTES:
            raise InputError(
                f"{prefix}.communication_data_type",
                f"must be one of {', '.join(_COMMUNICATION_BYTES)}",
            )
        values["communication_bytes"] = _COMMUNICATION_BYTES[comm.lower()]
    if "train_micro_batch_size_per_gpu" in config:
        values["micro_batch"] = whole(
            config["train_micro_batch_size_per_gpu"], f"{prefix}.train_micro_batch_size_per_gpu", 1
        )
    if "gradient_accumulation_steps" in config:
        values["grad_accumulation"] = whole(
            config["gradient_accumulation_steps"], f"{prefix}.gradient_accumulation_steps", 1
        )
    return Knobs(**values, extra=config)


def with_offload(setup: TrainingSetup, knobs: Knobs) -> Knobs:
    """``knobs`` with the request's offload devices where the config leaves them unset."""
    opt = knobs.offload_optimizer
    if opt is None and setup.offload.optimizer is not OffloadDevice.NONE:
        opt = setup.offload.optimizer
    par = knobs.offload_param
    if par is None and setup.offload.params is not OffloadDevice.NONE:
        par = setup.offload.params
    return replace(knobs, offload_optimizer=opt, offload_param=par)


def param_list(setup: TrainingSetup) -> tuple[Sequence[ParamTensor], bool]:
    """The device's parameters in ``named_parameters`` order, and whether they are tensors.

    An architecture gives its tensors; a bare count gives those of the dense decoder Ψ implies
    (``calculators.parameters.implied_decoder``). Otherwise (tp or pp > 1, or Ψ below the
    smallest implied shape) Ψ per device is one run of elements, and the second value is False.
    """
    if setup.tp * setup.pp == 1:
        if setup.architecture is not None:
            return architecture_params(setup.architecture), True
        implied = implied_params(setup.params)
        if implied is not None:
            return implied, True
    return (ParamTensor("model", (setup.params_per_device,)),), False
