"""POST /v1/memory: request and response."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator
from pydantic_core import PydanticCustomError

from app.schemas.common import Degree, DeviceBytes, JsonObject, SmallDegree, StrictModel
from app.schemas.model import BatchIn, ModelSpec
from calculators.conventions import Engine, GradientConvention, OffloadDevice, Optimizer, Precision

StageNumber = Annotated[StrictInt, Field(ge=0, le=3)]


class OffloadIn(StrictModel):
    """Where optimizer states and parameters are offloaded."""

    optimizer: OffloadDevice = Field(
        OffloadDevice.NONE,
        description="none, cpu or nvme (engine deepspeed). Engine torch: cpu with params only.",
    )
    params: OffloadDevice = Field(
        OffloadDevice.NONE,
        description="none, cpu or nvme (engine deepspeed: stage 3). Engine torch: cpu is FSDP2's "
        "CPUOffloadPolicy (stages 2 and 3): the shards, their gradients and the optimizer's "
        "states in host memory, the optimizer stepping there.",
    )


class TrainingIn(StrictModel):
    """Fields every training question shares."""

    dp: Annotated[Degree, Field(description="Data-parallel degree Nd that ZeRO partitions over.")]
    tp: Annotated[SmallDegree, Field(description="Tensor-parallel degree.")] = 1
    pp: Annotated[SmallDegree, Field(description="Pipeline-parallel degree.")] = 1
    stages: Annotated[
        list[StageNumber],
        Field(
            min_length=1,
            max_length=4,
            description="ZeRO stages, 0 to 3.",
            json_schema_extra={"uniqueItems": True},
        ),
    ] = Field((0, 1, 2, 3), validate_default=True)  # a fresh list each time, no deep copy
    precision: Precision = Field(
        Precision.MIXED_FP16,
        description="mixed_fp16 / mixed_bf16 (16-bit params and grads, fp32 master and states), "
        "fp32, or bf16 (pure).",
    )
    optimizer: Optimizer = Field(Optimizer.ADAM, description="Optimizer; sets K.")
    k: Annotated[
        float | None,
        Field(ge=0, le=1024, description="Optimizer-state bytes per parameter; overrides K."),
    ] = None
    gradients: GradientConvention = Field(
        GradientConvention.PAPER,
        description="paper: 16-bit gradients (16 B/param); fp32_grads: fp32 gradient buffers "
        "as Megatron and DeepSpeed's estimators count them (18 B/param).",
    )
    master_weights: StrictBool = Field(
        True,
        description="Mixed precision keeps an fp32 master copy (paper: yes, K = 12 with Adam; "
        "false counts 16-bit params and grads plus fp32 moments: 2 + 2 + 8 B/param).",
    )
    offload: OffloadIn = Field(default_factory=OffloadIn, description="Offload targets.")
    engine: Engine = Field(Engine.PAPER, description="Whose accounting: paper, deepspeed, torch.")
    engine_config: Annotated[
        JsonObject | None,
        Field(
            description="The config you train with. Engine deepspeed: a DeepSpeed config body; "
            "it decides stage, fp16/bf16, offload, optimizer, micro-batch, accumulation and "
            'every ZeRO knob, "auto" filled as transformers\' Trainer fills it. Engine torch: '
            "FSDP2 settings (reshard_after_forward, mixed_precision as MixedPrecisionPolicy "
            "with reduce_dtype float32 or the param_dtype, offload_policy CPUOffloadPolicy, "
            "accelerate's fsdp_config keys), convert_outputs_to_fp32 (the loop trains "
            "through accelerate, transformers' Trainer included: under mixed precision forward "
            "returns an fp32 copy of the logits; on by default where accelerate's fsdp_* keys "
            "are given), trainer_loop (true: transformers' Trainer, which keeps the loss alone, "
            "so the logits die as forward returns and nothing is held between steps; either "
            "engine, a transformers model) and holds_outputs, cublas_workspace_bytes, "
            "cublaslt_workspace_bytes, compute_capability_major, "
            "caching_allocator (false: bytes as the tensors ask, no CUDA caching allocator's "
            "blocks). Request "
            "fields sent explicitly must agree with it; resolved_config in the response lists "
            "what it decided."
        ),
    ] = None

    @field_validator("engine_config")
    @classmethod
    def no_tensor_list(cls, config: dict[str, Any] | None) -> dict[str, Any] | None:
        if config is not None and "tensors" in config:
            raise PydanticCustomError(
                "not_a_setting",
                "engine_config.tensors is not an engine setting: the model comes from `model` "
                "(params, architecture, preset or hf_config)",
            )
        return config

    @field_validator("stages")
    @classmethod
    def unique_stages(cls, stages: list[int]) -> list[int]:
        if len(set(stages)) != len(stages):
            raise ValueError("each stage may appear once")
        return stages


class MemoryRequest(TrainingIn):
    """Per-device memory of one model under the given ZeRO stages."""

    model: ModelSpec = Field(description="The model: params, architecture, preset or hf_config.")
    batch: BatchIn | None = Field(
        None, description="Micro-batch; with an architecture it turns on activations and peak."
    )
    device_memory: DeviceBytes | None = Field(None, description="Bytes per device; turns on fits.")
    activation_model: Literal["analytical", "traced"] = Field(
        "analytical",
        description=(
            "How a model given as hf_config gets its activations: the formulas derived from "
            "transformers 5.17's modelling code, or a trace of the transformers installed on "
            "the server run under fake tensors (needs torch and transformers there: pip "
            "install 'zerocalc[hf]'). A trace runs once per config, batch and dtype regime "
            "the engine trains in (under a second for an 8B config once transformers is "
            "loaded; the first traced question also loads it, a few seconds); the server "
            "keeps the last 64 for later questions."
        ),
    )


class PerDevice(BaseModel):
    """Bytes on one device (integers)."""

    parameters: int
    gradients: int
    optimizer_states: int
    model_states: int = Field(description="parameters + gradients + optimizer_states.")
    activations: int | None = Field(description="Activations at the peak (null without a batch).")
    temporary_buffers: int | None = Field(description="Engine buffers at the peak.")
    resident: int = Field(description="Allocated between optimizer steps.")
    peak: int | None = Field(description="Highest allocated during a step (null if unknown).")


class HostMemory(BaseModel):
    """Bytes per rank held in host memory or on NVMe."""

    total: int
    parameters: int = 0
    gradients: int = 0
    optimizer_states: int = 0
    buffers: int = 0
    activations: int = Field(
        0,
        description="Pinned bytes holding the checkpointed layers' inputs at the end of "
        "forward (batch.checkpoint_offload), freed as backward copies them back.",
    )


class Breakdown(BaseModel):
    """From the paper's figure to what the device shows, rung by rung (bytes)."""

    theory: int | None = Field(description="The ZeRO paper's model states for this setup.")
    allocated_resident: int = Field(description="torch.cuda.memory_allocated between steps.")
    allocated_peak: int | None = Field(description="torch.cuda.max_memory_allocated in a step.")
    reserved: int | None = Field(
        None,
        description="The caching allocator's reserved bytes: not predicted (see breakdown_notes).",
    )
    outside_allocator: int | None = Field(
        None,
        description="CUDA context, kernels, NCCL buffers: not predicted (see breakdown_notes).",
    )


