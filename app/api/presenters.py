"""Domain results out, response schemas in: bytes stay integers, readable strings beside them."""

from __future__ import annotations

from dataclasses import asdict, fields, replace
from enum import Enum
from fractions import Fraction
from functools import lru_cache
from typing import Any

import orjson
from pydantic_core import to_json
from starlette.responses import Response

from app.core.units import readable
from app.schemas.capacity import CapacityResponse, FoundModel, StageCapacity
from app.schemas.communication import (
    CollectiveOut,
    CommunicationConvention,
    CommunicationResponse,
    LinkOut,
    StageCommunicationOut,
    TopologyOut,
    TransferOut,
)
from app.schemas.inference import InferenceResponse
from app.schemas.memory import (
    HostMemory,
    OffloadIn,
    PerDevice,
    ResolvedConfig,
    ResolvedValue,
)
from app.schemas.plan import (
    CalibrationUsed,
    CandidateOut,
    ConfigOut,
    GpuOut,
    KernelCountsOut,
    OverlapOut,
    PlanAssumptions,
    PlanResponse,
    RejectedOut,
    StepTimeOut,
)
from calculators.architecture import Architecture
from calculators.batch import Checkpointing
from calculators.capacity import MAX_GROWN_LAYERS, MAX_PARAMS, CapacityResult, needed
from calculators.capacity import StageCapacity as CapacityRow
from calculators.config_resolution import Decided
from calculators.conventions import (
    OPTIMIZER_ASSUMPTIONS,
    Engine,
    GradientConvention,
    Optimizer,
    Precision,
    Stage,
)
from calculators.estimates import MemoryEstimate, StageEstimate
from calculators.inference import InferenceMemory
from calculators.interconnects import Interconnect
from calculators.labels import labels
from calculators.model_states import NOWHERE, Placement, TrainingSetup
from calculators.plan import Candidate, Config, Plan
from calculators.traffic import CommunicationEstimate, StageCommunication

BREAKDOWN_NOTES = [
    "reserved is not predicted: PyTorch's caching allocator rounds requests (512 B; small "
    "tensors share 2 MiB segments) and keeps freed blocks for reuse, so reserved >= peak by an "
    "amount that depends on the order of allocations; /v1/measure reports it (10-25 % above "
    "the peak in bench/results/torch_peak.json)",
    "outside_allocator is not predicted: nvidia-smi also counts the CUDA context, loaded "
    "kernels and NCCL's buffers, which depend on the driver, CUDA and NCCL builds; measured as "
    "rank 0's nvml_used - reserved after a step with torch 2.11, NCCL 2.28 and DeepSpeed "
    "0.19.8 on H100/H200 (bench/results/context): torch 1.9 GiB on one GPU and 2.2 GiB in an "
    "NCCL world of 2 or 4, DeepSpeed 2.3 and 2.7 GiB. fits compares the allocated peak with "
    "device_memory alone; /v1/plan keeps these bytes free",
]


