"""A measure request, checked once: the one reading of a ``POST /v1/measure`` body.

:func:`parse_spec` turns the body (a JSON object, as the route, ``python -m measure`` and the
CLI send it) into a frozen :class:`MeasureSpec` or raises :class:`InputError` naming the field.
The route calls it before queueing, the runner once per job, and every rank receives the parsed
spec itself, so each reads the request under the same rules. No torch here: the service checks
requests on a host without it.
"""

from __future__ import annotations

import copy
import importlib.util
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from calculators.architecture import (
    Activation,
    Architecture,
    Norm,
    PositionEmbedding,
    count_params,
)
from calculators.batch import Batch, Checkpointing
from calculators.capacity import MAX_PARAMS
from calculators.config_resolution import CONFIG, Decided, Requested
from calculators.conventions import Engine, OffloadDevice, Optimizer, Precision, Stage
from calculators.engines.deepspeed.config import resolve_config
from calculators.engines.torch.config import ENGINE_KEYS, check_offload, resolve_fsdp_config
from calculators.engines.torch.peak import TRAINER_LOOP, trainer_loop
from calculators.errors import InputError
from calculators.hf_config import architecture_from_hf_config
from calculators.model_states import Offload
from calculators.presets import get_preset
from calculators.traffic import GradSync
from measure.engines.deepspeed_config import check_precision, deepspeed_config
from measure.mlp_presets import MLPSpec, mlp_preset

MODES = ("simulated", "distributed", "auto")
DEVICES = ("cuda", "cpu", "auto")
DEFAULT_MICRO_BATCH = 1
DEFAULT_SEQ_LEN = 512
# the schema's bounds (app.schemas.measure.MeasureRequest), the same for every caller
STEPS = (1, 100)
WARMUP_STEPS = (1, 20)
MAX_DP = 1 << 20
HF_INSTALL = "pip install 'zerocalc[hf]' (transformers>=5.17,<5.18)"
DEEPSPEED_INSTALL = "pip install 'deepspeed>=0.19' (or use engine torch)"


class ModelKind(StrEnum):
    """Which module a measurement builds."""

    GPT = "gpt"
    """The canonical decoder of calculators.architecture (measure.workloads.GPT)."""
    HF = "hf"
    """The user's Hugging Face model, built by transformers' own modelling code."""
    MLP = "mlp"
    """L x Linear(h, h) + ReLU (measure.mlp_presets)."""


@dataclass(frozen=True)
class ModelChoice:
    """The module to build and what the calculator knows of it.

    Attributes:
        kind: which module is built.
        architecture: the calculator's reading of it (``None`` for the MLP, and for a Hugging
            Face family the calculator cannot read: the prediction then uses the parameter
            count of the built model; ``prediction_note`` says so).
        hf_config: the ``config.json`` body transformers builds (kind ``hf``).
        mlp: the MLP's shape (kind ``mlp``).
        prediction_note: why the prediction knows less than the module, if it does.
    """

    kind: ModelKind
    architecture: Architecture | None = None
    hf_config: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)
    mlp: MLPSpec | None = None
    prediction_note: str | None = None


@dataclass(frozen=True)
class StepPlan:
    """How many steps of each kind one stage runs.

    Attributes:
        warmup_steps: steps before anything is recorded (Adam states and DDP's rebuilt buckets
            appear here).
        steps: timed steps after the recorded one.
        grad_accumulation_steps: micro-batches per optimizer step.
        hold_outputs: keep the last logits and loss referenced between steps, as a loop that
            rebinds them on the next iteration does; otherwise they are deleted.
    """

    warmup_steps: int = 2
    steps: int = 2
    grad_accumulation_steps: int = 1
    hold_outputs: bool = True

    @property
    def total_steps(self) -> int:
        """Optimizer steps one stage runs: warm-up, the recorded one, the timed ones."""
        return self.warmup_steps + 1 + self.steps


