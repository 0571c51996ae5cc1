"""POST /v1/plan and /v1/calibrations: request and response."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    GetJsonSchemaHandler,
    StrictBool,
    StrictInt,
    Tag,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from app.schemas.common import Degree, DeviceBytes, JsonObject, StrictModel
from app.schemas.communication import LinkIn
from app.schemas.memory import HostMemory, PerDevice, StageNumber
from app.schemas.model import ModelSpec
from calculators.batch import Checkpointing
from calculators.conventions import Engine, Optimizer, Precision
from calculators.interconnects import DEFAULT_INTER_NODE
from calculators.plan import HostThreads, Learned, OffloadChoice

NULL = {"type": "null"}
# below 0.1 % of the peak a step time stops being a number (and no GPU trains that slowly)
MIN_EFFICIENCY = 0.001
# a kernel dispatch slower than 10 ms is no host a GPU trains from
MAX_HOST_SECONDS_PER_KERNEL = 0.01
# a host optimizer streaming over 10 TB/s per rank is no CPU, one below 1 MB/s trains nothing
MAX_HOST_OPTIMIZER_BANDWIDTH = 1e13
MIN_HOST_OPTIMIZER_BANDWIDTH = 1e6

GpuName = Annotated[str, Field(max_length=32, description="A GPU preset name (GET /v1/gpus).")]


class GpuIn(StrictModel):
    """A GPU given by its figures."""

    memory: Annotated[DeviceBytes, Field(description="Device memory, bytes.")]
    peak_flops: Annotated[
        float,
        Field(gt=0, le=1e18, description="Dense FLOP/s its training matmuls run at (BF16)."),
    ]
    memory_bandwidth: Annotated[
        StrictInt | None,
        Field(ge=1, le=10**15, description="Device memory bytes/s (optimizer step time)."),
    ] = None
    name: Annotated[
        str | None,
        Field(
            max_length=64,
            description="A name to match stored calibrations against (e.g. a preset name).",
        ),
    ] = None


# SearchIn's lists, each value at most once (checked, and ``uniqueItems`` in the schema)
_UNIQUE_LISTS = (
    "stages",
    "micro_batch_size",
    "activation_checkpointing",
    "offload",
    "checkpoint_offload",
    "checkpoint_every_n_layers",
)


def _unique(values: list[object]) -> list[object]:
    if len(set(values)) != len(values):
        raise ValueError("each value may appear once")
    return values


class SearchIn(StrictModel):
    """What may vary; each list is tried in full (their product is evaluated)."""

    stages: Annotated[
        list[StageNumber], Field(min_length=1, max_length=4, description="ZeRO stages, 0 to 3.")
    ] = [0, 1, 2, 3]
    micro_batch_size: Annotated[
        list[Annotated[StrictInt, Field(ge=1, le=65536)]] | None,
        Field(
            max_length=32,
            description="Sequences per micro-batch; null = every power of two dividing the "
            "per-GPU batch (global_batch_size / gpus). Gradient accumulation makes up the rest.",
        ),
    ] = None
    activation_checkpointing: Annotated[list[Checkpointing], Field(min_length=1, max_length=3)] = (
        Field(
            default_factory=lambda: list(Checkpointing),
            description="none, selective (attention core recomputed), full (every block). A "
            "transformers model tries none and full: transformers checkpoints whole decoder "
            "layers.",
        )
    )
    offload: Annotated[list[OffloadChoice], Field(min_length=1, max_length=3)] = Field(
        default_factory=lambda: list(OffloadChoice),
        description="none, optimizer (CPU; DeepSpeed, stage >= 1), optimizer_and_params (CPU; "
        "DeepSpeed stage 3, or FSDP2's CPUOffloadPolicy at torch stages 2 and 3: parameters, "
        "gradients and torch's optimizer on the host).",
    )
    hsdp: StrictBool = Field(
        True,
        description="Also try stage 3 sharded within a node and replicated across nodes (FSDP2 "
        "HYBRID_SHARD; engine torch: DeepSpeed 0.19.8 removed MiCS); only with more than one "
        "node.",
    )
    checkpoint_offload: Annotated[list[StrictBool], Field(min_length=1, max_length=2)] = Field(
        default_factory=lambda: [False, True],
        description="Where full checkpointing keeps each decoder layer's input: false on the "
        "device, true in pinned host memory, copied back for the layer's recomputation "
        "(transformers' gradient_checkpointing_enable(offload=True), the Trainer's "
        'gradient_checkpointing_kwargs {"offload": true}). Tried with full checkpointing of a '
        "transformers model (hf_config or a transformers preset); another model tries false.",
    )
    checkpoint_every_n_layers: Annotated[
        list[Annotated[StrictInt, Field(ge=1, le=65536)]], Field(min_length=1, max_length=8)
    ] = Field(
        default_factory=lambda: [1],
        description="Which decoder layers full checkpointing checkpoints: 1 every layer, n "
        "layers 0, n, 2n, ... only, the others keeping what they save (transformers' "
        "gradient_checkpointing_enable(every_n_layers=n), the Trainer's "
        'gradient_checkpointing_kwargs {"every_n_layers": n}): less recomputation for more '
        "memory. Above 1 is tried for a transformers model (hf_config or a transformers "
        "preset) under engine torch; include 1 otherwise.",
    )

    @field_validator(*_UNIQUE_LISTS)
    @classmethod
    def unique(cls, values: list[object] | None) -> list[object] | None:
        return None if values is None else _unique(values)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """Each list's values appear once (``uniqueItems``), as ``unique`` checks."""
        schema = handler.resolve_ref_schema(handler(core_schema))
        for key in _UNIQUE_LISTS:
            prop = schema["properties"][key]
            for form in (prop, *prop.get("anyOf", ())):
                if form.get("type") == "array":
                    form["uniqueItems"] = True
        return schema