# a model trained with transformers' modelling code and a batch: what its activations assume
UNPADDED_NOTE = (
    "activations follow transformers' modelling code for a batch without padding (batch.padded "
    "false: no attention_mask, one of all ones, which transformers drops, or packed "
    "sequences); a padding collator's attention_mask with zeros makes every layer keep a "
    "(batch, 1, seq, seq) mask and key/value expanded to every query head: set batch.padded "
    "to count them"
)
PADDED_NOTE = (
    "activations follow transformers' modelling code for a padded batch (batch.padded): every "
    "layer's SDPA takes the (batch, 1, seq, seq) mask, saves it as a bias in q's dtype and "
    "key/value expanded to every query head, with the kernel torch 2.11 runs on an H100/H200 "
    "(cuDNN attention in 16-bit, the memory-efficient kernel in fp32); the figures hold for any "
    "amount of padding, since the shapes do not change with it"
)
EAGER_NOTE = (
    "activations follow transformers' eager attention (hf_config attn_implementation "
    '"eager"): every layer keeps copies of q, k and v, the fp32 attention probabilities and a '
    "16-bit copy of them, (batch, heads, seq, seq) each, and the softmax's backward holds three "
    "more fp32 tensors of that size; every layer takes an additive mask, which it does not keep, "
    "so padded and unpadded batches have the same figures"
)
CHECKPOINTED_NOTE = (
    "checkpointing follows transformers' gradient_checkpointing_enable(): every decoder layer "
    "checkpointed (every_n_layers 1; set batch.checkpoint_every_n_layers for another) and its "
    "input kept on the device; with offload=True set batch.checkpoint_offload"
)
OFFLOADED_NOTE = (
    "checkpointing follows transformers' gradient_checkpointing_enable(offload=True): every "
    "decoder layer checkpointed (every_n_layers 1; set batch.checkpoint_every_n_layers for "
    "another), its input in pinned host memory (cpu.activations) and copied back for its "
    "recomputation"
)
EVERY_N_NOTE = (
    "checkpointing follows transformers' gradient_checkpointing_enable(every_n_layers=n): "
    "decoder layers 0, n, 2n, ... checkpointed, their input kept on the device (in pinned host "
    "memory with batch.checkpoint_offload: cpu.activations), the other layers keeping all "
    "they save; the peak is taken at every layer's backward"
)
UNPADDED_BREAKDOWN_NOTES = [*BREAKDOWN_NOTES, UNPADDED_NOTE]
PADDED_BREAKDOWN_NOTES = [*BREAKDOWN_NOTES, PADDED_NOTE]
EAGER_BREAKDOWN_NOTES = [*BREAKDOWN_NOTES, EAGER_NOTE]
# the same with full checkpointing, by (notes without it, offloaded): built once, shared
_CHECKPOINTED_NOTES = {
    (id(notes), offloaded): [*notes, OFFLOADED_NOTE if offloaded else CHECKPOINTED_NOTE]
    for notes in (UNPADDED_BREAKDOWN_NOTES, PADDED_BREAKDOWN_NOTES, EAGER_BREAKDOWN_NOTES)
    for offloaded in (False, True)
}


BARE_PARAMS_NOTE = (
    "a bare parameter count is taken, at each Ψ tried, as the dense decoder it implies "
    "(hidden = 128 × layers, Llama-style; /v1/memory's notes name the shape): DeepSpeed's "
    "per-tensor buffers follow that shape; give shape, or a model with an architecture, for "
    "the model's own tensors"
)


def null_notes(est: StageEstimate, setup: TrainingSetup) -> list[str]:
    """Why activations, temporary_buffers or peak are null, where the engine's notes do not say."""
    if est.activations is not None and est.temporary_buffers is not None and est.peak is not None:
        return []
    note = _null_note(
        est.notes,
        est.activations is None,
        est.temporary_buffers is None,
        est.peak is None,
        setup.architecture is None,
        setup.batch is None,
        setup.engine.value,
    )
    return [] if note is None else [note]


@lru_cache(maxsize=256)  # an answer's stages share their notes: worked out once per answer
def _null_note(
    notes: tuple[str, ...],
    activations: bool,
    temporary_buffers: bool,
    peak: bool,
    no_architecture: bool,
    no_batch: bool,
    engine: str,
) -> str | None:
    """The note of :func:`null_notes` for the null fields the engine's ``notes`` do not name."""
    said = " ".join(notes)
    nulls = [
        name
        for name, null in (
            ("activations", activations),
            ("temporary_buffers", temporary_buffers),
            ("peak", peak),
        )
        if null and name not in said
    ]
    if not nulls:
        return None
    missing = [
        what
        for what, absent in (
            ("an architecture (preset, hf_config or architecture)", no_architecture),
            ("a batch", no_batch),
        )
        if absent
    ]
    reason = (
        f"they need {' and '.join(missing)}"
        if missing
        else f"the {engine} engine does not estimate them for this setup"
    )
    return f"{', '.join(nulls)} {'is' if len(nulls) == 1 else 'are'} null: {reason}"


# The memory answers are built as the JSON body itself (dicts in the response models' field
# order, integers and strings already checked by the calculators) and encoded once by
# pydantic-core: no model is built and validated per stage only to be dumped again.
# tests/api/test_memory.py checks each body against MemoryResponse / MemorySweepResponse.


class JSONBytes(Response):
    """JSON already encoded: the headers FastAPI's JSON answers carry, written without
    ``Response.init_headers``' general case."""

    media_type = "application/json"

    def __init__(self, content: bytes) -> None:
        self.status_code = 200
        self.background = None
        self.body = content
        self.raw_headers = [
            (b"content-length", b"%d" % len(content)),
            (b"content-type", b"application/json"),
        ]


