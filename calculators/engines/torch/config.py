"""The FSDP2 settings users write, read for the torch engine: what they decide, what is refused.

Accepted spellings: ``fully_shard``'s own arguments (torch/distributed/fsdp/_fully_shard,
torch 2.11: ``reshard_after_forward``, ``mp_policy`` / ``mixed_precision`` as
``MixedPrecisionPolicy(param_dtype, reduce_dtype, output_dtype, cast_forward_inputs)``,
``offload_policy``) and accelerate's ``fsdp_config`` keys (``fsdp_version``,
``fsdp_reshard_after_forward``, ``fsdp_sharding_strategy``, ``fsdp_offload_params``,
``fsdp_auto_wrap_policy``, ``fsdp_activation_checkpointing``, ...), at the top level or inside an
``fsdp_config`` object.

What the torch engine models: ``fully_shard`` on every block then the root, reshard after
forward True (stage 3) or False (stage 2), ``MixedPrecisionPolicy(param_dtype=bf16 or fp16,
reduce_dtype=fp32 or the param dtype)`` or none (fp32), with or without ``CPUOffloadPolicy``
(offload ``params`` and ``optimizer`` to the CPU: FSDP2 keeps the shards, their gradients and so
the optimizer's states in host memory). Anything else is refused naming its key.

``convert_outputs_to_fp32`` says whether the loop goes through accelerate's mixed-precision
wrapper of forward (an fp32 copy of the logits returned): set by the config, or true where the
config carries accelerate's ``fsdp_*`` keys and the precision is mixed.

A policy that reduces in the 16-bit param dtype (``reduce_dtype`` equal to ``param_dtype``, or
null, which FSDP2 reads as the gradients' dtype) is passed on to the engine model as
``reduce_dtype`` in the decided body (:func:`reduce_bytes` reads it): the reduce-scatter then
runs in 16 bits and each reduced shard is cast to the fp32 parameters' dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calculators.config_resolution import (
    CONFIG,
    Decided,
    Requested,
    Resolved,
    contradiction,
    decided_stages,
)
from calculators.conventions import FP32_BYTES, HALF_BYTES, OffloadDevice, Precision, Stage
from calculators.engines.torch.peak import CONVERT_OUTPUTS, TRAINER_LOOP
from calculators.errors import InputError
from calculators.model_states import Offload

# Keys the torch engine model itself reads (calculators.engines.torch.memory / peak / traffic).
ENGINE_KEYS = (
    "holds_outputs",
    "cublas_workspace_bytes",
    "cublaslt_workspace_bytes",
    "compute_capability_major",
    "tensors",
    "fsdp_root_reshard_after_forward",
    "caching_allocator",
)
# accelerate fsdp_config keys that change nothing in the step modelled here (checkpoint format,
# how weights are loaded, FSDP1-only prefetch and flattening switches).
NO_EFFECT_KEYS = (
    "fsdp_state_dict_type",
    "fsdp_cpu_ram_efficient_loading",
    "fsdp_sync_module_states",
    "fsdp_use_orig_params",
    "fsdp_backward_prefetch",
    "fsdp_forward_prefetch",
    "fsdp_transformer_layer_cls_to_wrap",
    "cast_forward_inputs",
)
# accelerate's FSDP sharding strategies (utils/constants.py FSDP_SHARDING_STRATEGY), by name and
# by the 1-based number accelerate also accepts; None: not modelled.
_STRATEGIES: dict[str, Stage | None] = {
    "FULL_SHARD": Stage.PARAMETERS,
    "SHARD_GRAD_OP": Stage.GRADIENTS,
    "NO_SHARD": None,
    "HYBRID_SHARD": None,
    "HYBRID_SHARD_ZERO2": None,
}
_STRATEGY_WHY = {
    "NO_SHARD": "NO_SHARD replicates every state inside FSDP, which the torch engine does not "
    "model (its stage 0 is DistributedDataParallel)",
    "HYBRID_SHARD": "hybrid sharding (shard within a group, replicate across) is not modelled "
    "for memory; /v1/communication models its traffic with shard_group_size",
}
_STRATEGY_WHY["HYBRID_SHARD_ZERO2"] = _STRATEGY_WHY["HYBRID_SHARD"]
_DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "torch.bfloat16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "torch.float16": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "torch.float32": "float32",
}
_MIXED = {"bfloat16": Precision.MIXED_BF16, "float16": Precision.MIXED_FP16}
_HALF_OF = {mixed: name for name, mixed in _MIXED.items()}
# The decided body's key for a 16-bit reduce (absent: FSDP2 reduces in fp32 under a mixed
# precision, in the parameters' dtype otherwise); also the policy field's top-level spelling.
REDUCE_DTYPE = "reduce_dtype"
_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP",)


def _flatten(config: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """Every key with the path the user wrote it at (``fsdp_config.X`` or ``X``)."""
    out: dict[str, tuple[str, Any]] = {}
    for key, value in config.items():
        if key == "fsdp_config":
            if not isinstance(value, Mapping):
                raise InputError(f"{CONFIG}.fsdp_config", "must be an object")
            for inner, v in value.items():
                if inner in out:
                    raise InputError(f"{CONFIG}.{inner}", "given twice (here and in fsdp_config)")
                out[inner] = (f"fsdp_config.{inner}", v)
        else:
            if key in out:
                raise InputError(f"{CONFIG}.{key}", "given twice (here and in fsdp_config)")
            out[key] = (key, value)
    return out


def through_accelerate(config: Mapping[str, Any]) -> bool:
    """Whether a torch engine config is accelerate's: it carries accelerate's ``fsdp_*`` keys
    (at the top level or inside ``fsdp_config``)."""
    return any(k.startswith("fsdp_") and k not in ENGINE_KEYS for k in _flatten(config))


def _strategy(value: Any, where: str) -> Stage:
    name = value
    if isinstance(value, int) and not isinstance(value, bool):
        names = list(_STRATEGIES)
        name = names[value - 1] if 1 <= value <= len(names) else None
    elif isinstance(value, str) and value.isdigit():
        return _strategy(int(value), where)
    if not isinstance(name, str) or name.upper() not in _STRATEGIES:
        raise InputError(
            f"{CONFIG}.{where}", f"must be one of {', '.join(_STRATEGIES)} (or 1-5 as accelerate)"
        )
    stage = _STRATEGIES[name.upper()]
    if stage is None:
        raise InputError(f"{CONFIG}.{where}", f"not modelled: {_STRATEGY_WHY[name.upper()]}")
    return stage


def _reshard(value: Any, where: str) -> Stage:
    if isinstance(value, bool):
        return Stage.PARAMETERS if value else Stage.GRADIENTS
    if isinstance(value, int):
        raise InputError(
            f"{CONFIG}.{where}",
            "not modelled: an integer reshards to a smaller group after forward; the torch "
            "engine models true (stage 3) and false (stage 2)",
        )
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return _reshard(value.lower() == "true", where)
        return _strategy(value, where)  # accelerate also takes a sharding strategy here
    raise InputError(f"{CONFIG}.{where}", "must be true or false")


def _dtype(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in _DTYPES:
        raise InputError(f"{CONFIG}.{where}", "must be bfloat16, float16, float32 or null")
    return _DTYPES[value.lower()]


def _is_off(value: Any) -> bool:
    """An offload setting that means no offload (``OffloadPolicy()``, false, none)."""
    return value is None or value is False or value == {} or value in ("none", "no", "")


_CPU_OFFLOAD = ("cpu", "true", "cpuoffloadpolicy")
_CPU_POLICY = "CPUOffloadPolicy (parameters and optimizer states on the CPU)"


def _offloads(value: Any, where: str) -> bool:
    """Whether an offload setting means ``CPUOffloadPolicy`` (true, ``"cpu"``,
    ``"CPUOffloadPolicy"``, ``{"pin_memory": ...}`` with an optional ``"type":
    "CPUOffloadPolicy"``) rather than none."""
    if _is_off(value) or (isinstance(value, str) and value.lower() == "false"):
        return False
    if value is True or (isinstance(value, str) and value.lower() in _CPU_OFFLOAD):
        return True
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"type", "pin_memory", "offload_params"})
        if unknown:
            raise InputError(
                f"{CONFIG}.{where}.{unknown[0]}",
                "not a CPUOffloadPolicy field (pin_memory, and type CPUOffloadPolicy)",
            )
        kind = value.get("type", "CPUOffloadPolicy")
        if not isinstance(kind, str) or kind.lower() not in ("cpuoffloadpolicy", "offloadpolicy"):
            raise InputError(
                f"{CONFIG}.{where}.type", "must be CPUOffloadPolicy (or OffloadPolicy: none)"
            )
        pin = value.get("pin_memory", True)
        if not isinstance(pin, bool):
            raise InputError(f"{CONFIG}.{where}.pin_memory", "must be true or false")
        on = value.get("offload_params", True)  # FSDP1's CPUOffload(offload_params=...)
        if not isinstance(on, bool):
            raise InputError(f"{CONFIG}.{where}.offload_params", "must be true or false")
        return kind.lower() == "cpuoffloadpolicy" and on
    raise InputError(
        f"{CONFIG}.{where}",
        'must be true / false, "cpu" / "none", or a CPUOffloadPolicy object ({"pin_memory": true})',
    )


def offloads(offload: Offload) -> bool:
    """Whether ``offload`` is FSDP2's ``CPUOffloadPolicy`` (parameters on the CPU)."""
    return offload.params is OffloadDevice.CPU