class PlanRequest(StrictModel):
    """Which ZeRO configuration to run on these GPUs, ranked by predicted throughput."""

    model: ModelSpec = Field(
        description="The model: architecture, preset or hf_config (a plan needs the shape)."
    )
    gpu: Annotated[
        Annotated[str, Field(max_length=32), Tag("name")] | Annotated[GpuIn, Tag("figures")],
        # a string is a preset's name, anything else the figures: a refusal names one form
        Discriminator(lambda v: "name" if isinstance(v, str) else "figures"),
        Field(description='A GPU preset name (GET /v1/gpus) or {"memory", "peak_flops"}.'),
    ]
    gpus: Annotated[Degree, Field(description="GPUs in all (the data-parallel degree).")]
    gpus_per_node: Annotated[
        StrictInt | None,
        Field(ge=1, le=1024, description="GPUs per host; default 8 when gpus divides by 8."),
    ] = None
    interconnect: LinkIn | None = Field(
        None,
        description="Link between GPUs of one node: an interconnect preset or "
        '{"bandwidth", "latency"}; default the GPU\'s own (NVLink or PCIe).',
    )
    inter_node_interconnect: LinkIn = Field(
        DEFAULT_INTER_NODE, description="One network adapter between nodes: preset or numbers."
    )
    host_interconnect: LinkIn | None = Field(
        None, description="Device-host link for offload traffic; default the GPU's PCIe."
    )
    global_batch_size: Annotated[
        StrictInt, Field(ge=1, le=2**24, description="Sequences per optimizer step, all GPUs.")
    ]
    seq_len: Annotated[StrictInt, Field(ge=1, le=1_048_576, description="Tokens per sequence.")]
    padded: StrictBool = Field(
        False,
        description="The batches come with an attention_mask that has zeros (a padding "
        "collator): transformers models keep a (micro_batch, 1, seq, seq) mask and expanded "
        "key/value in every layer, and attention computes every product (no causal skip).",
    )
    engine: Engine = Field(Engine.TORCH, description="torch or deepspeed.")
    engine_config: Annotated[
        JsonObject | None,
        Field(
            description="Engine knobs (a DeepSpeed config body for deepspeed); stage, offload, "
            "micro-batch and accumulation are set by the search."
        ),
    ] = None
    precision: Precision = Field(Precision.MIXED_BF16, description="Training precision.")
    optimizer: Optimizer = Field(Optimizer.ADAM, description="Optimizer.")
    search: SearchIn = Field(default_factory=SearchIn, description="What may vary.")
    efficiency: Annotated[
        float | None,
        Field(
            ge=MIN_EFFICIENCY,
            le=1,
            description="Fraction of the dense peak the GEMMs reach (at least 0.1 %); null = a "
            "stored calibration for this GPU and precision, else the stated default.",
        ),
    ] = None
    host_seconds_per_kernel: Annotated[
        float | None,
        Field(
            gt=0,
            le=MAX_HOST_SECONDS_PER_KERNEL,
            description="Host time to dispatch one kernel, seconds; null = a stored "
            "calibration for this GPU and precision, else the stated default.",
        ),
    ] = None
    host_optimizer_bandwidth: Annotated[
        float | None,
        Field(
            ge=MIN_HOST_OPTIMIZER_BANDWIDTH,
            le=MAX_HOST_OPTIMIZER_BANDWIDTH,
            description="Bytes/s one rank's offloaded optimizer step streams on the host, at "
            "least 1 MB/s (e.g. from bench/host_adam.py on your node); null = a stored "
            "calibration of this GPU, precision and engine from an offloaded run, else the "
            "engine's stated figure.",
        ),
    ] = None
    host_optimizer_threads: HostThreads | None = Field(
        default=None,
        description="The threads each rank's offloaded optimizer step runs on (torch's optimizer "
        "under FSDP2's CPU offload; DeepSpeed's CPU Adam and the torch ops around it). one: "
        "OMP_NUM_THREADS=1, as torchrun sets it when a node runs several ranks and accelerate "
        "launch always does; all: every core, a node's only rank started by python or torchrun, "
        "or any rank the deepspeed launcher starts. null = one with several GPUs per node or an "
        "accelerate config, else all.",
    )