def encode(body: dict[str, Any]) -> bytes:
    """``body`` as JSON: orjson's bytes, the same as pydantic-core's encoder writes for these
    plain values (``tests/api/test_encoding.py``) in about half its time; pydantic-core's (the
    one FastAPI's responses use) for what orjson refuses (an integer beyond 64 bits)."""
    try:
        return orjson.dumps(body)
    except TypeError:  # orjson.JSONEncodeError is one
        return to_json(body)


def json_response(body: dict[str, Any]) -> Response:
    """``body`` as the JSON response FastAPI would send for its response model."""
    return JSONBytes(encode(body))


def per_device_body(est: StageEstimate) -> dict[str, int | None]:
    """:class:`PerDevice`'s fields, in its order."""
    d = est.device
    return {
        "parameters": d.parameters,
        "gradients": d.gradients,
        "optimizer_states": d.optimizer_states,
        "model_states": d.parameters + d.gradients + d.optimizer_states,
        "activations": est.activations,
        "temporary_buffers": est.temporary_buffers,
        "resident": est.resident,
        "peak": est.peak,
    }


def per_device(est: StageEstimate) -> PerDevice:
    return PerDevice(**per_device_body(est))


def _host_body(p: Placement, buffers: int = 0, activations: int = 0) -> dict[str, int]:
    """:class:`HostMemory`'s fields, in its order."""
    if p is NOWHERE and not buffers and not activations:
        return _NO_HOST_BODY
    return {
        "total": p.parameters + p.gradients + p.optimizer_states + buffers + activations,
        "parameters": p.parameters,
        "gradients": p.gradients,
        "optimizer_states": p.optimizer_states,
        "buffers": buffers,
        "activations": activations,
    }


# nothing in a place (no offload): one body shared by every answer, only read by the encoder
_NO_HOST_BODY: dict[str, int] = {
    "total": 0,
    "parameters": 0,
    "gradients": 0,
    "optimizer_states": 0,
    "buffers": 0,
    "activations": 0,
}


def stage_memory_body(
    est: StageEstimate,
    device_memory: int | None,
    notes: list[str],
    names: dict[int, str],
) -> dict[str, Any]:
    """:class:`StageMemory`'s fields, in its order; ``notes`` the stage's with the null-value
    note after them, ``names`` memoises ``readable`` over one answer (its stages repeat most
    sizes). The body is only read by the encoder: ``notes`` and the estimate's components go in
    as they are (stages that share their notes share the list)."""
    d = est.device
    parameters, gradients, optimizer_states = d.parameters, d.gradients, d.optimizer_states
    model_states = parameters + gradients + optimizer_states
    activations, buffers, resident, peak = (
        est.activations,
        est.temporary_buffers,
        est.resident,
        est.peak,
    )
    # per_device_body's fields and their readable sizes, the null ones left out, in its order
    said = {
        "parameters": names.get(parameters) or _name(names, parameters),
        "gradients": names.get(gradients) or _name(names, gradients),
        "optimizer_states": names.get(optimizer_states) or _name(names, optimizer_states),
        "model_states": names.get(model_states) or _name(names, model_states),
    }
    if activations is not None:
        said["activations"] = names.get(activations) or _name(names, activations)
    if buffers is not None:
        said["temporary_buffers"] = names.get(buffers) or _name(names, buffers)
    said["resident"] = names.get(resident) or _name(names, resident)
    if peak is not None:
        said["peak"] = names.get(peak) or _name(names, peak)
    components = est.components
    return {
        "stage": int(est.stage),
        "per_device": {
            "parameters": parameters,
            "gradients": gradients,
            "optimizer_states": optimizer_states,
            "model_states": model_states,
            "activations": activations,
            "temporary_buffers": buffers,
            "resident": resident,
            "peak": peak,
        },
        "per_device_readable": said,
        "cpu": _host_body(est.cpu, est.cpu_buffers, est.cpu_activations),
        "nvme": _host_body(est.nvme),
        "fits": None if device_memory is None else est.fits(device_memory),
        "components": components if type(components) is dict else dict(components),
        "breakdown": {
            "theory": est.theory,
            "allocated_resident": est.resident,
            "allocated_peak": est.peak,
            "reserved": None,
            "outside_allocator": None,
        },
        "notes": notes,
    }


