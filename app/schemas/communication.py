"""POST /v1/communication: request and response."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StrictBool, StrictInt

from app.schemas.common import Degree, StrictModel
from app.schemas.memory import ResolvedConfig, TrainingIn
from app.schemas.model import ModelSpec
from calculators.batch import Checkpointing
from calculators.conventions import Engine
from calculators.interconnects import DEFAULT_HOST_LINK, DEFAULT_INTER_NODE, DEFAULT_INTRA_NODE
from calculators.topology import Algorithm, Link, Op
from calculators.traffic import GradSync, Phase

PresetName = Annotated[str, Field(max_length=32, description="An interconnect preset name.")]


class InterconnectIn(StrictModel):
    """A link given by its numbers."""

    bandwidth: Annotated[
        float,
        Field(
            ge=1,
            le=1e15,
            description="Bytes per second, one direction, per device "
            "(intra-node, host) or per NIC (inter-node).",
        ),
    ]
    latency: Annotated[float, Field(ge=0, le=1, description="Seconds per ring step (hop).")] = 0.0


LinkIn = PresetName | InterconnectIn


class ZeroPlusPlusIn(StrictModel):
    """ZeRO++ (arXiv 2306.10209) options; stage 3 only."""

    qwz: StrictBool = Field(False, description="Quantized weights: int8 parameter all-gathers.")
    hpz: Annotated[StrictInt, Field(ge=1, le=2**20)] = Field(
        1, description="Secondary partition size: backward all-gathers inside groups of this size."
    )
    qgz: StrictBool = Field(False, description="Quantized gradients: int4 hierarchical all-to-all.")


class CommunicationRequest(TrainingIn):
    """Communication per optimizer step of one model under the given ZeRO stages."""

    model: ModelSpec = Field(description="The model: params, architecture, preset or hf_config.")
    grad_accumulation_steps: Annotated[StrictInt, Field(ge=1, le=65536)] = Field(
        1, description="Micro-batches per optimizer step."
    )
    grad_sync: GradSync = Field(
        GradSync.PER_STEP,
        description="per_step: gradients are reduced once per optimizer step (DDP no_sync, "
        "FSDP2 set_requires_gradient_sync(False)); per_micro_step: after every micro-batch. "
        "Stage 3 gathers and (paper, deepspeed) reduce-scatters on every micro-step regardless; "
        "DeepSpeed decides by itself (stage 2 every micro-step, stages 0/1 once).",
    )
    activation_checkpointing: Checkpointing = Field(
        Checkpointing.NONE,
        description="none, full or selective recomputation. Under full (transformers' "
        "gradient checkpointing) DeepSpeed stage 3 fetches every layer's parameters again for "
        "its recomputation, and gathers again what it released after forward.",
    )
    nodes: Annotated[
        Degree | None, Field(description="Hosts; nodes × gpus_per_node = dp × tp × pp.")
    ] = None
    gpus_per_node: Annotated[
        StrictInt | None,
        Field(
            ge=1, le=1024, description="Devices per host; default 8 when dp × tp × pp divides by 8."
        ),
    ] = None
    nics_per_node: Annotated[
        StrictInt | None,
        Field(ge=1, le=1024, description="Network adapters per host; default one per device."),
    ] = None
    interconnect: LinkIn = Field(
        DEFAULT_INTRA_NODE,
        description="Link between devices of one node: a preset name (GET /v1/interconnects) or "
        '{"bandwidth", "latency"}.',
    )
    inter_node_interconnect: LinkIn = Field(
        DEFAULT_INTER_NODE, description="One network adapter between nodes: preset or numbers."
    )
    host_interconnect: LinkIn = Field(
        DEFAULT_HOST_LINK, description="Device-host link for offload traffic: preset or numbers."
    )
    algorithm: Algorithm = Field(
        Algorithm.RING, description="ring (flat NCCL ring) or hierarchical (2D) across nodes."
    )
    shard_group_size: Annotated[
        Degree | None,
        Field(
            description="HSDP / MiCS: shard within groups of this many ranks, replicate across "
            "groups (paper, torch stages 2-3)."
        ),
    ] = None
    zeropp: ZeroPlusPlusIn = Field(default_factory=ZeroPlusPlusIn, description="ZeRO++ options.")


class CollectiveOut(BaseModel):
    """Calls of one collective in one phase of an optimizer step, bytes per rank."""

    op: Op
    phase: Phase
    calls: int = Field(description="Calls per optimizer step.")
    payload_bytes: int = Field(description="Sum over calls of each call's full (unsharded) size.")
    sent_bytes_per_rank: int = Field(
        description="payload × 2(N−1)/N (all-reduce) or (N−1)/N (all-gather, reduce-scatter, "
        "all-to-all; broadcast/reduce: mean over ranks)."
    )
    dtype: str
    group_size: int
    link: Link
    nodes_spanned: int
    intra_node_bytes_per_rank: int
    inter_node_bytes_per_rank: int
    time_seconds: float
    what: str


class TransferOut(BaseModel):
    """Offload traffic over the host link per optimizer step, per rank."""

    direction: str = Field(description="d2h (device to host) or h2d.")
    phase: Phase
    bytes: int
    time_seconds: float
    what: str


class StageCommunicationOut(BaseModel):
    stage: int
    collectives: list[CollectiveOut]
    sent_bytes_per_rank: int
    sent_readable: str = Field(description="sent_bytes_per_rank as 'X GB (Y GiB)'.")
    ratio_to_ddp: float | None = Field(
        description="sent_bytes_per_rank / the same engine's stage 0 (null when that is 0)."
    )
    time_seconds: float = Field(description="Collectives plus offload transfers, serially.")
    collective_time_seconds: float
    offload_transfers: list[TransferOut]
    offload_time_seconds: float
    notes: list[str]


class LinkOut(BaseModel):
    name: str
    bandwidth: int = Field(description="Bytes per second, one direction.")
    latency_seconds: float = Field(description="Per ring step.")
    source: str


class TopologyOut(BaseModel):
    nodes: int
    gpus_per_node: int
    nics_per_node: int
    dp_group_nodes: int = Field(description="Nodes one data-parallel group spans.")
    dp_ranks_per_node: int
    assumed: bool = Field(description="True when the request gave neither nodes nor gpus_per_node.")
    layout: str


class CommunicationConvention(BaseModel):
    engine: Engine
    description: str
    grad_sync: GradSync
    time_model: str
    ignores: str


class CommunicationResponse(BaseModel):
    params: int
    params_per_device: int
    dp: int
    tp: int
    pp: int
    grad_accumulation_steps: int
    convention: CommunicationConvention
    topology: TopologyOut
    links: dict[str, LinkOut] = Field(description="intra_node, inter_node, host.")
    stages: list[StageCommunicationOut]
    resolved_config: ResolvedConfig | None = Field(
        None,
        description="What engine_config decided (engine deepspeed or torch); null when the "
        "request has no engine_config or uses engine paper.",
    )


class InterconnectPreset(BaseModel):
    name: str
    kind: str
    bandwidth: int = Field(description="Bytes per second, one direction.")
    latency_seconds: float
    source: str
