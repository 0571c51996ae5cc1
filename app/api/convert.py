"""Schemas in, domain objects out: the only place the web layer builds calculator inputs."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from app.schemas.communication import CommunicationRequest, InterconnectIn, LinkIn
from app.schemas.memory import MemoryRequest, TrainingIn
from app.schemas.model import BatchIn, ModelSpec
from app.schemas.plan import GpuIn, PlanRequest
from calculators.architecture import (
    Architecture,
    PositionEmbedding,
    TracedActivations,
    count_params,
)
from calculators.batch import Batch, Checkpointing
from calculators.capacity import MAX_PARAMS
from calculators.config_resolution import Decided, Requested
from calculators.conventions import Engine, Stage
from calculators.engines.deepspeed.config import resolve_config
from calculators.engines.torch.config import resolve_fsdp_config, through_accelerate
from calculators.errors import InputError
from calculators.gpus import Gpu, custom_gpu, get_gpu
from calculators.hf_config import architecture_from_hf_config
from calculators.interconnects import Interconnect, custom_interconnect, get_interconnect
from calculators.model_states import Offload, TrainingSetup
from calculators.plan import Efficiency, HostThreads, PlanSetup, Search
from calculators.presets import get_preset
from calculators.topology import Network, make_topology
from calculators.traffic import CommunicationSetup, ZeroPlusPlus

STAGES = {int(s): s for s in Stage}  # Stage(n), without the enum's call per stage


def resolve_model(spec: ModelSpec) -> tuple[int, Architecture | None]:
    """Ψ and, when the request describes one, the architecture."""
    if spec.params is not None:
        return spec.params, None
    if spec.preset is not None:  # a bundled model, counted once
        preset = get_preset(spec.preset)
        return _under_max(preset.params), preset.architecture
    if spec.architecture is not None:
        arch = Architecture(**spec.architecture.model_dump())
    else:
        assert spec.hf_config is not None  # ModelSpec.exactly_one guarantees one is set
        try:
            arch = architecture_from_hf_config(spec.hf_config)
        except InputError as err:
            field = err.field.replace("model.architecture", "model.hf_config")
            raise InputError(field, err.message) from None
    return _under_max(count_params(arch)), arch


def _under_max(params: int) -> int:
    if params > MAX_PARAMS:
        raise InputError("model", f"the architecture counts {params} parameters, over {MAX_PARAMS}")
    return params


def to_batch(batch: BatchIn | None) -> Batch | None:
    return None if batch is None else Batch(**batch.model_dump())


def check_positions(arch: Architecture, batch: Batch) -> None:
    """A learned position table has max_seq_len rows: a longer sequence cannot be embedded
    (measure's GPT workload refuses it the same way)."""
    if arch.position_embedding is PositionEmbedding.LEARNED and arch.max_seq_len is not None:
        if batch.seq_len > arch.max_seq_len:
            raise InputError(
                "batch.seq_len",
                f"{batch.seq_len} exceeds the architecture's max_seq_len {arch.max_seq_len} "
                "(rows of its learned position table)",
            )


def explicit_fields(req: TrainingIn, batch: BatchIn | None = None) -> frozenset[str]:
    """The request fields the user sent (dotted), as opposed to defaults."""
    sent = {f for f in req.model_fields_set if f != "offload"}
    sent |= {f"offload.{f}" for f in req.offload.model_fields_set}
    if batch is not None:
        sent |= {f"batch.{f}" for f in batch.model_fields_set}
    return frozenset(sent)


def decide(
    req: TrainingIn,
    arch: Architecture | None,
    batch: BatchIn | None = None,
    grad_accumulation: tuple[int, str] | None = None,
) -> Decided | None:
    """What ``engine_config`` decides (deepspeed: a DeepSpeed config; torch: FSDP2 settings).

    ``grad_accumulation``: the request's steps and field when it carries them outside a batch.
    """
    if req.engine_config is None or req.engine is Engine.PAPER:
        return None
    steps, field = grad_accumulation or (
        (batch.grad_accumulation_steps, "batch.grad_accumulation_steps")
        if batch is not None
        else (1, "batch.grad_accumulation_steps")
    )
    asked = Requested(
        stages=tuple(Stage(s) for s in req.stages),
        precision=req.precision,
        offload=Offload(optimizer=req.offload.optimizer, params=req.offload.params),
        optimizer=req.optimizer,
        dp=req.dp,
        micro_batch=None if batch is None else batch.micro_batch_size,
        grad_accumulation=steps,
        grad_accumulation_field=field,
        checkpointing_full=None
        if batch is None
        else batch.activation_checkpointing is Checkpointing.FULL,
        hidden=None if arch is None else arch.hidden,
        explicit=explicit_fields(req, batch),
    )
    if req.engine is Engine.DEEPSPEED:
        return resolve_config(req.engine_config, asked)
    return resolve_fsdp_config(req.engine_config, asked)


def to_setup(
    req: TrainingIn,
    params: int,
    arch: Architecture | None,
    batch: Batch | None = None,
    decided: Decided | None = None,
) -> TrainingSetup:
    """The calculators' view of a request (with what ``engine_config`` decided, if given)."""
    if arch is not None and batch is not None:
        check_positions(arch, batch)
    setup = TrainingSetup(
        params=params,
        dp=req.dp,
        tp=req.tp,
        pp=req.pp,
        precision=req.precision,
        optimizer=req.optimizer,
        k=None if req.k is None else Fraction(req.k).limit_denominator(10**6),
        gradients=req.gradients,
        master_weights=req.master_weights,
        offload=Offload(optimizer=req.offload.optimizer, params=req.offload.params),
        engine=req.engine,
        architecture=arch,
        batch=batch,
        engine_config=req.engine_config,
    )
    if decided is None:
        return setup
    if batch is not None:
        batch = replace(batch, grad_accumulation_steps=decided.grad_accumulation)
        if decided.checkpointing_full:
            batch = replace(batch, activation_checkpointing=Checkpointing.FULL)
    return replace(
        setup,
        precision=decided.precision,
        optimizer=decided.optimizer,
        offload=decided.offload,
        batch=batch,
        engine_config=decided.config,
    )


@dataclass(frozen=True)
class MemoryQuestion:
    """A memory request in the calculators' terms."""

    setup: TrainingSetup
    stages: tuple[Stage, ...]
    decided: Decided | None


def memory_question(req: MemoryRequest) -> MemoryQuestion:
    params, arch = resolve_model(req.model)
    batch = to_batch(req.batch)
    if req.activation_model == "traced":
        arch = _traced(req, arch, batch)
    decided = decide(req, arch, req.batch)
    setup = to_setup(req, params, arch, batch, decided)
    stages = decided.stages if decided else tuple(STAGES[s] for s in req.stages)
    return MemoryQuestion(setup, stages, decided)


def memory_setup(req: MemoryRequest) -> TrainingSetup:
    return memory_question(req).setup


def _traced(req: MemoryRequest, arch: Architecture | None, batch: Batch | None) -> Architecture:
    """The architecture carrying a trace of transformers' code for this batch, run in each
    regime the engines ask for when they first ask."""
    field = "activation_model"
    if arch is None or arch.modelling is None or req.model.hf_config is None:
        raise InputError(field, "traced needs the model as hf_config of a transformers family")
    if batch is None:
        raise InputError(field, "traced needs a batch")
    trace = _trace_module()
    if trace is None:
        raise InputError(
            field,
            "traced needs torch and transformers on the server: pip install 'zerocalc[hf]' "
            "(or use analytical, derived from the same code)",
        )
    traced = _Trace(
        micro_batch_size=batch.micro_batch_size,
        seq_len=batch.seq_len,
        checkpointing=batch.activation_checkpointing is Checkpointing.FULL,
        padded=batch.padded,
        hf_config=req.model.hf_config,
        run=trace.traced_regime,
    )
    return replace(arch, modelling=replace(arch.modelling, traced=traced))


# a two-layer Llama config: tracing it runs transformers' modelling code once
_PRELOAD_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
}