def _name(names: dict[int, str], value: int) -> str:
    """``readable(value)``, kept in ``names``."""
    text = names[value] = readable(value)
    return text


def resolved_config(engine: Engine, decided: Decided | None) -> ResolvedConfig | None:
    if decided is None:
        return None
    return ResolvedConfig(
        engine=engine,
        stage=None if decided.stage is None else int(decided.stage),
        stages=[int(s) for s in decided.stages],
        precision=decided.precision,
        offload=OffloadIn(optimizer=decided.offload.optimizer, params=decided.offload.params),
        micro_batch_size=decided.micro_batch,
        gradient_accumulation_steps=decided.grad_accumulation,
        train_batch_size=decided.train_batch,
        values=[ResolvedValue(key=v.key, value=v.value, source=v.source) for v in decided.values],
        notes=list(decided.notes),
    )


def convention_body(result: MemoryEstimate) -> dict[str, Any]:
    """:class:`Convention`'s fields, in its order (one shared body per distinct convention:
    encoded, never changed)."""
    s = result.setup
    return _convention_body(
        result.convention, s.engine, s.precision, s.optimizer, s.k, s.gradients, s.master_weights
    )


@lru_cache(maxsize=256)
def _convention_body(
    convention: str,
    engine: Engine,
    precision: Precision,
    optimizer: Optimizer,
    k: Fraction | None,
    gradients: GradientConvention,
    master_weights: bool,
) -> dict[str, Any]:
    # everything ``labels`` and the assumption read: the rest of a setup is left at its default
    setup = TrainingSetup(
        params=1,
        dp=1,
        precision=precision,
        optimizer=optimizer,
        k=k,
        gradients=gradients,
        master_weights=master_weights,
        engine=engine,
    )
    label = labels(setup)
    per = label.per_param
    assumption = (
        "k given by the request" if setup.k is not None else OPTIMIZER_ASSUMPTIONS[setup.optimizer]
    )
    if setup.engine is Engine.DEEPSPEED:
        assumption = f"an fp32 master copy plus {assumption} (fp32)"
    return {
        "engine": setup.engine.value,
        "description": "; ".join((convention, *label.ignored)),
        "precision": setup.precision.value,
        "optimizer": setup.optimizer.value,
        "k": float(per.optimizer_states),
        "optimizer_assumption": assumption,
        "gradients": label.gradients.value,
        "bytes_per_param": {
            "parameters": float(per.parameters),
            "gradients": float(per.gradients),
            "optimizer_states": float(per.optimizer_states),
        },
    }


def memory_body(
    result: MemoryEstimate, device_memory: int | None, decided: Decided | None = None
) -> dict[str, Any]:
    """The :class:`MemoryResponse` of ``result``, as its JSON body."""
    setup = result.setup
    config = resolved_config(setup.engine, decided)
    return {
        "params": setup.params,
        "params_per_device": setup.params_per_device,
        "dp": setup.dp,
        "tp": setup.tp,
        "pp": setup.pp,
        "convention": convention_body(result),
        "stages": _stage_bodies(result, device_memory),
        "breakdown_notes": _breakdown_notes(setup),
        "resolved_config": None
        if config is None
        else config.model_dump(mode="json", by_alias=True),
    }


def _breakdown_notes(setup: TrainingSetup) -> list[str]:
    """The notes every answer carries, and for a transformers model with a batch, the batches
    its activations follow."""
    arch = setup.architecture
    if setup.batch is None or arch is None or arch.modelling is None:
        return BREAKDOWN_NOTES
    if arch.modelling.eager_attention:
        notes = EAGER_BREAKDOWN_NOTES
    else:
        notes = PADDED_BREAKDOWN_NOTES if setup.batch.padded else UNPADDED_BREAKDOWN_NOTES
    if setup.batch.activation_checkpointing is not Checkpointing.FULL:
        return notes
    if setup.batch.checkpoint_every_n_layers > 1:
        return [*notes, EVERY_N_NOTE]
    return _CHECKPOINTED_NOTES[id(notes), setup.batch.checkpoint_offload]


