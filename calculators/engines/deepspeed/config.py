"""The DeepSpeed config values the model reads, and the parameters DeepSpeed is given.

Defaults are DeepSpeed 0.19.8's (``deepspeed/runtime/zero/config.py``; paths relative to
``deepspeed/runtime/``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from calculators.architecture import Architecture, PositionEmbedding
from calculators.config_resolution import (
    CONFIG,
    Decided,
    Requested,
    Resolved,
    contradiction,
    decided_stages,
)
from calculators.conventions import (
    FP32_BYTES,
    HALF_BYTES,
    OffloadDevice,
    Optimizer,
    Precision,
    Stage,
)
from calculators.engines.torch.config import ENGINE_KEYS
from calculators.engines.torch.peak import CONVERT_OUTPUTS, TRAINER_LOOP
from calculators.errors import InputError
from calculators.model_states import Offload, TrainingSetup
from calculators.parameters import ParamTensor, architecture_params, implied_params

DEFAULT_LEAF_CLASSES = (
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
)
"""zero/leaf_module_config.py DEFAULT_LEAF_MODULE_CLASSES: ZeRO-3 fetches these MoE blocks
whole unless the config's ``leaf_module.classes`` says otherwise."""


@dataclass(frozen=True)
class ModelSteps:
    """The modules transformers' modelling code runs that own none of the listed parameters,
    each a step of the trace all the same (a pre-forward hook fetches nothing, then prefetches):
    ``XForCausalLM`` holds ``model`` (the embedding, the rotary embedding, the layers, the final
    norm) and ``lm_head``; the model calls ``rotary_emb`` after the embedding, once per kind of
    rotary embedding (Gemma-3: one per layer type), in forward only (its output needs no
    gradient, so no backward hook fires); each gated MLP calls ``act_fn`` after ``gate_proj``
    (Phi-3: after the fused ``gate_up_proj``); a tied ``lm_head`` is a step that holds the
    embedding's parameter, already counted with the embedding. Step counts matter: every
    step prefetches, so they decide how far ahead of the walk the prefetcher is when a
    parameter is released.

    The experts of transformers' MoE blocks call ``act_fn`` once (``grouped_mm``, the default
    experts implementation), and Phi-3's layers pass each sublayer's output through a dropout
    module.

    Attributes:
        rotary: rotary embedding calls after the token embedding.
        tied_head: ``lm_head`` shares the embedding's weight (no parameter of its own listed).
        residual_dropout: a dropout step after each layer's attention and after its MLP.
    """

    rotary: int
    tied_head: bool
    residual_dropout: bool = False


def model_steps(arch: Architecture | None) -> ModelSteps | None:
    """The parameterless steps of ``arch``'s transformers modelling code (``None``: the
    canonical module, whose every module owns a listed parameter or contains one)."""
    if arch is None or arch.modelling is None:
        return None
    m = arch.modelling
    rotary = m.rope_kinds if arch.position_embedding is PositionEmbedding.ROPE else 0
    return ModelSteps(rotary, arch.tied_embeddings, m.residual_dropout)


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
    # zero_optimization.leaf_module (zero/leaf_module_config.py): the modules ZeRO-3 fetches
    # whole, by class, by name, by name suffix
    leaf_classes: tuple[str, ...] = DEFAULT_LEAF_CLASSES
    leaf_names: tuple[str, ...] = ()
    leaf_suffixes: tuple[str, ...] = ()
    # the layers whose MoE block those name, once the architecture is known (stage3.leaf_layers)
    leaves: frozenset[int] = frozenset()
    # the modelling code's modules that own no listed parameter, once the architecture is
    # known (model_steps)
    steps: ModelSteps | None = None
    # every decoder layer runs its forward again in backward (full activation checkpointing:
    # transformers' gradient checkpointing), once the batch is known
    recompute: bool = False
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