def _trace_module() -> Any:
    """``measure.trace`` where torch and transformers are installed, else None (measure/ needs
    torch, which the calculator service may not have)."""
    try:
        trace = importlib.import_module("measure.trace")
    except ImportError:
        return None
    return trace if trace.transformers_available() else None


def preload_trace() -> bool:
    """Import what ``activation_model: traced`` needs and trace a small config once (the
    service's ``preload_trace`` setting); False where torch or transformers is missing."""
    trace = _trace_module()
    if trace is None:
        return False
    trace.traced_regime(_PRELOAD_CONFIG, 1, 16, "half", False)
    return True


@dataclass(frozen=True, eq=False)
class _Trace:
    """``measure.trace.traced_regime`` of one config and batch; a config its code cannot run
    is refused on ``activation_model``."""

    micro_batch_size: int
    seq_len: int
    checkpointing: bool
    padded: bool
    hf_config: Mapping[str, Any]
    run: Callable[..., TracedActivations]

    def __call__(self, regime: str) -> TracedActivations:
        try:
            return self.run(
                self.hf_config,
                self.micro_batch_size,
                self.seq_len,
                regime,
                self.checkpointing,
                self.padded,
            )
        except Exception as exc:  # noqa: BLE001 (transformers' own code run on the body's config)
            reason = (str(exc).splitlines() or [""])[0][:200]
            raise InputError(
                "activation_model",
                f"transformers' modelling code could not be traced for this config "
                f"({type(exc).__name__}: {reason}); use analytical, derived from the same code",
            ) from exc