def _stage_bodies(result: MemoryEstimate, device_memory: int | None) -> list[dict[str, Any]]:
    """Each stage's :class:`StageMemory` body; the null-value note worked out once for the
    stages that share their notes and null fields (an engine's stages usually do)."""
    setup = result.setup
    names: dict[int, str] = {}
    bodies = []
    said: tuple[str, ...] | None = None
    nulls: tuple[bool, bool, bool] | None = None
    notes: list[str] = []
    for s in result.stages:
        these = (s.activations is None, s.temporary_buffers is None, s.peak is None)
        if s.notes is not said or these != nulls:
            said, nulls = s.notes, these
            notes = [*s.notes, *null_notes(s, setup)]
        bodies.append(stage_memory_body(s, device_memory, notes, names))
    return bodies


def memory_response(
    result: MemoryEstimate, device_memory: int | None, decided: Decided | None = None
) -> Response:
    """POST /v1/memory's answer (its schema: :class:`MemoryResponse`)."""
    return json_response(memory_body(result, device_memory, decided))


TIME_MODEL = (
    "per call: NCCL base latency 8.4 µs + ring steps × hop latency (NCCL tuning.cc Ring/Simple: "
    "NVLink 3.4 µs, PCIe 5.7 µs, network 14 µs, or the given latency); plus bus factor × "
    "payload / bus bandwidth, the bus bandwidth being the slowest link class the ring crosses "
    "(a node's share of its NICs when the group leaves the node). Offload transfers: bytes / "
    "host link bandwidth."
)


def _link_out(link: Interconnect) -> LinkOut:
    return LinkOut(
        name=link.name,
        bandwidth=link.bandwidth,
        latency_seconds=float(link.latency),
        source=link.source,
    )


def _stage_out(s: StageCommunication) -> StageCommunicationOut:
    return StageCommunicationOut(
        stage=int(s.stage),
        collectives=[
            CollectiveOut(
                op=c.collective.op,
                phase=c.collective.phase,
                calls=c.collective.calls,
                payload_bytes=c.collective.payload_bytes,
                sent_bytes_per_rank=c.collective.sent_bytes_per_rank,
                dtype=c.collective.dtype,
                group_size=c.collective.group.size,
                link=c.collective.group.link,
                nodes_spanned=c.collective.group.nodes,
                intra_node_bytes_per_rank=c.intra_node_bytes_per_rank,
                inter_node_bytes_per_rank=c.inter_node_bytes_per_rank,
                time_seconds=c.time_seconds,
                what=c.collective.what,
            )
            for c in s.collectives
        ],
        sent_bytes_per_rank=s.sent_bytes_per_rank,
        sent_readable=readable(s.sent_bytes_per_rank),
        ratio_to_ddp=None if s.ratio_to_ddp is None else float(s.ratio_to_ddp),
        time_seconds=s.time_seconds,
        collective_time_seconds=s.collective_time_seconds,
        offload_transfers=[
            TransferOut(
                direction=t.direction, phase=t.phase, bytes=t.bytes, time_seconds=secs, what=t.what
            )
            for t, secs in zip(s.transfers, s.transfer_seconds, strict=True)
        ],
        offload_time_seconds=s.transfer_time_seconds,
        notes=list(s.notes),
    )


def _link_body(link: Interconnect) -> dict[str, Any]:
    """:class:`LinkOut`'s fields, in its order."""
    return {
        "name": link.name,
        "bandwidth": link.bandwidth,
        "latency_seconds": float(link.latency),
        "source": link.source,
    }


def _stage_body(s: StageCommunication) -> dict[str, Any]:
    """:class:`StageCommunicationOut`'s fields, in its order (floats where it declares them)."""
    return {
        "stage": int(s.stage),
        "collectives": [
            {
                "op": c.collective.op.value,
                "phase": c.collective.phase.value,
                "calls": c.collective.calls,
                "payload_bytes": c.collective.payload_bytes,
                "sent_bytes_per_rank": c.collective.sent_bytes_per_rank,
                "dtype": c.collective.dtype,
                "group_size": c.collective.group.size,
                "link": c.collective.group.link.value,
                "nodes_spanned": c.collective.group.nodes,
                "intra_node_bytes_per_rank": c.intra_node_bytes_per_rank,
                "inter_node_bytes_per_rank": c.inter_node_bytes_per_rank,
                "time_seconds": float(c.time_seconds),
                "what": c.collective.what,
            }
            for c in s.collectives
        ],
        "sent_bytes_per_rank": s.sent_bytes_per_rank,
        "sent_readable": readable(s.sent_bytes_per_rank),
        "ratio_to_ddp": None if s.ratio_to_ddp is None else float(s.ratio_to_ddp),
        "time_seconds": float(s.time_seconds),
        "collective_time_seconds": float(s.collective_time_seconds),
        "offload_transfers": [
            {
                "direction": t.direction,
                "phase": t.phase.value,
                "bytes": t.bytes,
                "time_seconds": float(secs),
                "what": t.what,
            }
            for t, secs in zip(s.transfers, s.transfer_seconds, strict=True)
        ],
        "offload_time_seconds": float(s.transfer_time_seconds),
        "notes": list(s.notes),
    }