@dataclass(frozen=True)
class MeasureSpec:
    """A checked measure request."""

    model: ModelChoice
    dp: int
    stages: tuple[Stage, ...]
    precision: Precision
    optimizer: Optimizer
    mode: str
    device: str
    plan: StepPlan
    batch: Batch | None
    seed: int = 0
    engine: Engine = Engine.TORCH
    offload: Offload = field(default_factory=Offload)
    engine_config: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    allow_slow_cpu: bool = False
    host_probe: bool | None = None  # None: on a GPU only (measure.runner.probe_host)
    grad_sync: GradSync = GradSync.PER_MICRO_STEP
    """When DDP (torch stages 0-1) reduces under accumulation: per_step runs the other
    micro-steps under ``no_sync``."""
    resolved: Decided | None = field(default=None, hash=False, compare=False)
    """What the request's ``engine_config`` decided (None: the request carries none)."""

    @property
    def micro_batch_size(self) -> int:
        return self.batch.micro_batch_size if self.batch else DEFAULT_MICRO_BATCH

    @property
    def seq_len(self) -> int:
        return self.batch.seq_len if self.batch else default_seq_len(self.model)

    @property
    def checkpointing(self) -> Checkpointing:
        return self.batch.activation_checkpointing if self.batch else Checkpointing.NONE

    def ds_config(self, stage: Stage) -> dict[str, Any]:
        """The DeepSpeed config body ``stage`` runs with."""
        return deepspeed_config(
            stage,
            self.precision,
            self.micro_batch_size,
            self.plan.grad_accumulation_steps,
            {"optimizer": self.offload.optimizer.value, "params": self.offload.params.value},
            self.engine_config,
        )


def default_seq_len(model: ModelChoice) -> int:
    """The sequence length a run without a batch trains on: :data:`DEFAULT_SEQ_LEN`, or the
    model's position table where it is shorter."""
    arch = model.architecture
    limit = arch.max_seq_len if arch is not None and arch.max_seq_len else DEFAULT_SEQ_LEN
    if model.hf_config is not None:
        limit = int(model.hf_config.get("max_position_embeddings") or limit)
    return min(DEFAULT_SEQ_LEN, limit)