def _link(spec: LinkIn, field: str) -> Interconnect:
    if isinstance(spec, InterconnectIn):
        return custom_interconnect(spec.bandwidth, spec.latency, field)
    return get_interconnect(spec, field)


@dataclass(frozen=True)
class CommunicationQuestion:
    """A communication request in the calculators' terms."""

    setup: CommunicationSetup
    stages: tuple[Stage, ...]
    decided: Decided | None


def communication_question(req: CommunicationRequest) -> CommunicationQuestion:
    """The calculators' view of a communication request."""
    params, arch = resolve_model(req.model)
    decided = decide(
        req, arch, grad_accumulation=(req.grad_accumulation_steps, "grad_accumulation_steps")
    )
    training = to_setup(req, params, arch, decided=decided)
    setup = CommunicationSetup(
        training=training,
        topology=make_topology(
            req.dp, req.tp, req.pp, req.nodes, req.gpus_per_node, req.nics_per_node
        ),
        network=Network(
            intra=_link(req.interconnect, "interconnect"),
            inter=_link(req.inter_node_interconnect, "inter_node_interconnect"),
            host=_link(req.host_interconnect, "host_interconnect"),
            algorithm=req.algorithm,
        ),
        grad_accumulation_steps=decided.grad_accumulation
        if decided
        else req.grad_accumulation_steps,
        grad_sync=req.grad_sync,
        shard_group_size=req.shard_group_size,
        zeropp=ZeroPlusPlus(qwz=req.zeropp.qwz, hpz=req.zeropp.hpz, qgz=req.zeropp.qgz),
        activation_checkpointing=req.activation_checkpointing,
    )
    stages = decided.stages if decided else tuple(Stage(s) for s in req.stages)
    return CommunicationQuestion(setup, stages, decided)


def plan_gpu(spec: str | GpuIn) -> Gpu:
    """A GPU preset, or the figures a request gives (named for calibrations when it says so)."""
    if isinstance(spec, str):
        return get_gpu(spec)
    gpu = custom_gpu(spec.memory, spec.peak_flops, memory_bandwidth=spec.memory_bandwidth)
    return gpu if spec.name is None else replace(gpu, name=spec.name)


def host_threads(req: PlanRequest) -> tuple[HostThreads | None, str]:
    """The threads a plan request says each rank's host optimizer steps on, and why (None:
    as the launchers set them for the plan's ranks per node)."""
    if req.host_optimizer_threads is not None:
        return req.host_optimizer_threads, "given by the request"
    if req.engine is Engine.TORCH and req.engine_config and through_accelerate(req.engine_config):
        return HostThreads.ONE, "an accelerate config: accelerate launch sets OMP_NUM_THREADS=1"
    return None, "given"


def plan_setup(
    req: PlanRequest,
    gpu: Gpu,
    efficiency: Efficiency,
    host_optimizer: tuple[float, str] | None = None,
) -> PlanSetup:
    """The calculators' view of a plan request (``host_optimizer``: the host optimizer
    bandwidth and its source, None for the engine's stated figure)."""
    params, arch = resolve_model(req.model)
    if arch is None:
        raise InputError(
            "model",
            "a plan needs the model's shape (activations, FLOPs): give architecture, preset "
            "or hf_config, not params",
        )
    gpn = req.gpus_per_node or (8 if req.gpus % 8 == 0 else req.gpus)
    s = req.search
    threads, threads_source = host_threads(req)
    return PlanSetup(
        architecture=arch,
        params=params,
        gpu=gpu,
        gpus=req.gpus,
        gpus_per_node=gpn,
        network=Network(
            intra=_link(req.interconnect or gpu.intra_node_link, "interconnect"),
            inter=_link(req.inter_node_interconnect, "inter_node_interconnect"),
            host=_link(req.host_interconnect or gpu.host_link, "host_interconnect"),
        ),
        global_batch_size=req.global_batch_size,
        seq_len=req.seq_len,
        padded=req.padded,
        engine=req.engine,
        engine_config=req.engine_config,
        precision=req.precision,
        optimizer=req.optimizer,
        search=Search(
            stages=tuple(Stage(x) for x in s.stages),
            micro_batch_sizes=None if s.micro_batch_size is None else tuple(s.micro_batch_size),
            activation_checkpointing=tuple(s.activation_checkpointing),
            offload=tuple(s.offload),
            hsdp=s.hsdp,
            checkpoint_offload=tuple(s.checkpoint_offload),
            checkpoint_every_n_layers=tuple(s.checkpoint_every_n_layers),
        ),
        efficiency=efficiency,
        host_optimizer_bandwidth=None if host_optimizer is None else host_optimizer[0],
        host_optimizer_given_source="given" if host_optimizer is None else host_optimizer[1],
        host_threads=threads,
        host_threads_source=threads_source,
    )


def communication_setup(req: CommunicationRequest) -> CommunicationSetup:
    """The calculators' view of a communication request."""
    return communication_question(req).setup