def communication_body(
    result: CommunicationEstimate, decided: Decided | None = None
) -> dict[str, Any]:
    """:class:`CommunicationResponse`'s fields, in its order, as JSON values: the answer of
    :func:`communication_response` without building and validating its models."""
    setup = result.setup
    t, topo, net = setup.training, setup.topology, setup.network
    dp_group = topo.dp_group()
    config = resolved_config(t.engine, decided)
    return {
        "params": t.params,
        "params_per_device": t.params_per_device,
        "dp": t.dp,
        "tp": t.tp,
        "pp": t.pp,
        "grad_accumulation_steps": setup.grad_accumulation_steps,
        "convention": {
            "engine": t.engine.value,
            "description": result.convention,
            "grad_sync": setup.grad_sync.value,
            "time_model": TIME_MODEL,
            "ignores": result.ignores,
        },
        "topology": {
            "nodes": topo.nodes,
            "gpus_per_node": topo.gpus_per_node,
            "nics_per_node": topo.nics,
            "dp_group_nodes": dp_group.nodes,
            "dp_ranks_per_node": dp_group.per_node,
            "assumed": topo.assumed,
            "layout": TOPOLOGY_LAYOUT,
        },
        "links": {
            "intra_node": _link_body(net.intra),
            "inter_node": _link_body(net.inter),
            "host": _link_body(net.host),
        },
        "stages": [_stage_body(s) for s in result.stages],
        "resolved_config": None
        if config is None
        else config.model_dump(mode="json", by_alias=True),
    }


TOPOLOGY_LAYOUT = (
    "global rank = (pp_rank · dp + dp_rank) · tp + tp_rank (tensor parallel innermost); "
    "node = rank // gpus_per_node"
)


def communication_response(
    result: CommunicationEstimate, decided: Decided | None = None
) -> CommunicationResponse:
    setup = result.setup
    t, topo, net = setup.training, setup.topology, setup.network
    dp_group = topo.dp_group()
    return CommunicationResponse(
        params=t.params,
        params_per_device=t.params_per_device,
        dp=t.dp,
        tp=t.tp,
        pp=t.pp,
        grad_accumulation_steps=setup.grad_accumulation_steps,
        convention=CommunicationConvention(
            engine=t.engine,
            description=result.convention,
            grad_sync=setup.grad_sync,
            time_model=TIME_MODEL,
            ignores=result.ignores,
        ),
        topology=TopologyOut(
            nodes=topo.nodes,
            gpus_per_node=topo.gpus_per_node,
            nics_per_node=topo.nics,
            dp_group_nodes=dp_group.nodes,
            dp_ranks_per_node=dp_group.per_node,
            assumed=topo.assumed,
            layout=TOPOLOGY_LAYOUT,
        ),
        links={
            "intra_node": _link_out(net.intra),
            "inter_node": _link_out(net.inter),
            "host": _link_out(net.host),
        },
        stages=[_stage_out(s) for s in result.stages],
        resolved_config=resolved_config(t.engine, decided),
    )


def inference_response(
    params: int, mem: InferenceMemory, device_memory: int | None
) -> InferenceResponse:
    sizes = {"weights": mem.weights, "kv_cache": mem.kv_cache, "total": mem.total}
    notes = ["decode-step activations are transient and not counted"]
    if mem.kv_cache is None:
        notes.append("give an architecture, preset or hf_config for the KV cache")
    needed = mem.total if mem.total is not None else mem.weights
    return InferenceResponse(
        params=params,
        weights=mem.weights,
        kv_cache=mem.kv_cache,
        total=mem.total,
        readable={k: readable(v) for k, v in sizes.items() if v is not None},
        fits=None if device_memory is None else needed <= device_memory,
        notes=notes,
    )