class StageMemory(BaseModel):
    stage: int
    per_device: PerDevice
    per_device_readable: dict[str, str] = Field(
        description="The same sizes as 'X GB (Y GiB)': GB = 1e9 bytes, GiB = 2^30 bytes."
    )
    cpu: HostMemory
    nvme: HostMemory
    fits: bool | None = Field(description="Whether peak (or resident) fits device_memory.")
    components: dict[str, int] = Field(default_factory=dict, description="Engine-specific parts.")
    breakdown: Breakdown = Field(description="theory → allocated → reserved → device.")
    notes: list[str] = Field(default_factory=list)


class Convention(BaseModel):
    """Which accounting the figures follow."""

    engine: Engine
    description: str
    precision: Precision
    optimizer: Optimizer
    k: float = Field(description="Optimizer-state bytes per parameter used.")
    optimizer_assumption: str
    gradients: GradientConvention
    bytes_per_param: dict[str, float]


class ResolvedValue(BaseModel):
    """One value of engine_config as the engine model reads it, and where it comes from."""

    model_config = ConfigDict(populate_by_name=True)

    key: str = Field(description="Dotted key inside engine_config.")
    value: Any = Field(description="The value used; null when unresolved (from says why).")
    source: str = Field(
        alias="from",
        description="config, auto: <rule> (as transformers' Trainer fills it), request: <field>, "
        "derived by DeepSpeed, or the engine's default.",
    )


class ResolvedConfig(BaseModel):
    """What engine_config decided: the effective stage, precision, offload and batch."""

    engine: Engine
    stage: int | None = Field(description="The stage the config names; null when it names none.")
    stages: list[int] = Field(description="The stages answered.")
    precision: Precision
    offload: OffloadIn
    micro_batch_size: int | None = Field(
        description="Micro-batch per device; null when neither the config nor a batch gives it."
    )
    gradient_accumulation_steps: int
    train_batch_size: int | None = Field(
        description="dp × micro-batch × accumulation; null when the micro-batch is unknown."
    )
    values: list[ResolvedValue] = Field(description="Every value read or resolved, and how.")
    notes: list[str] = Field(default_factory=list)


class MemoryResponse(BaseModel):
    params: int = Field(description="Ψ of the whole model.")
    params_per_device: int = Field(description="Ψ on one device after TP and PP, before ZeRO.")
    dp: int
    tp: int
    pp: int
    convention: Convention
    stages: list[StageMemory]
    breakdown_notes: list[str] = Field(
        description="What the breakdown's rungs mean and why "
        "reserved and device memory are not predicted; for a model trained with transformers' "
        "modelling code and a batch, also the batches its activations follow (batch.padded)."
    )
    resolved_config: ResolvedConfig | None = Field(
        None,
        description="What engine_config decided (engine deepspeed or torch); null when the "
        "request has no engine_config or uses engine paper.",
    )