class ConfigOut(BaseModel):
    """One configuration."""

    stage: int
    micro_batch_size: int
    grad_accumulation_steps: int
    activation_checkpointing: Checkpointing
    offload: OffloadChoice
    shard_group_size: int | None = Field(
        description="HSDP / MiCS shard group; null = sharded over all GPUs."
    )
    checkpoint_offload: bool = Field(
        description="Full checkpointing keeps each layer's input in pinned host memory "
        "(transformers' offload=True); false with any other checkpointing."
    )
    checkpoint_every_n_layers: int = Field(
        description="Full checkpointing checkpoints layers 0, n, 2n, ... only (transformers' "
        "every_n_layers); 1 with every layer checkpointed and with any other checkpointing."
    )


class StepTimeOut(BaseModel):
    """Seconds per optimizer step; compute + exposed_communication + offload_transfer =
    step_time_seconds."""

    compute: float = Field(
        description="The micro-steps (each max(GPU work, host dispatch)) + optimizer_step."
    )
    matmul: float = Field(description="GEMM and attention kernels of the micro-steps.")
    memory_bound: float = Field(
        description="Element-wise, norm, cast and copy kernels of the micro-steps."
    )
    gpu_busy: float = Field(description="The micro-steps' GPU work: matmul + memory_bound.")
    host_dispatch: float = Field(description="The micro-steps' host dispatch time.")
    gpu_idle: float = Field(
        description="max(0, host_dispatch − gpu_busy): the GPU waiting for the host; matmul "
        "+ memory_bound + gpu_idle + optimizer_step = compute."
    )
    bound: Literal["gpu", "host"] = Field(
        description="Which queue sets the micro-steps' pace: the GPU's work or the host's "
        "dispatch (the other idles)."
    )
    recompute: float = Field(description="Part of matmul that checkpointing repeats.")
    optimizer_step: float = Field(
        description="The element-wise optimizer update (on the host when offloaded; with "
        "FSDP2's CPU offload also the host's gradient accumulation between micro-steps)."
    )
    exposed_communication: float = Field(description="Collective time not hidden by compute.")
    communication: float = Field(description="All collective time, hidden or not.")
    offload_transfer: float = Field(
        description="Device-host copies of offloaded states, and checkpoint_transfer."
    )
    checkpoint_transfer: float = Field(
        description="Part of offload_transfer: checkpoint offload's copies of each layer's "
        "input to host memory in forward and back in backward, on the compute stream, at the "
        "host link's rate (0 without checkpoint_offload)."
    )