def _strings(value: Any, where: str) -> tuple[str, ...]:
    """A string or a list of strings (leaf_module_config.py _coerce_container_types)."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(where, "must be a string or a list of strings")
    return tuple(dict.fromkeys(value))


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
    leaf = _section(zero, "leaf_module", f"{zp}.leaf_module")
    for key, attr in (("classes", "leaf_classes"), ("names", "leaf_names")):
        if key in leaf:
            values[attr] = _strings(leaf[key], f"{zp}.leaf_module.{key}")
    if "name_suffixes" in leaf:
        values["leaf_suffixes"] = _strings(leaf["name_suffixes"], f"{zp}.leaf_module.name_suffixes")
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


_KNOB_NAMES = frozenset(f.name for f in fields(Knobs))


def knobs_with(knobs: Knobs, **changes: Any) -> Knobs:
    """``dataclasses.replace(knobs, **changes)`` without running ``__init__`` over every field
    again (a shallow copy, as ``replace`` makes: ``Knobs`` has no ``__post_init__``), read a few
    times per answer; a name that is not a field is refused as ``replace`` refuses it."""
    unknown = changes.keys() - _KNOB_NAMES
    if unknown:
        raise TypeError(f"Knobs has no field {sorted(unknown)[0]!r}")
    copy = object.__new__(Knobs)
    values = copy.__dict__
    values.update(knobs.__dict__)
    values.update(changes)
    return copy


def with_offload(setup: TrainingSetup, knobs: Knobs) -> Knobs:
    """``knobs`` with the request's offload devices where the config leaves them unset."""
    opt = knobs.offload_optimizer
    if opt is None and setup.offload.optimizer is not OffloadDevice.NONE:
        opt = setup.offload.optimizer
    par = knobs.offload_param
    if par is None and setup.offload.params is not OffloadDevice.NONE:
        par = setup.offload.params
    return knobs_with(knobs, offload_optimizer=opt, offload_param=par)


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


# --- reading a whole config: what it decides, "auto" resolved as transformers' Trainer does ------