def check_offload(offload: Offload, stage: Stage) -> None:
    """Offload the torch engines run: FSDP2 ``CPUOffloadPolicy``, which keeps the sharded
    parameters, their gradients and (the optimizer stepping them there) its states in host
    memory, at stages 2 and 3."""
    if offload.optimizer is not OffloadDevice.NONE and offload.params is OffloadDevice.NONE:
        raise InputError(
            "offload.optimizer",
            "torch engines offload optimizer state only "
            "with parameters (FSDP2 CPUOffloadPolicy); set offload.params too",
        )
    if OffloadDevice.NVME in (offload.optimizer, offload.params):
        raise InputError("offload", "torch engines offload to CPU only")
    if offload.params is not OffloadDevice.NONE and stage < Stage.GRADIENTS:
        raise InputError(
            "offload.params",
            f"torch offload is FSDP2's CPUOffloadPolicy (stages 2 and 3); stage {int(stage)} "
            "is DDP: remove stages 0 and 1 from stages",
        )


def _offload(req: Requested, found: tuple[str, bool] | None) -> Offload:
    """The offload the request means: the config's ``CPUOffloadPolicy`` (parameters and
    optimizer states on the CPU) where it has a setting, else the request's own, which must
    agree where sent explicitly."""
    if found is None:
        return req.offload
    where, on = found
    device = OffloadDevice.CPU if on else OffloadDevice.NONE
    for part in ("params", "optimizer"):
        asked = getattr(req.offload, part)
        if req.given(f"offload.{part}") and asked is not device:
            raise contradiction(
                f"offload.{part}",
                where,
                f"offload.{part} {asked.value} contradicts the config's "
                + (_CPU_POLICY if on else "no offload"),
            )
    return Offload(optimizer=device, params=device)