class OverlapOut(BaseModel):
    """Which phases' collectives run behind compute."""

    forward: bool
    backward: bool
    step: bool
    reason: str


class CandidateOut(BaseModel):
    rank: int = Field(description="1 = the fastest.")
    config: ConfigOut
    tokens_per_second: float = Field(description="All GPUs together.")
    step_time_seconds: float
    step_time: StepTimeOut
    per_device: PerDevice
    headroom: int = Field(description="Usable device bytes left above the peak.")
    cpu: HostMemory
    sent_bytes_per_rank: int
    assumptions: OverlapOut = Field(description="This candidate's overlap assumptions.")


class RejectedOut(BaseModel):
    config: ConfigOut
    reason: str
    peak: int | None = Field(description="Predicted peak bytes (null: not estimated, see reason).")
    over_by: int | None = Field(description="Bytes above the usable memory (null: see reason).")


class CalibrationUsed(BaseModel):
    """Which stored measurement set the GEMM efficiency and the host cost per kernel, or the
    stated defaults."""

    efficiency: float = Field(description="Fraction of the dense peak the GEMMs reach.")
    source: str
    calibration_id: str | None = Field(
        description="The stored calibration used; null when none matched (see source)."
    )
    host_seconds_per_kernel: float = Field(description="Host dispatch time per kernel.")
    host_source: str
    host_calibration_id: str | None = Field(
        description="The stored calibration that set the host cost; null when none matched "
        "(see host_source)."
    )


class GpuOut(BaseModel):
    name: str
    label: str
    memory: int
    peak_flops: float = Field(description="Dense FLOP/s at the plan's precision.")
    memory_bandwidth: int
    source: str


class KernelCountsOut(BaseModel):
    """Host dispatches per parameter tensor per micro-step of one stage's engine."""

    stage: int
    forward: float = Field(description="Kernels per parameter tensor in forward.")
    backward: float = Field(description="Kernels per parameter tensor in backward.")
    hooks: float = Field(description="Engine-hook steps per parameter tensor (host only).")
    per_collective: float = Field(
        description="Further hook steps per tensor per collective, when the group has more "
        "than one rank."
    )
    collectives: int = Field(description="Collectives per tensor per micro-step.")
    reason: str