# --- capacity ----------------------------------------------------------------------------------


def _replicated(est: StageEstimate) -> str:
    """What of a stage's device bytes Nd does not divide (ZeRO §5: what the stage replicates)."""
    d = est.device
    parts = {
        Stage.NONE: ("every model state", d.total),
        Stage.OPTIMIZER: ("the parameters and gradients", d.parameters + d.gradients),
        Stage.GRADIENTS: ("the parameters", d.parameters),
        Stage.PARAMETERS: ("nothing of the model states", 0),
    }
    what, replicated = parts[est.stage]
    rest = needed(est) - d.total
    if est.stage is Stage.PARAMETERS:
        return f"{what}; activations, buffers and workspaces take {readable(rest)}"
    return (
        f"{what} replicated on every rank take {readable(replicated)}, "
        f"activations, buffers and workspaces {readable(rest)}"
    )


def _architecture_out(arch: Architecture) -> dict[str, Any]:
    """The architecture as ``model.architecture`` takes it (the shape; which modelling code
    trains it is said in the model's name)."""
    return {
        f.name: v.value if isinstance(v, Enum) else v
        for f in fields(arch)
        if f.name != "modelling"
        for v in [getattr(arch, f.name)]
    }


def _params_readable(params: int) -> str:
    return f"{params / 1e9:,.2f} B params"


def _found_model(result: CapacityResult, row: CapacityRow) -> FoundModel | None:
    if row.params is None:
        return None
    arch = row.architecture
    name = (
        f"{_params_readable(row.params)} (a bare parameter count)"
        if arch is None
        else f"{result.search.shape_name} shape, {arch.layers} layers × {arch.hidden}"
        + (
            ""
            if arch.modelling is None
            else f", trained with transformers' {arch.modelling.family} modelling code"
        )
    )
    return FoundModel(
        name=name,
        params=row.params,
        params_readable=_params_readable(row.params),
        architecture=None if arch is None else _architecture_out(arch),
    )


def _capacity_notes(result: CapacityResult, row: CapacityRow) -> list[str]:
    q, s = result.search, int(row.stage)
    device = readable(q.device_memory)
    notes: list[str] = []
    if row.smallest is not None and row.smallest_params is not None:
        what = (
            "a 1-parameter model"
            if q.shape is None
            else f"one block of the {q.shape_name} shape ({_params_readable(row.smallest_params)})"
        )
        notes.append(
            f"max_params is null: not even {what} fits stage {s}: it needs "
            f"{readable(needed(row.smallest))} > {device}"
        )
    if row.capped:
        notes.append(
            "the largest model searched fits: max_params is a lower bound (the search stops at "
            f"{MAX_GROWN_LAYERS} layers or {MAX_PARAMS:,} parameters)"
        )
    if row.found is not None and row.params is not None:
        trial = replace(q.setup, params=row.params, architecture=row.architecture)
        notes.extend(null_notes(row.found, trial))
        notes.extend(row.found.notes)
    if row.at_max_dp is not None:
        notes.append(
            f"min_dp is null: stage {s} never fits at any Nd up to max_dp = {q.max_dp:,}: "
            f"there it still needs {readable(needed(row.at_max_dp))} > {device}: "
            f"{_replicated(row.at_max_dp)}"
        )
    return notes


def _grown(name: str, base: Architecture) -> str:
    return (
        f"{name} shape: {base.hidden / base.layers:g} hidden per layer ({base.hidden} / "
        f"{base.layers}), heads {base.d_head} wide, {base.heads // base.n_kv_heads} query "
        f"head(s) per key/value head, MLP {base.ffn / base.hidden:g} × hidden; other fields kept"
    )