def resolve_fsdp_config(config: Mapping[str, Any], req: Requested) -> Decided:
    """What FSDP2 settings decide for one request of the torch engine.

    ``reshard_after_forward`` (or accelerate's ``fsdp_reshard_after_forward`` /
    ``fsdp_sharding_strategy``) decides the stage: true / FULL_SHARD is stage 3, false /
    SHARD_GRAD_OP stage 2. A ``MixedPrecisionPolicy`` decides the precision. A request field set
    explicitly must agree.

    Raises:
        InputError: a setting the torch engine does not model (naming its key), or a request
            field that contradicts the config (naming both).
    """
    if not isinstance(config, Mapping):
        raise InputError(CONFIG, "must be an object")
    flat = _flatten(config)
    values: list[Resolved] = []
    notes: list[str] = []
    body: dict[str, Any] = {}
    stage: Stage | None = None
    stage_key = ""
    precision = req.precision
    checkpointing: bool | None = None
    reduce_from: tuple[str, str | None] | None = None  # (where, 16-bit dtype or None: fp32)
    top_reduce: tuple[str, str | None] | None = None
    offload_from: tuple[str, bool] | None = None  # (where, CPUOffloadPolicy)
    accelerate = through_accelerate(config)
    for key, (where, value) in flat.items():
        if key in ENGINE_KEYS:
            body[key] = value
        elif key in (CONVERT_OUTPUTS, TRAINER_LOOP):  # the loop's switches
            if not isinstance(value, bool):
                raise InputError(f"{CONFIG}.{where}", "must be true or false")
            body[key] = value
            values.append(Resolved(where, value, "config: " + _loop_meaning(key, value)))
        elif key in NO_EFFECT_KEYS:
            values.append(Resolved(where, value, "config; no effect on the modelled step"))
        elif key == "fsdp_version":
            if value not in (2, "2"):
                raise InputError(
                    f"{CONFIG}.{where}",
                    "not modelled: the torch engine models FSDP2 (fully_shard), version 2",
                )
            values.append(Resolved(where, 2, "config"))
        elif key in (
            "reshard_after_forward",
            "fsdp_reshard_after_forward",
            "fsdp_sharding_strategy",
        ):
            found = (
                _strategy(value, where)
                if key == "fsdp_sharding_strategy"
                else _reshard(value, where)
            )
            if stage is not None and found is not stage:
                raise InputError(
                    f"{CONFIG}.{where}",
                    f"contradicts {CONFIG}.{stage_key}",
                    also=(f"{CONFIG}.{stage_key}",),
                )
            stage, stage_key = found, where
            values.append(Resolved(where, value, f"config: stage {int(found)}"))
        elif key in ("mixed_precision", "mp_policy", "mixed_precision_policy"):
            precision, policy_reduce = _mixed_precision(value, where, req, values)
            reduce_from = (f"{where}.reduce_dtype", policy_reduce)
        elif key == REDUCE_DTYPE:
            top_reduce = (where, _dtype(value, where))
        elif key in ("offload_policy", "fsdp_offload_params", "cpu_offload"):
            on = _offloads(value, where)
            if offload_from is not None and offload_from[1] is not on:
                raise InputError(
                    f"{CONFIG}.{where}",
                    f"contradicts {CONFIG}.{offload_from[0]}",
                    also=(f"{CONFIG}.{offload_from[0]}",),
                )
            offload_from = (where, on)
            values.append(
                Resolved(
                    where,
                    value,
                    "config: CPUOffloadPolicy, parameters, gradients and optimizer states on "
                    "the CPU"
                    if on
                    else "config: no offload",
                )
            )
        elif key == "fsdp_auto_wrap_policy":
            if value not in _WRAP_POLICIES:
                raise InputError(
                    f"{CONFIG}.{where}",
                    "not modelled: the torch engine shards each transformer block "
                    "(TRANSFORMER_BASED_WRAP) and then the root",
                )
            values.append(Resolved(where, value, "config"))
        elif key == "fsdp_activation_checkpointing":
            if not isinstance(value, bool):
                raise InputError(f"{CONFIG}.{where}", "must be true or false")
            checkpointing = value
            values.append(
                Resolved(
                    where,
                    value,
                    "config: each block checkpointed (batch.activation_checkpointing full)"
                    if value
                    else "config: no checkpointing applied by FSDP",
                )
            )
        else:
            accepted = (
                "reshard_after_forward, mixed_precision (MixedPrecisionPolicy), offload_policy, "
                f"fsdp_version and accelerate's fsdp_* keys, {CONVERT_OUTPUTS}, {TRAINER_LOOP}, "
                + ", ".join(ENGINE_KEYS)
            )
            raise InputError(
                f"{CONFIG}.{where}", f"not an FSDP2 setting the torch engine reads ({accepted})"
            )
    stages, _ = decided_stages(req, stage, stage_key)
    if offload_from is not None and offload_from[1]:
        low = [s for s in stages if s < Stage.GRADIENTS]
        if low and req.given("stages"):
            raise contradiction(
                "stages",
                offload_from[0],
                f"CPUOffloadPolicy is FSDP2's (stages 2 and 3); stage {int(low[0])} is asked for",
            )
        if low:
            stages = tuple(s for s in stages if s >= Stage.GRADIENTS)
            notes.append(
                "CPUOffloadPolicy is FSDP2's: stages 0 and 1 (DDP) are left out of the answer"
            )
    half = _reduce_in_half(precision, reduce_from, top_reduce)
    if not any(k in flat for k in ("mixed_precision", "mp_policy", "mixed_precision_policy")):
        values.append(Resolved("mixed_precision", None, _precision_from_request(req, half)))
        if half is None and precision.is_mixed and accelerate:
            notes.append(
                "accelerate's FSDP2 plugin, given no mixed_precision_policy, reduces gradients "
                "in the param dtype (MixedPrecisionPolicy(param_dtype=reduce_dtype=bf16 or "
                "fp16), utils/dataclasses.py set_mixed_precision); these figures reduce in "
                'float32: add "reduce_dtype": "bfloat16" (or the fp16 dtype) to model that'
            )
    if accelerate and precision.is_mixed and CONVERT_OUTPUTS not in flat:
        body[CONVERT_OUTPUTS] = True
        values.append(
            Resolved(
                CONVERT_OUTPUTS,
                True,
                "accelerate's fsdp_config keys: the run goes through accelerate, whose "
                "prepare_model wraps forward under bf16/fp16 mixed precision; "
                + _loop_meaning(CONVERT_OUTPUTS, True),
            )
        )
    if body.get(CONVERT_OUTPUTS) and not precision.is_mixed:
        notes.append(
            f"{CONVERT_OUTPUTS}: no effect in {precision.value}: accelerate wraps forward only "
            "under bf16/fp16 mixed precision"
        )
    if half is not None:
        body[REDUCE_DTYPE] = half
    if top_reduce is not None:
        reduced = half or ("float32" if precision.is_mixed else "the parameters' dtype")
        values.append(
            Resolved(
                top_reduce[0], flat[REDUCE_DTYPE][1], f"config: gradients reduced in {reduced}"
            )
        )
    if checkpointing is not None:
        if req.checkpointing_full is None:
            notes.append(
                "fsdp_activation_checkpointing changes activations only; give a batch to "
                "estimate them"
            )
        elif (
            req.given("batch.activation_checkpointing") and req.checkpointing_full != checkpointing
        ):
            raise contradiction(
                "batch.activation_checkpointing",
                next(w for k, (w, _) in flat.items() if k == "fsdp_activation_checkpointing"),
                "contradicts the config's fsdp_activation_checkpointing",
            )
    return Decided(
        config=body,
        stages=stages,
        stage=stage,
        precision=precision,
        offload=_offload(req, offload_from),
        optimizer=req.optimizer,
        micro_batch=req.micro_batch,
        grad_accumulation=req.grad_accumulation,
        train_batch=None
        if req.micro_batch is None
        else req.micro_batch * req.grad_accumulation * req.dp,
        values=tuple(values),
        notes=tuple(notes),
        checkpointing_full=checkpointing,
    )