def _enum(kind: type[Any], value: Any, name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(str(m.value) for m in kind)
        raise InputError(name, f"{value!r} is not one of {allowed}") from None


def _int(body: Mapping[str, Any], key: str, default: int, bounds: tuple[int, int]) -> int:
    value = body.get(key, default)
    if value is None:
        value = default
    lo, hi = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(key, f"must be an integer in {lo}..{hi}")
    return value


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputError(key, "must be true or false")
    return value


def _object(body: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = body.get(key) or {}
    if not isinstance(value, Mapping):
        raise InputError(key, "must be an object")
    return value


def architecture_from_body(body: Any) -> Architecture:
    """The ``model.architecture`` object of a request, its enum fields parsed."""
    if not isinstance(body, Mapping):
        raise InputError("model.architecture", "must be an object")
    enums = {"norm": Norm, "position_embedding": PositionEmbedding, "activation": Activation}
    values = dict(body)
    for key, kind in enums.items():
        if values.get(key) is not None:
            values[key] = _enum(kind, values[key], f"model.architecture.{key}")
    try:
        return Architecture(**values)
    except TypeError as err:
        raise InputError("model.architecture", str(err)) from None


def deepspeed_available() -> bool:
    """Whether ``import deepspeed`` can work here (not imported: it is slow and reads the
    accelerator once)."""
    return importlib.util.find_spec("deepspeed") is not None


def transformers_available() -> bool:
    """Whether transformers can be imported here (not imported: it is slow)."""
    return importlib.util.find_spec("transformers") is not None


def config_values(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` less its ``model_type``, as keyword arguments of transformers' config class: a
    deep copy, since transformers completes nested fields in place (a ``rope_scaling`` gains
    ``rope_theta``), which would change the request the service stores and answers with."""
    return copy.deepcopy({k: v for k, v in cfg.items() if k != "model_type"})


def check_hf_config(cfg: Mapping[str, Any]) -> None:
    """transformers' own reading of ``cfg`` (its config class); a 422 where it refuses.

    Raises:
        InputError: transformers is missing, or the config names no model type it builds.
    """
    if not transformers_available():
        raise InputError(
            "model.hf_config",
            f"measuring a Hugging Face model builds it with transformers: {HF_INSTALL}",
        )
    from transformers import AutoConfig

    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise InputError("model.hf_config.model_type", 'is required (e.g. "llama")')
    try:
        AutoConfig.for_model(model_type, **config_values(cfg))
    except ValueError as err:  # transformers names an unknown model_type in a ValueError
        raise InputError("model.hf_config.model_type", str(err).splitlines()[0][:300]) from None
    except (TypeError, KeyError) as err:
        raise InputError("model.hf_config", f"transformers cannot read it: {err}"[:300]) from None


def _hf_choice(cfg: Any) -> ModelChoice:
    if not isinstance(cfg, Mapping):
        raise InputError("model.hf_config", "must be an object")
    check_hf_config(cfg)
    try:
        arch = architecture_from_hf_config(cfg)
    except InputError as err:
        if not err.field.endswith("model_type"):
            raise InputError(
                err.field.replace("model.architecture", "model.hf_config"), err.message
            ) from None
        # transformers builds it, the calculator cannot read its shape: predict from Ψ
        note = (
            f"the calculator does not read model_type {cfg.get('model_type')!r}: the prediction "
            "uses the built model's parameter count alone (no activations, one tensor layout)"
        )
        return ModelChoice(ModelKind.HF, None, dict(cfg), None, note)
    return ModelChoice(ModelKind.HF, arch, dict(cfg))


def model_choice(model: Any) -> ModelChoice:
    """The module ``model`` names; a plain ``params`` count cannot be built."""
    if not isinstance(model, Mapping):
        raise InputError("model", "must be an object")
    given = [
        k for k in ("params", "architecture", "preset", "hf_config") if model.get(k) is not None
    ]
    if len(given) != 1:
        raise InputError("model", "give exactly one of architecture, preset or hf_config")
    if model.get("params") is not None:
        raise InputError(
            "model",
            "a measurement builds and trains the model: give architecture, preset or "
            "hf_config, not params",
        )
    if model.get("hf_config") is not None:
        return _hf_choice(model["hf_config"])
    if model.get("preset") is not None:
        name = str(model["preset"])
        mlp = mlp_preset(name)
        if mlp is not None:
            return ModelChoice(ModelKind.MLP, mlp=mlp)
        preset = get_preset(name)
        hf = getattr(preset, "hf_config", None)  # a preset that names a Hugging Face family
        if hf is not None:
            return _hf_choice(hf)
        return ModelChoice(ModelKind.GPT, preset.architecture)
    arch = architecture_from_body(model["architecture"])
    if count_params(arch) > MAX_PARAMS:
        raise InputError(
            "model", f"the architecture counts {count_params(arch)} parameters, over {MAX_PARAMS}"
        )
    return ModelChoice(ModelKind.GPT, arch)


def _grad_sync(body: Mapping[str, Any], engine: Engine, stages: tuple[Stage, ...]) -> GradSync:
    sync: GradSync = _enum(GradSync, body.get("grad_sync") or "per_micro_step", "grad_sync")
    if sync is GradSync.PER_STEP:
        if engine is not Engine.TORCH:
            raise InputError(
                "grad_sync", "DeepSpeed reduces as its config says: leave grad_sync out"
            )
        if any(stage >= Stage.GRADIENTS for stage in stages):
            raise InputError(
                "grad_sync",
                "per_step is DDP's no_sync (stages 0 and 1): FSDP2 (stages 2 and 3) reduces on "
                "every micro-step here, since set_requires_gradient_sync(False) would keep "
                "unsharded fp32 gradients that the memory figures do not count",
            )
    return sync


def _batch(body: Any) -> Batch | None:
    if body is None:
        return None
    if not isinstance(body, Mapping):
        raise InputError("batch", "must be an object")
    values: dict[str, int] = {}
    for key, default in (("micro_batch_size", None), ("seq_len", None)):
        value = body.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"batch.{key}", "must be a positive integer")
        values[key] = value
    accumulation = body.get("grad_accumulation_steps") or 1
    if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
        raise InputError("batch.grad_accumulation_steps", "must be a positive integer")
    padded = body.get("padded", False)
    if not isinstance(padded, bool):
        raise InputError("batch.padded", "must be true or false")
    offload = body.get("checkpoint_offload", False)
    if not isinstance(offload, bool):
        raise InputError("batch.checkpoint_offload", "must be true or false")
    every = body.get("checkpoint_every_n_layers", 1)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise InputError("batch.checkpoint_every_n_layers", "must be a positive integer")
    return Batch(
        micro_batch_size=values["micro_batch_size"],
        seq_len=values["seq_len"],
        activation_checkpointing=_enum(
            Checkpointing,
            body.get("activation_checkpointing") or "none",
            "batch.activation_checkpointing",
        ),
        grad_accumulation_steps=accumulation,
        padded=padded,
        checkpoint_offload=offload,
        checkpoint_every_n_layers=every,
    )


def _engine(body: Mapping[str, Any]) -> Engine:
    engine: Engine = _enum(Engine, body.get("engine") or "torch", "engine")
    if engine is Engine.DEEPSPEED:
        if not deepspeed_available():
            raise InputError(
                "engine", f"DeepSpeed is not installed on this host: {DEEPSPEED_INSTALL}"
            )
        if body.get("mode") == "simulated":
            raise InputError(
                "mode",
                "DeepSpeed needs a real process group: use distributed (one process per GPU, "
                "or a world of 1) or auto, not simulated",
            )
    elif engine is not Engine.TORCH:
        raise InputError("engine", "a measurement runs a real engine: torch or deepspeed")
    return engine


def _offload(body: Mapping[str, Any]) -> Offload:
    offload = _object(body, "offload")
    out = {}
    for key in ("optimizer", "params"):
        out[key] = _enum(OffloadDevice, offload.get(key) or "none", f"offload.{key}")
    return Offload(optimizer=out["optimizer"], params=out["params"])


# --- what engine_config decides -----------------------------------------------------------------

# The request fields an engine_config may decide. A body that leaves one out lets the config
# decide it; one it carries must agree with the config (route, CLI and every rank read the same).
CONFIG_DECIDES = (
    "stages",
    "precision",
    "optimizer",
    "offload",
    "batch.grad_accumulation_steps",
    "batch.activation_checkpointing",
)
_RUN_SECTIONS = {
    "optimizer": "the config's optimizer section is left out of the measured run: the client "
    "torch optimizer of the same kind runs (DeepSpeed keeps a client optimizer over its own, "
    "engine.py _configure_optimizer), and the prediction models that one",
    "scheduler": "the config's scheduler section is left out of the measured run: a "
    "learning-rate schedule allocates nothing on the device",
}


def sent_fields(body: Mapping[str, Any]) -> frozenset[str]:
    """The dotted request fields ``body`` carries (a null value is not sent)."""
    sent = {k for k, v in body.items() if v is not None}
    for part in ("offload", "batch"):
        value = body.get(part)
        if isinstance(value, Mapping):
            sent |= {f"{part}.{k}" for k, v in value.items() if v is not None}
    return frozenset(sent)


def hidden_size(model: ModelChoice) -> int | None:
    """The hidden size transformers' Trainer reads for the "auto" bucket sizes
    (``HfTrainerDeepSpeedConfig.trainer_config_finalize``: ``config.hidden_size``, else the
    largest of ``hidden_sizes``, else the same of ``text_config``); an MLP's width."""
    if model.architecture is not None:
        return model.architecture.hidden
    if model.mlp is not None:
        return model.mlp.hidden
    if model.hf_config is None:
        return None
    from transformers import AutoConfig

    config = AutoConfig.for_model(model.hf_config["model_type"], **config_values(model.hf_config))
    for source in (config, getattr(config, "text_config", None)):
        if source is None:
            continue
        if getattr(source, "hidden_size", None) is not None:
            return int(source.hidden_size)
        if getattr(source, "hidden_sizes", None):
            return int(max(source.hidden_sizes))
    return None


def resolve_engine_config(
    engine: Engine, config: Mapping[str, Any], requested: Requested
) -> Decided:
    """What ``engine_config`` decides for a measurement, as ``/v1/memory`` reads it.

    deepspeed: a DeepSpeed config body, "auto" values filled as transformers' Trainer fills them
    (:func:`calculators.engines.deepspeed.config.resolve_config`); the body the engine runs has
    no "auto" left, and no optimizer or scheduler section (see :data:`_RUN_SECTIONS`).
    torch: FSDP2 settings (:func:`calculators.engines.torch.config.resolve_fsdp_config`).

    Raises:
        InputError: a value the engine cannot run or model, or a request field sent explicitly
            that contradicts the config (naming both).
    """
    if engine is Engine.TORCH:
        for key in ENGINE_KEYS:
            if key in config:
                raise InputError(
                    f"{CONFIG}.{key}",
                    "a fact of the measured run, not a setting: the run reports it itself",
                )
        return resolve_fsdp_config(config, requested)
    decided = resolve_config(config, requested)
    body = dict(decided.config)
    notes = list(decided.notes)
    for key, why in _RUN_SECTIONS.items():
        if key in body:
            del body[key]
            notes.append(why)
    return replace(decided, config=body, notes=tuple(notes))


def _decide(
    body: Mapping[str, Any],
    engine: Engine,
    model: ModelChoice,
    batch: Batch | None,
    stages: tuple[Stage, ...],
    precision: Precision,
    optimizer: Optimizer,
    offload: Offload,
    dp: int,
) -> Decided:
    """:func:`resolve_engine_config` for the request ``body``."""
    config = body.get("engine_config")
    if not isinstance(config, Mapping):
        raise InputError(CONFIG, "must be an object")
    sent = sent_fields(body)
    requested = Requested(
        stages=stages,
        precision=precision,
        offload=offload,
        optimizer=optimizer,
        dp=dp,
        # no batch: the run's default micro-batch, which the config may replace
        micro_batch=batch.micro_batch_size if batch else DEFAULT_MICRO_BATCH,
        grad_accumulation=batch.grad_accumulation_steps if batch else 1,
        checkpointing_full=(
            batch.activation_checkpointing is Checkpointing.FULL if batch else False
        ),
        hidden=hidden_size(model),
        explicit=sent,
    )
    return resolve_engine_config(engine, config, requested)


def _decided_batch(batch: Batch | None, decided: Decided, model: ModelChoice) -> Batch | None:
    """The batch the run trains on once the config decided micro-batch, accumulation and
    checkpointing (a run without a batch gets one when the config changes its defaults)."""
    micro = decided.micro_batch or (batch.micro_batch_size if batch else DEFAULT_MICRO_BATCH)
    steps = decided.grad_accumulation
    checkpointing = batch.activation_checkpointing if batch else Checkpointing.NONE
    if decided.checkpointing_full:
        checkpointing = Checkpointing.FULL
    elif decided.checkpointing_full is False and checkpointing is Checkpointing.FULL:
        checkpointing = Checkpointing.NONE
    if batch is None and (micro, steps, checkpointing) == (
        DEFAULT_MICRO_BATCH,
        1,
        Checkpointing.NONE,
    ):
        return None
    return Batch(
        micro_batch_size=micro,
        seq_len=batch.seq_len if batch else default_seq_len(model),
        activation_checkpointing=checkpointing,
        grad_accumulation_steps=steps,
        padded=batch.padded if batch else False,
        checkpoint_offload=batch.checkpoint_offload if batch else False,
        checkpoint_every_n_layers=batch.checkpoint_every_n_layers if batch else 1,
    )


def resolved_config_body(engine: Engine, decided: Decided) -> dict[str, Any]:
    """``resolved_config`` as ``/v1/memory`` answers it (``app.schemas.memory.ResolvedConfig``,
    by alias)."""
    return {
        "engine": engine.value,
        "stage": None if decided.stage is None else int(decided.stage),
        "stages": [int(s) for s in decided.stages],
        "precision": decided.precision.value,
        "offload": {
            "optimizer": decided.offload.optimizer.value,
            "params": decided.offload.params.value,
        },
        "micro_batch_size": decided.micro_batch,
        "gradient_accumulation_steps": decided.grad_accumulation,
        "train_batch_size": decided.train_batch,
        "values": [{"key": v.key, "value": v.value, "from": v.source} for v in decided.values],
        "notes": list(decided.notes),
    }


def parse_spec(body: Mapping[str, Any]) -> MeasureSpec:
    """The checked request.

    Raises:
        InputError: a field that cannot be measured, named.
    """
    if not isinstance(body, Mapping):
        raise InputError("", "the request must be a JSON object")
    engine = _engine(body)
    for key in ("tp", "pp"):
        if body.get(key) not in (None, 1):
            raise InputError(key, "measure runs data parallelism alone (tp = pp = 1)")
    if body.get("k") is not None:
        raise InputError("k", "measure runs a real optimizer; its states are what they are")
    offload = _offload(body)
    engine_config = dict(_object(body, "engine_config"))
    batch = _batch(body.get("batch"))
    stages_in = body.get("stages", [0, 1, 2, 3])
    if not isinstance(stages_in, list) or not 1 <= len(stages_in) <= 4:
        raise InputError("stages", "must be a list of one to four stages, 0..3")
    stages = tuple(_enum(Stage, s, "stages") for s in stages_in)
    mode = body.get("mode") or "auto"
    if mode not in MODES:
        raise InputError("mode", f"must be one of {', '.join(MODES)}")
    device = body.get("device") or "auto"
    if device not in DEVICES:
        raise InputError("device", f"must be one of {', '.join(DEVICES)}")
    precision = _enum(Precision, body.get("precision") or "mixed_bf16", "precision")
    model = model_choice(body.get("model"))
    if model.kind is ModelKind.HF and batch is not None:
        if batch.activation_checkpointing is Checkpointing.SELECTIVE:
            raise InputError(
                "batch.activation_checkpointing",
                "transformers checkpoints whole decoder layers: none or full",
            )
    if model.kind is not ModelKind.HF and batch is not None and batch.checkpoint_offload:
        raise InputError(
            "batch.checkpoint_offload",
            "offload is transformers' gradient checkpointing option: it applies to a model "
            "built by transformers' modelling code (hf_config, or a preset of a transformers "
            "family)",
        )
    if model.kind is not ModelKind.HF and batch is not None and batch.checkpoint_every_n_layers > 1:
        raise InputError(
            "batch.checkpoint_every_n_layers",
            "every_n_layers is transformers' gradient checkpointing option: it applies to a "
            "model built by transformers' modelling code (hf_config, or a preset of a "
            "transformers family)",
        )
    if model.kind is not ModelKind.HF and batch is not None and batch.padded:
        raise InputError(
            "batch.padded",
            "a padded attention_mask applies to a model built by transformers' modelling code "
            "(hf_config, or a preset of a transformers family); measure's own workloads take none",
        )
    if model.kind is ModelKind.GPT and model.architecture is not None and batch is not None:
        limit = model.architecture.max_seq_len
        if limit is not None and batch.seq_len > limit:
            raise InputError(
                "batch.seq_len", f"{batch.seq_len} exceeds the architecture's max_seq_len {limit}"
            )
    dp = _int(body, "dp", 1, (1, MAX_DP))
    optimizer = _enum(Optimizer, body.get("optimizer") or "adam", "optimizer")
    decided = None
    if body.get("engine_config") is not None:
        decided = _decide(body, engine, model, batch, stages, precision, optimizer, offload, dp)
        stages, precision, optimizer = decided.stages, decided.precision, decided.optimizer
        offload = decided.offload
        batch = _decided_batch(batch, decided, model)
        engine_config = dict(decided.config)
    trainer = trainer_loop(engine_config)
    if trainer and model.kind is not ModelKind.HF:
        raise InputError(
            f"engine_config.{TRAINER_LOOP}",
            "transformers' Trainer trains a transformers model (hf_config, or a preset of a "
            "transformers family), whose forward computes the loss from labels",
        )
    hold_outputs = _flag(body, "hold_outputs", not trainer)
    if hold_outputs and trainer:
        raise InputError(
            "hold_outputs",
            f"contradicts engine_config.{TRAINER_LOOP}: the Trainer keeps the loss alone",
        )
    spec = MeasureSpec(
        model=model,
        dp=dp,
        stages=stages,
        precision=precision,
        optimizer=optimizer,
        mode=mode,
        device=device,
        plan=StepPlan(
            warmup_steps=_int(body, "warmup_steps", 2, WARMUP_STEPS),
            steps=_int(body, "steps", 2, STEPS),
            grad_accumulation_steps=batch.grad_accumulation_steps if batch else 1,
            hold_outputs=hold_outputs,
        ),
        batch=batch,
        seed=_int(body, "seed", 0, (0, 2**31 - 1)),
        engine=engine,
        offload=offload,
        engine_config=engine_config,
        allow_slow_cpu=_flag(body, "allow_slow_cpu", False),
        host_probe=None if body.get("host_probe") is None else _flag(body, "host_probe", False),
        grad_sync=_grad_sync(body, engine, stages),
        resolved=decided,
    )
    if engine is Engine.DEEPSPEED:
        check_precision(precision)
        for stage in stages:  # every stage's config body is checked before anything runs
            spec.ds_config(stage)
    else:
        for stage in stages:  # FSDP2's CPUOffloadPolicy, stages 2 and 3
            check_offload(offload, stage)
    return spec


# --- what a run costs on the CPU ---------------------------------------------------------------

CPU_LIMIT_S = 60.0  # runs longer than this on the CPU need allow_slow_cpu
# 6 = 2 (forward multiply-add) + 4 (backward: input and weight gradients) FLOPs per parameter
# and token; full recomputation runs the forward twice: 8
FLOPS_PER_PARAM_TOKEN = {Checkpointing.NONE: 6, Checkpointing.SELECTIVE: 6, Checkpointing.FULL: 8}


def model_params(spec: MeasureSpec) -> int | None:
    """Ψ of the module, where the calculator knows it without building it."""
    if spec.model.mlp is not None:
        return spec.model.mlp.layers * (spec.model.mlp.hidden + 1) * spec.model.mlp.hidden
    if spec.model.architecture is not None:
        return count_params(spec.model.architecture)
    return None


def cpu_flops(spec: MeasureSpec, params: int) -> float:
    """Floating-point operations one rank's run does: every stage, every step, every micro-batch.

    A simulated world runs one rank; a distributed one runs ``dp`` ranks on the same cores.
    """
    if spec.model.mlp is not None:
        tokens = spec.model.mlp.batch
        per_token = 6
    else:
        tokens = spec.micro_batch_size * spec.seq_len
        per_token = FLOPS_PER_PARAM_TOKEN[spec.checkpointing]
    steps = spec.plan.total_steps * spec.plan.grad_accumulation_steps * len(spec.stages)
    ranks = spec.dp if spec.mode == "distributed" else 1
    return float(per_token * params * tokens * steps * ranks)


def check_cpu_cost(spec: MeasureSpec, params: int, flops_per_s: float) -> float:
    """Seconds the run's arithmetic alone takes on this CPU; refuse a long run not asked for.

    ``flops_per_s`` is this host's measured fp32 matrix-multiply rate; the engines, the
    optimizer and the CPU memory tracker add to it, so the figure is a lower bound.

    Raises:
        InputError: over :data:`CPU_LIMIT_S` and ``allow_slow_cpu`` is not set.
    """
    seconds = cpu_flops(spec, params) / max(flops_per_s, 1.0)
    if seconds > CPU_LIMIT_S and not spec.allow_slow_cpu:
        raise InputError(
            "device",
            f"on this host's CPU the run needs at least {math.ceil(seconds)} s of arithmetic "
            f"({cpu_flops(spec, params):.3g} FLOP at {flops_per_s:.3g} FLOP/s; limit "
            f"{CPU_LIMIT_S:.0f} s): use a GPU, a smaller model or batch, fewer stages or steps, "
            "or ask for it: allow_slow_cpu: true (python -m measure --allow-slow-cpu)",
        )
    return seconds