def capacity_response(result: CapacityResult) -> CapacityResponse:
    q = result.search
    device = readable(q.device_memory)
    counts_peak = q.setup.engine is not Engine.PAPER or (
        q.setup.batch is not None and q.shape is not None
    )
    notes = []
    if q.setup.batch is not None and q.shape is None:
        notes.append(
            "the batch is not counted for max_params: a bare parameter count has no "
            "architecture to size activations; give shape, or a model with an architecture"
        )
    if q.shape is None and q.setup.engine is Engine.DEEPSPEED:
        notes.append(BARE_PARAMS_NOTE)
    return CapacityResponse(
        device_memory=q.device_memory,
        dp=q.setup.dp,
        engine=q.setup.engine.value,
        criterion=(
            f"the engine's per-device peak (its resident bytes where it cannot estimate a peak) "
            f"<= device_memory ({device}); {result.convention}"
            if counts_peak
            else f"per-device model states <= device_memory ({device})"
        ),
        grown=None if q.shape is None else _grown(q.shape_name, q.shape),
        stages=[
            StageCapacity(
                stage=int(row.stage),
                max_params=row.params,
                max_params_readable=None if row.params is None else _params_readable(row.params),
                model=_found_model(result, row),
                per_device=None if row.found is None else per_device(row.found),
                needed=None if row.found is None else needed(row.found),
                min_dp=row.min_dp,
                notes=_capacity_notes(result, row),
            )
            for row in result.stages
        ],
        notes=notes,
    )


def _config_out(c: Config) -> ConfigOut:
    return ConfigOut(
        stage=int(c.stage),
        micro_batch_size=c.micro_batch_size,
        grad_accumulation_steps=c.grad_accumulation_steps,
        activation_checkpointing=c.activation_checkpointing,
        offload=c.offload,
        shard_group_size=c.shard_group_size,
        checkpoint_offload=c.checkpoint_offload,
        checkpoint_every_n_layers=c.checkpoint_every_n_layers,
    )


def _candidate_out(rank: int, c: Candidate) -> CandidateOut:
    s = c.step
    return CandidateOut(
        rank=rank,
        config=_config_out(c.config),
        tokens_per_second=c.tokens_per_second,
        step_time_seconds=s.total,
        step_time=StepTimeOut(
            compute=s.compute + s.optimizer_step,
            matmul=s.matmul,
            memory_bound=s.memory_bound,
            gpu_busy=s.gpu_busy,
            host_dispatch=s.host_dispatch,
            gpu_idle=max(0.0, s.host_dispatch - s.gpu_busy),
            bound="host" if s.host_bound else "gpu",
            recompute=s.recompute,
            optimizer_step=s.optimizer_step,
            exposed_communication=s.exposed_communication,
            communication=s.communication,
            offload_transfer=s.offload_transfer,
            checkpoint_transfer=s.checkpoint_transfer,
        ),
        per_device=per_device(c.memory),
        headroom=c.headroom,
        cpu=HostMemory(**_host_body(c.memory.cpu, c.memory.cpu_buffers, c.memory.cpu_activations)),
        sent_bytes_per_rank=c.sent_bytes_per_rank,
        assumptions=OverlapOut(**asdict(c.overlap)),
    )


def plan_response(result: Plan) -> PlanResponse:
    setup = result.setup
    g = setup.gpu
    a = asdict(result.assumptions)
    a["notes"] = list(result.assumptions.notes)
    a["kernels"] = [
        KernelCountsOut(stage=int(stage), **asdict(k)) for stage, k in result.assumptions.kernels
    ]
    return PlanResponse(
        params=setup.params,
        gpu=GpuOut(
            name=g.name,
            label=g.label,
            memory=g.memory,
            peak_flops=setup.peak_flops,
            memory_bandwidth=g.memory_bandwidth,
            source=g.source,
        ),
        gpus=setup.gpus,
        nodes=setup.nodes,
        gpus_per_node=setup.gpus_per_node,
        global_batch_size=setup.global_batch_size,
        seq_len=setup.seq_len,
        tokens_per_step=setup.global_batch_size * setup.seq_len,
        engine=setup.engine,
        candidates=[_candidate_out(i, c) for i, c in enumerate(result.candidates, 1)],
        rejected=[
            RejectedOut(
                config=_config_out(r.config), reason=r.reason, peak=r.peak, over_by=r.over_by
            )
            for r in result.rejected
        ],
        calibration=CalibrationUsed(
            efficiency=setup.efficiency.value,
            source=setup.efficiency.source,
            calibration_id=setup.efficiency.calibration_id,
            host_seconds_per_kernel=setup.efficiency.host_seconds_per_kernel,
            host_source=setup.efficiency.host_source,
            host_calibration_id=setup.efficiency.host_calibration_id,
        ),
        assumptions=PlanAssumptions(**a),
        evaluated=result.evaluated,
    )