# transformers/integrations/deepspeed.py HfTrainerDeepSpeedConfig.trainer_config_finalize: the
# zero_optimization keys whose "auto" comes from the model's hidden size (the stage-3 ones only
# when the config's stage is 3, ``is_zero3()``).
_TRAINER = "transformers Trainer"
_HIDDEN_FILLS: dict[str, tuple[Callable[[int], int], str, bool]] = {
    # key: (value from hidden_size, in words, filled only when the config's stage is 3)
    "zero_optimization.reduce_bucket_size": (lambda h: h * h, "hidden_size²", False),
    "zero_optimization.stage3_prefetch_bucket_size": (
        lambda h: int(0.9 * h * h),
        "int(0.9 × hidden_size²)",
        True,
    ),
    "zero_optimization.stage3_param_persistence_threshold": (
        lambda h: 10 * h,
        "10 × hidden_size",
        True,
    ),
}
# Keys the Trainer fills from TrainingArguments that no figure here depends on
# (trainer_config_process / trainer_config_finalize).
_NO_EFFECT_AUTO = {
    "gradient_clipping": "max_grad_norm",
    "optimizer.params.lr": "learning_rate",
    "optimizer.params.betas": "adam_beta1, adam_beta2",
    "optimizer.params.eps": "adam_epsilon",
    "optimizer.params.weight_decay": "weight_decay",
    "scheduler.params.warmup_min_lr": "0",
    "scheduler.params.warmup_max_lr": "learning_rate",
    "scheduler.params.total_num_steps": "num_training_steps",
    "scheduler.params.warmup_num_steps": "warmup_steps",
}
# DeepSpeed's optimizer names (runtime/config.py ADAM_OPTIMIZER, ADAMW_OPTIMIZER): both keep
# exp_avg and exp_avg_sq, as torch.optim.Adam/AdamW do.
_OPTIMIZER_TYPES = {"adam": Optimizer.ADAM, "adamw": Optimizer.ADAMW}
_SECTIONS = {"fp16": Precision.MIXED_FP16, "bf16": Precision.MIXED_BF16}
_DROPPED = (
    'DeepSpeed drops "auto" and keeps its default (runtime/config_utils.py DeepSpeedConfigModel)'
)


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _autos(node: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of the values that are "auto"."""
    if not isinstance(node, Mapping):
        return []
    out = []
    for k, v in node.items():
        if v == "auto":
            out.append((*path, k))
        else:
            out.extend(_autos(v, (*path, k)))
    return out


def _node(body: dict[str, Any], path: tuple[str, ...]) -> tuple[dict[str, Any], str]:
    *parents, leaf = path
    node = body
    for p in parents:
        node = node[p]
    return node, leaf


def _default_of(key: str) -> Any:
    """DeepSpeed's default of a zero_optimization key the memory model reads (Knobs)."""
    leaf = key.removeprefix("zero_optimization.")
    attr = _INT_KNOBS.get(leaf) or _BOOL_KNOBS.get(leaf)
    return None if attr is None else getattr(Knobs(), attr)


class _Reader:
    """One pass over a DeepSpeed config body for one request."""

    def __init__(self, config: Mapping[str, Any], req: Requested) -> None:
        self.body: dict[str, Any] = _copy(config)
        self.req = req
        self.values: list[Resolved] = []
        self.notes: list[str] = []
        self.stage_auto = False  # zero_optimization.stage is "auto" (accelerate fills it)

    def note(self, key: str, value: Any, source: str) -> None:
        self.values.append(Resolved(key, value, source))

    def set(self, key: str | tuple[str, ...], value: Any) -> None:
        node, leaf = _node(self.body, tuple(key.split(".")) if isinstance(key, str) else key)
        node[leaf] = value

    def drop(self, key: str | tuple[str, ...]) -> None:
        node, leaf = _node(self.body, tuple(key.split(".")) if isinstance(key, str) else key)
        del node[leaf]

    def request_default(self, field: str) -> str:
        return "" if self.req.given(field) else " (its default)"

    # -- stage ----------------------------------------------------------------------------------

    def stage(self) -> Stage | None:
        zero = _section(self.body, "zero_optimization", f"{CONFIG}.zero_optimization")
        if "stage" not in zero:
            self.note(
                "zero_optimization.stage",
                None,
                "not in the config (DeepSpeed's default is 0): the request's stages are answered",
            )
            return None
        value = zero["stage"]
        if value == "auto":
            self.stage_auto = True
            self.drop("zero_optimization.stage")
            self.note(
                "zero_optimization.stage",
                None,
                "auto: not filled by the transformers Trainer (accelerate fills it from its "
                "zero_stage): the request's stages are answered",
            )
            return None
        number = whole(value, f"{CONFIG}.zero_optimization.stage")
        if number > Stage.PARAMETERS:
            raise InputError(f"{CONFIG}.zero_optimization.stage", "must be 0, 1, 2 or 3")
        return Stage(number)

    # -- precision ------------------------------------------------------------------------------

    def precision(self) -> Precision:
        enabled: dict[str, bool] = {}
        autos = False
        # an "auto" section follows the precision: the request's, or, where the request leaves
        # it out, the one the other section enables explicitly
        follows, how = self.req.precision, f"the request's precision {self.req.precision.value}"
        if not self.req.given("precision"):
            for name, precision in _SECTIONS.items():
                on = _section(self.body, name, f"{CONFIG}.{name}").get("enabled")
                if on is True:
                    follows, how = precision, f"the config's {name} section ({precision.value})"
                    break
            else:
                how += " (its default)"
        for name, precision in _SECTIONS.items():
            section = _section(self.body, name, f"{CONFIG}.{name}")
            if "enabled" not in section:
                continue
            key = f"{name}.enabled"
            if section["enabled"] == "auto":
                autos = True
                on = follows is precision
                self.set(key, on)
                self.note(key, on, f"auto: {how} ({_TRAINER}: args.{name})")
            else:
                on = _flag(section["enabled"], f"{CONFIG}.{key}")
                self.note(key, on, "config")
            enabled[name] = on
        chosen = [name for name, flag in enabled.items() if flag]
        if len(chosen) == 2:
            raise InputError(
                f"{CONFIG}.fp16.enabled",
                "DeepSpeed refuses fp16 and bf16 enabled together (runtime/config.py: "
                "'bfloat16 and fp16 modes cannot be simultaneously enabled')",
                also=(f"{CONFIG}.bf16.enabled",),
            )
        if chosen:
            decided = _SECTIONS[chosen[0]]
            if self.req.given("precision") and self.req.precision is not decided:
                raise contradiction(
                    "precision",
                    f"{chosen[0]}.enabled",
                    f"precision {self.req.precision.value} contradicts the config's {chosen[0]} "
                    f"section ({decided.value})",
                )
            return decided
        if enabled:
            # fp16 / bf16 sections present, none enabled: DeepSpeed trains in fp32
            key = next(iter(enabled))
            if self.req.given("precision"):
                raise contradiction(
                    "precision",
                    f"{key}.enabled",
                    f"precision {self.req.precision.value} contradicts the config, which "
                    "enables neither fp16 nor bf16 (DeepSpeed then trains in fp32)",
                )
            hint = (
                f' ("auto" follows precision, {self.req.precision.value} by default: send '
                "precision mixed_fp16 or mixed_bf16 to pick the section)"
                if autos
                else ""
            )
            raise InputError(
                f"{CONFIG}.{key}.enabled",
                "the config enables neither fp16 nor bf16, so DeepSpeed trains in fp32, which "
                f"the deepspeed engine does not model (it models the fp16 and bf16 sections){hint}",
            )
        if self.req.precision not in _SECTIONS.values():
            return self.req.precision  # the engine model refuses it, naming precision
        name = next(k for k, v in _SECTIONS.items() if v is self.req.precision)
        self.note(
            f"{name}.enabled",
            True,
            f"request: precision {self.req.precision.value}"
            f"{self.request_default('precision')}; the config has no fp16 or bf16 section",
        )
        return self.req.precision

    # -- offload --------------------------------------------------------------------------------

    def offload(self, stages: tuple[Stage, ...], trim: bool) -> tuple[Offload, Stage]:
        """The offload devices, and the lowest stage they allow (``trim``: stages below it
        may be left out rather than refused)."""
        zero = _section(self.body, "zero_optimization", f"{CONFIG}.zero_optimization")
        devices = {}
        lowest = Stage.NONE
        for key, part, least in (
            ("offload_optimizer", "optimizer", Stage.OPTIMIZER),
            ("offload_param", "params", Stage.PARAMETERS),
        ):
            path = f"zero_optimization.{key}.device"
            asked: OffloadDevice = getattr(self.req.offload, part)
            section = _section(zero, key, f"{CONFIG}.zero_optimization.{key}")
            if section.get("device") == "auto":
                self.drop(path)
                self.note(path, "none", f"auto: not filled by the {_TRAINER}; {_DROPPED}")
                section = {}
            if "device" not in section:
                self.note(
                    path,
                    asked.value,
                    f"request: offload.{part}{self.request_default(f'offload.{part}')}",
                )
                devices[part] = asked
                continue
            device = _offload_device(section, f"{CONFIG}.zero_optimization.{key}")
            device = device or OffloadDevice.NONE
            if self.req.given(f"offload.{part}") and asked is not device:
                raise contradiction(
                    f"offload.{part}",
                    path,
                    f"offload.{part} {asked.value} contradicts the config's device {device.value}",
                )
            low = [s for s in stages if s < least]
            if device is not OffloadDevice.NONE and low and not trim:
                why = (
                    f"{key} to {device.value} is modelled from ZeRO stage {int(least)} on; "
                    f"stage {int(low[0])} is asked for"
                )
                if self.req.given("stages") or "stage" not in zero:
                    raise contradiction("stages", path, why)
                raise InputError(
                    f"{CONFIG}.{path}", why, also=(f"{CONFIG}.zero_optimization.stage",)
                )
            if device is not OffloadDevice.NONE:
                lowest = max(lowest, least)
            self.note(path, device.value, "config")
            devices[part] = device
        return Offload(optimizer=devices["optimizer"], params=devices["params"]), lowest

    # -- optimizer ------------------------------------------------------------------------------

    def optimizer(self) -> Optimizer:
        section = _section(self.body, "optimizer", f"{CONFIG}.optimizer")
        kind = section.get("type")
        if kind is None:
            return self.req.optimizer
        if not isinstance(kind, str) or kind.lower() not in _OPTIMIZER_TYPES:
            raise InputError(
                f"{CONFIG}.optimizer.type",
                "not modelled: the deepspeed engine models Adam and AdamW "
                "(or leave the optimizer section out for a client torch optimizer)",
            )
        decided = _OPTIMIZER_TYPES[kind.lower()]
        if self.req.given("optimizer") and self.req.optimizer is not decided:
            raise contradiction(
                "optimizer",
                "optimizer.type",
                f"optimizer {self.req.optimizer.value} contradicts the config's {kind}",
            )
        self.note("optimizer.type", kind, "config")
        self.notes.append(
            "the config's optimizer section makes DeepSpeed build its own Adam (FusedAdam, or "
            "DeepSpeedCPUAdam with optimizer offload): the same two fp32 states per parameter "
            "as the client torch.optim.Adam the figures model; FusedAdam allocates no foreach "
            "temporary, so a peak at the optimizer step may be overstated by adam_foreach_temp"
        )
        return decided

    # -- batch ----------------------------------------------------------------------------------

    def batch(self) -> tuple[int | None, int, int | None]:
        """Micro-batch, accumulation and global batch, as runtime/config.py
        _set_batch_related_parameters and _batch_assertion settle them."""
        req, dp = self.req, self.req.dp
        sources: dict[str, str] = {}
        got: dict[str, int | None] = {}
        keys = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
        for key in keys:
            value = self.body.get(key)
            if value is None or value == "auto":
                got[key] = None
                continue
            got[key] = whole(value, f"{CONFIG}.{key}", 1)
            sources[key] = "config"
        mb_key, ga_key, tb_key = keys
        # auto: transformers Trainer's trainer_config_process (fill_match)
        if self.body.get(mb_key) == "auto" and req.micro_batch is not None:
            got[mb_key] = req.micro_batch
            sources[mb_key] = (
                f"auto: batch.micro_batch_size{self.request_default('batch.micro_batch_size')} "
                f"({_TRAINER}: per_device_train_batch_size)"
            )
        if self.body.get(ga_key) == "auto":
            got[ga_key] = req.grad_accumulation
            sources[ga_key] = (
                f"auto: the request's {req.grad_accumulation_field}"
                f"{self.request_default(req.grad_accumulation_field)} ({_TRAINER}: "
                "gradient_accumulation_steps)"
            )
        micro, steps = got[mb_key], got[ga_key]
        if self.body.get(tb_key) == "auto" and micro is not None and steps is not None:
            got[tb_key] = dp * micro * steps
            sources[tb_key] = (
                f"auto: dp × train_micro_batch_size_per_gpu × gradient_accumulation_steps "
                f"({_TRAINER})"
            )
        # explicit request values must agree with the config; they fill what it leaves out
        explicit_mb = req.given("batch.micro_batch_size")
        if got[mb_key] is not None and explicit_mb and got[mb_key] != req.micro_batch:
            raise contradiction(
                "batch.micro_batch_size",
                mb_key,
                f"batch.micro_batch_size {req.micro_batch} contradicts the config's {got[mb_key]}",
            )
        if got[mb_key] is None and req.micro_batch is not None:
            got[mb_key] = req.micro_batch
            sources[mb_key] = "request: batch.micro_batch_size" + self.request_default(
                "batch.micro_batch_size"
            )
        explicit_ga = req.given(req.grad_accumulation_field)
        if got[ga_key] is not None and explicit_ga and got[ga_key] != req.grad_accumulation:
            raise contradiction(
                req.grad_accumulation_field,
                ga_key,
                f"{req.grad_accumulation_field} {req.grad_accumulation} contradicts the "
                f"config's {got[ga_key]}",
            )
        if got[ga_key] is None and explicit_ga:
            got[ga_key] = req.grad_accumulation
            sources[ga_key] = f"request: {req.grad_accumulation_field}"
        mb, ga, tb = got[mb_key], got[ga_key], got[tb_key]
        derived = "derived by DeepSpeed (runtime/config.py _set_batch_related_parameters)"
        if tb is not None and mb is not None and ga is None:
            ga = tb // mb // dp
            sources[ga_key] = f"{derived}: train_batch_size // micro-batch // dp"
        elif tb is not None and ga is not None and mb is None:
            mb = tb // dp // ga
            sources[mb_key] = f"{derived}: train_batch_size // dp // gradient_accumulation_steps"
        elif mb is not None and ga is not None and tb is None:
            tb = mb * ga * dp
            sources[tb_key] = f"{derived}: micro-batch × gradient_accumulation_steps × dp"
        elif tb is not None and mb is None and ga is None:
            ga, mb = 1, tb // dp
            sources[ga_key] = f"{derived}: 1 when only train_batch_size is given"
            sources[mb_key] = f"{derived}: train_batch_size // dp"
        elif mb is not None and tb is None and ga is None:
            ga, tb = 1, mb * dp
            sources[ga_key] = f"{derived}: 1 when only the micro-batch is given"
            sources[tb_key] = f"{derived}: micro-batch × dp"
        if (
            tb is not None
            and mb is not None
            and ga is not None
            and (min(tb, mb, ga) < 1 or tb != mb * ga * dp)
        ):
            raise InputError(
                f"{CONFIG}.{tb_key}",
                f"{tb} is not train_micro_batch_size_per_gpu {mb} × gradient_accumulation_steps "
                f"{ga} × dp {dp}; DeepSpeed refuses it (runtime/config.py _batch_assertion)",
                also=(
                    *(
                        f"{CONFIG}.{k}" if sources[k] == "config" else name
                        for k, name in (
                            (mb_key, "batch.micro_batch_size"),
                            (ga_key, req.grad_accumulation_field),
                        )
                        if sources.get(k, "").startswith(("config", "request"))
                    ),
                    "dp",
                ),
            )
        if ga is None:
            ga = req.grad_accumulation
            sources[ga_key] = f"request: {req.grad_accumulation_field} (its default)"
        for key, value in ((mb_key, mb), (ga_key, ga), (tb_key, tb)):
            if value is not None:
                if key in self.body:
                    self.body[key] = value
                self.note(key, value, sources[key])
            elif self.body.get(key) == "auto":
                del self.body[key]
                self.note(
                    key,
                    None,
                    "auto: needs batch.micro_batch_size (give a batch); without one no "
                    "activations are estimated and the micro-batch changes no figure",
                )
        return mb, ga, tb

    # -- knobs ----------------------------------------------------------------------------------

    def knobs(self, stage3: bool, only: Stage | None) -> None:
        """Hidden-size "auto" keys as the Trainer fills them; other "auto" keys dropped as
        DeepSpeed drops them; then every knob the model reads, with its source (``only``: the
        one stage answered, which decides overlap_comm's default)."""
        hidden = self.req.hidden
        dropped: dict[str, str] = {}  # knobs whose "auto" DeepSpeed drops: how, by key
        for path in _autos(self.body):
            key = ".".join(path)
            fill = _HIDDEN_FILLS.get(key)
            if fill is not None and (stage3 or not fill[2]):
                rule, words = fill[0], fill[1]
                if hidden is None:
                    raise InputError(
                        f"{CONFIG}.{key}",
                        f'"auto" is {words} as the {_TRAINER} fills it, and a bare parameter '
                        "count has no hidden size: give model.architecture, preset or hf_config, "
                        "or a number",
                    )
                self.set(path, rule(hidden))
                self.note(key, rule(hidden), f"auto: {words} ({_TRAINER}), hidden_size {hidden}")
            elif fill is not None:
                self.drop(path)
                dropped[key] = f"auto: the {_TRAINER} fills it only for stage 3; {_DROPPED}"
            elif key in _NO_EFFECT_AUTO:
                self.drop(path)
                self.note(
                    key,
                    None,
                    f"auto: the {_TRAINER} fills it from TrainingArguments "
                    f"({_NO_EFFECT_AUTO[key]}); no effect on memory or traffic",
                )
            elif _default_of(key) is not None or key == "zero_optimization.overlap_comm":
                self.drop(path)
                dropped[key] = f"auto: not filled by the {_TRAINER}; {_DROPPED}"
            elif key in (*ENGINE_KEYS, TRAINER_LOOP, CONVERT_OUTPUTS):
                raise InputError(
                    f"{CONFIG}.{key}",
                    'this key is read by the service, not by DeepSpeed or the Trainer: "auto" '
                    "is not one of its values",
                )
            else:
                self.drop(path)
                self.note(
                    key,
                    None,
                    f"auto: not filled by the {_TRAINER}; {_DROPPED}; nothing modelled here "
                    "reads it",
                )
        zero = _section(self.body, "zero_optimization", f"{CONFIG}.zero_optimization")
        seen = {v.key for v in self.values}
        for leaf, attr in {**_INT_KNOBS, **_BOOL_KNOBS}.items():
            key = f"zero_optimization.{leaf}"
            if key in seen:
                continue
            if leaf in zero and zero[leaf] is not None:
                value = zero[leaf]
                self.note(
                    key, whole(value, f"{CONFIG}.{key}") if leaf in _INT_KNOBS else value, "config"
                )
            elif leaf == "overlap_comm":
                self.note(
                    key,
                    None if only is None else only is Stage.PARAMETERS,
                    dropped.get(key, "DeepSpeed default")
                    + ": true for stage 3, false below (zero/config.py)",
                )
            else:
                self.note(
                    key,
                    getattr(Knobs(), attr),
                    dropped.get(key, "DeepSpeed default") + " (zero/config.py)",
                )
        granularity = zero.get("stage3_module_granularity_threshold")
        if isinstance(granularity, (int, float)) and granularity > 0:
            self.notes.append(
                "zero_optimization.stage3_module_granularity_threshold > 0 makes DeepSpeed pick "
                "further leaf modules by their parameters per descendant "
                "(parameter_offload.py _set_z3_leaf_modules_by_threshold): not modelled; the "
                "stage-3 figures take only the MoE blocks leaf_module names as leaves"
            )


def resolve_config(config: Mapping[str, Any], req: Requested) -> Decided:
    """What a DeepSpeed config body decides for one request.

    The config decides the stage, fp16/bf16, offload, the optimizer, the micro-batch and
    accumulation and every ZeRO knob; the request fills what it leaves out. ``"auto"`` values are
    resolved as transformers' Trainer resolves them (``HfTrainerDeepSpeedConfig``
    ``trainer_config_process`` / ``trainer_config_finalize``): bucket sizes from the model's
    hidden size, the batch from the request's batch; the ones the Trainer leaves are dropped, as
    DeepSpeed drops them.

    Raises:
        InputError: a request field set explicitly that contradicts the config (naming both), a
            value DeepSpeed refuses, or an ``"auto"`` that needs what the request lacks.
    """
    if not isinstance(config, Mapping):
        raise InputError(CONFIG, "must be an object")
    reader = _Reader(config, req)
    stage = reader.stage()
    stages, how = decided_stages(req, stage, "zero_optimization.stage")
    if stage is not None:
        reader.note("zero_optimization.stage", int(stage), how)
    precision = reader.precision()
    trim = stage is None and not req.given("stages")
    offload, lowest = reader.offload(stages, trim)
    if trim and any(s < lowest for s in stages):
        stages = tuple(s for s in stages if s >= lowest)
        reader.notes.append(
            f"stages below {int(lowest)} left out: the config's offload is modelled from ZeRO "
            f"stage {int(lowest)} on"
        )
    optimizer = reader.optimizer()
    micro, accumulation, train = reader.batch()
    # the Trainer fills the stage-3 keys when the config's stage is 3 (is_zero3()); a stage
    # "auto" is filled by accelerate first, with the stage the request answers here
    reader.knobs(
        stage is Stage.PARAMETERS or (reader.stage_auto and Stage.PARAMETERS in stages),
        stages[0] if len(stages) == 1 else None,
    )
    parse_config(reader.body)  # every value left is one the model reads or ignores
    if _autos(config) and TRAINER_LOOP not in config and "holds_outputs" not in config:
        reader.notes.append(
            'the config has "auto" values, which transformers\' Trainer or accelerate fills: the '
            "figures assume a loop that keeps its last outputs between steps (a loop written "
            "for accelerate); transformers' Trainer keeps the loss alone, for which a "
            f"transformers model's request sends engine_config.{TRAINER_LOOP}: true (a lower "
            "peak)"
        )
    return Decided(
        config=reader.body,
        stages=stages,
        stage=stage,
        precision=precision,
        offload=offload,
        optimizer=optimizer,
        micro_batch=micro,
        grad_accumulation=accumulation,
        train_batch=train,
        values=tuple(reader.values),
        notes=tuple(reader.notes),
    )