class PlanAssumptions(BaseModel):
    """Every figure the plan assumes rather than derives."""

    efficiency: float = Field(description="Fraction of the dense peak the GEMMs reach.")
    efficiency_source: str
    attention_efficiency: float = Field(
        description="Fraction of the dense peak the attention kernels reach."
    )
    memory_efficiency: float = Field(
        description="Fraction of the memory bandwidth the memory-bound kernels and the "
        "optimizer step reach."
    )
    activation_passes_forward: float = Field(
        description="Passes over the saved activation bytes in forward (memory-bound kernels)."
    )
    activation_passes_backward: float = Field(description="The same in backward.")
    parameter_bytes_forward: float = Field(
        description="Bytes per parameter streamed per micro-step in forward outside GEMMs."
    )
    parameter_bytes_backward: float = Field(description="The same in backward.")
    host_seconds_per_kernel: float = Field(description="Host dispatch time per kernel.")
    host_seconds_per_kernel_source: str
    parameter_tensors: int = Field(description="Parameter tensors of the model.")
    kernels: list[KernelCountsOut] = Field(description="Host dispatch counts per stage.")
    peak_flops: float
    peak_flops_source: str
    causal_attention_fraction: float = Field(
        description="Share of the s × s attention products the kernel computes: a causal "
        "kernel's half, or all of them with a padding mask (padded)."
    )
    attention_backward_factor: float = Field(description="Attention backward / forward FLOPs.")
    context_reserve: int = Field(
        description="Device bytes outside the allocator (CUDA context, kernels, NCCL's buffers), "
        "measured per engine and for one rank or several."
    )
    context_reserve_source: str = Field(description="Where context_reserve comes from.")
    allocator_margin: float = Field(description="Fraction kept free for allocator rounding.")
    usable_memory: int = Field(description="(memory − context_reserve) × (1 − allocator_margin).")
    host_optimizer_bandwidth: float = Field(
        description="Host bytes/s of one rank's offloaded optimizer step (DeepSpeed's CPU Adam, "
        "or torch's optimizer under FSDP2's CPU offload)."
    )
    host_optimizer_source: str = Field(description="Where host_optimizer_bandwidth comes from.")
    host_optimizer_threads: HostThreads = Field(
        description="The threads each rank's offloaded optimizer step runs on (one or all), "
        "which host_optimizer_bandwidth is for."
    )
    host_optimizer_threads_source: str = Field(description="Why host_optimizer_threads.")
    offload_transfer_overlapped: bool
    compute_slowdown_from_overlap: float = Field(
        description="Compute slowdown while collectives share the GPU (not modelled: 0)."
    )
    notes: list[str]


class PlanResponse(BaseModel):
    params: int
    gpu: GpuOut
    gpus: int
    nodes: int
    gpus_per_node: int
    global_batch_size: int
    seq_len: int
    tokens_per_step: int
    engine: Engine
    candidates: list[CandidateOut] = Field(description="Configurations that fit, fastest first.")
    rejected: list[RejectedOut]
    calibration: CalibrationUsed
    assumptions: PlanAssumptions
    evaluated: int = Field(description="Configurations evaluated.")


class CalibrationRequest(StrictModel):
    """Store a compute efficiency for a GPU: from a measured run, or one measured elsewhere."""

    measurement_id: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=64,
            description="A succeeded /v1/measure job on a GPU: its step time sets the efficiency.",
        ),
    ] = None
    stage: Annotated[
        StageNumber | None,
        Field(description="Which run of the job (its ZeRO stage); null = the first."),
    ] = None
    gpu: GpuName | None = Field(
        None, description="With efficiency: the GPU preset it was measured on."
    )
    precision: Precision = Field(
        Precision.MIXED_BF16, description="With efficiency: the precision it was measured at."
    )
    engine: Engine = Field(Engine.TORCH, description="With efficiency: the engine that ran.")
    efficiency: Annotated[
        float | None,
        Field(
            ge=MIN_EFFICIENCY,
            le=1,
            description="Model-FLOPs utilisation measured elsewhere (e.g. your training logs), "
            "at least 0.1 %.",
        ),
    ] = None
    source: Annotated[str, Field(max_length=200, description="Where the figure comes from.")] = (
        "given by the request"
    )
    figure: Learned | None = Field(
        None,
        description="With measurement_id: which figure the run sets, gpu (the GEMM "
        "efficiency), host (the host cost per kernel: from the run's host probe where it timed "
        "one), both (needs the host probe) or host_optimizer (an offloaded run's timed host "
        "optimizer step alone); null = both where the run timed the host probe (the efficiency "
        "only where the step shows the GPU), else the queue the model finds binding in that run "
        "(a large micro-batch: gpu; several small micro-steps: host). A run offloading to the "
        "CPU sets no GEMM efficiency unless asked (its step also holds the host copies): its "
        "probe sets host, else its timed optimizer step host_optimizer. An offloaded run's "
        "timed optimizer step also sets the host optimizer bandwidth.",
    )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """``one_source`` as ``oneOf``: a measurement id, or an efficiency with its gpu."""
        schema = handler.resolve_ref_schema(handler(core_schema))
        props: dict[str, Any] = schema["properties"]

        def given(key: str) -> dict[str, Any]:
            out = {k: v for k, v in props[key].items() if k not in ("anyOf", "default")}
            out.update(next(x for x in props[key].get("anyOf", [props[key]]) if x != NULL))
            return out

        def form(title: str, required: list[str], absent: list[str]) -> dict[str, Any]:
            own = {
                k: (given(k) if k in required else NULL if k in absent else v)
                for k, v in props.items()
            }
            return {
                "title": title,
                "type": "object",
                "properties": own,
                "required": required,
                "additionalProperties": False,
            }

        return {
            "title": schema.get("title", cls.__name__),
            "description": schema.get("description", ""),
            "type": "object",
            "oneOf": [
                form("From a measurement", ["measurement_id"], ["gpu", "efficiency"]),
                form(
                    "An efficiency measured elsewhere",
                    ["efficiency", "gpu"],
                    ["measurement_id", "figure"],
                ),
            ],
        }

    @model_validator(mode="after")
    def one_source(self) -> Self:
        if (self.measurement_id is None) == (self.efficiency is None):
            raise ValueError("give measurement_id, or efficiency with gpu (not both)")
        if self.efficiency is not None and self.gpu is None:
            raise ValueError("efficiency needs the gpu it was measured on")
        if self.efficiency is not None and self.figure is not None:
            raise ValueError("figure goes with measurement_id: a given efficiency sets the GPU")
        return self