def _loop_meaning(key: str, on: bool) -> str:
    if key == TRAINER_LOOP:
        if on:
            return "transformers' Trainer keeps the loss alone: the logits die as forward returns"
        return "the loop keeps the model's outputs"
    if on:
        return (
            "forward runs under autocast and returns an fp32 copy of its 16-bit logits "
            "(accelerate's convert_outputs_to_fp32), which the loop then holds"
        )
    return "forward returns its logits in the dtype the model computes them"


def _precision_from_request(req: Requested, half: str | None) -> str:
    """How the request's precision reads as a MixedPrecisionPolicy (stages 2 and 3), reducing
    in ``half`` where the config's ``reduce_dtype`` says so."""
    default = "" if req.given("precision") else " (its default)"
    reduce = half or "float32"
    policy = {
        Precision.MIXED_BF16: f"param_dtype bfloat16, reduce_dtype {reduce}",
        Precision.MIXED_FP16: f"param_dtype float16, reduce_dtype {reduce}",
        Precision.FP32: "none (float32 throughout)",
        Precision.BF16: "none (parameters cast to bfloat16)",
    }[req.precision]
    return (
        f"not in the config: the request's precision {req.precision.value}{default}, "
        f"MixedPrecisionPolicy {policy}"
    )


def _mixed_precision(
    value: Any, where: str, req: Requested, values: list[Resolved]
) -> tuple[Precision, str | None]:
    """The precision a ``MixedPrecisionPolicy`` means for the torch engine, and the 16-bit dtype
    it reduces gradients in (``None``: float32)."""
    if not isinstance(value, Mapping):
        raise InputError(
            f"{CONFIG}.{where}", "must be an object: {param_dtype, reduce_dtype, output_dtype}"
        )
    for key in value:
        if key not in ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs"):
            raise InputError(f"{CONFIG}.{where}.{key}", "not a MixedPrecisionPolicy field")
    param = _dtype(value.get("param_dtype"), f"{where}.param_dtype")
    reduce = _dtype(value.get("reduce_dtype"), f"{where}.reduce_dtype")
    output = _dtype(value.get("output_dtype"), f"{where}.output_dtype")
    half: str | None = None
    if param in (None, "float32"):
        if reduce not in (None, "float32"):
            raise InputError(
                f"{CONFIG}.{where}.reduce_dtype",
                "not modelled: a 16-bit reduce under fp32 parameters",
            )
        decided = Precision.FP32
    elif reduce not in ("float32", None, param):
        raise InputError(
            f"{CONFIG}.{where}.reduce_dtype",
            f"not modelled: the torch engine reduce-scatters gradients in float32 or in the "
            f"param_dtype ({param}), not {reduce}",
        )
    else:
        decided = _MIXED[param]
        half = None if reduce == "float32" else param  # null: the gradients' dtype, param_dtype
    if output not in (None, param if decided.is_mixed else "float32"):
        raise InputError(
            f"{CONFIG}.{where}.output_dtype",
            "not modelled: the torch engine keeps the forward outputs' dtype (output_dtype null, "
            "or the param_dtype the logits already have)",
        )
    if req.given("precision") and req.precision is not decided:
        raise contradiction(
            "precision",
            f"{where}.param_dtype",
            f"precision {req.precision.value} contradicts the config's MixedPrecisionPolicy "
            f"({decided.value})",
        )
    reduces = f", gradients reduced in {half or 'float32'}" if decided.is_mixed else ""
    values.append(Resolved(where, dict(value), f"config: precision {decided.value}{reduces}"))
    return decided, half