class CalibrationPublic(BaseModel):
    id: str
    gpu: str = Field(description="GPU preset name the efficiency was measured on.")
    device_name: str = Field(description="What the device called itself (or the preset label).")
    precision: Precision
    engine: Engine
    efficiency: float = Field(description="Fraction of the dense peak the GEMMs reached.")
    host_seconds_per_kernel: float | None = Field(
        None, description="Host dispatch time per kernel the run implies (null: see note)."
    )
    figure: Learned | None = Field(
        None,
        description="Which figure this calibration sets for /v1/plan: gpu (efficiency), "
        "host (host_seconds_per_kernel), both, or host_optimizer (host_optimizer_bandwidth "
        "alone); null: stored by an earlier step-time model, "
        "which /v1/plan no longer uses (see note).",
    )
    measurement_id: str | None = Field(description="The measure job (null: see note).")
    stage: int | None = Field(description="The run's ZeRO stage (null: see note).")
    measured_step_time_seconds: float | None = Field(description="null: see note.")
    predicted_other_seconds: float | None = Field(
        description="Predicted exposed communication, optimizer step and offload taken off the "
        "measured step (null: see note)."
    )
    host_probe_seconds: float | None = Field(
        None,
        description="The run's host probe: one micro-step (forward + backward) at one short "
        "sequence, median seconds; it set host_seconds_per_kernel (null: see note).",
    )
    host_optimizer_bandwidth: float | None = Field(
        None,
        description="Bytes/s per rank of the offloaded optimizer step the run timed on its host; "
        "/v1/plan uses it for offload candidates of this engine whose ranks step on as many "
        "threads (null: see note).",
    )
    host_optimizer_threads: HostThreads | None = Field(
        None,
        description="The threads each of the run's ranks stepped its host optimizer on (one, "
        "or all: torch's default); a plan uses host_optimizer_bandwidth only where its ranks "
        "step on as many (null: see note).",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="What the measurement could not set, and why (a host-bound step leaves the "
        "efficiency at its stated figure; a probe that does not show the host leaves the host "
        "cost).",
    )
    note: str = Field(description="Where the efficiency comes from.")
    created_at: float


class CalibrationsPublic(BaseModel):
    data: list[CalibrationPublic]
    count: int