def _reduce_in_half(
    precision: Precision,
    policy: tuple[str, str | None] | None,
    top: tuple[str, str | None] | None,
) -> str | None:
    """The 16-bit dtype FSDP2 reduces in under ``precision`` (``None``: float32 under a mixed
    precision; otherwise the parameters' own dtype), from the policy or a top-level
    ``reduce_dtype``, which must agree with each other and with the precision."""
    if top is None:
        return None if policy is None else policy[1]
    where, given = top
    half = _HALF_OF.get(precision)
    if half is None:
        own = "bfloat16" if precision is Precision.BF16 else "float32"
        if given not in (None, own):
            raise InputError(
                f"{CONFIG}.{where}",
                f"not modelled: precision {precision.value} reduces in {own}",
            )
        return None
    if given not in (None, "float32", half):
        raise InputError(
            f"{CONFIG}.{where}",
            f"not modelled: the torch engine reduce-scatters gradients in float32 or in the "
            f"param dtype ({half}), not {given}",
        )
    found = half if given in (None, half) else None
    if policy is not None and policy[1] != found:
        raise InputError(
            f"{CONFIG}.{where}",
            f"contradicts {CONFIG}.{policy[0]}",
            also=(f"{CONFIG}.{policy[0]}",),
        )
    return found


def reduce_bytes(config: Mapping[str, Any], precision: Precision) -> int:
    """Element bytes of FSDP2's reduce-scatter under ``precision`` and the decided body
    ``config``: fp32 under a mixed precision unless ``reduce_dtype`` names its 16-bit dtype;
    the parameters' own dtype otherwise."""
    value = config.get(REDUCE_DTYPE)
    own = {Precision.FP32: "float32", Precision.BF16: "bfloat16"}.get(precision, "float32")
    allowed = {own, _HALF_OF.get(precision, own)}
    name = _dtype(value, REDUCE_DTYPE) if value is not None else own
    if name not in allowed:
        raise InputError(
            f"{CONFIG}.{REDUCE_DTYPE}",
            f"must be one of {', '.join(sorted(allowed))} under precision {precision.value}",
        )
    return FP32_BYTES if name == "float32" else HALF_BYTES
