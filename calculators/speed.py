"""Step time of one training configuration: micro-steps, optimizer, exposed communication,
offload transfer.

A micro-step takes as long as the slower of two queues: the GPU's work (GEMM FLOPs over the dense
peak at a stated GEMM efficiency, attention FLOPs at a stated attention efficiency, and the
memory-bound element-wise, norm, cast and copy kernels as bytes over HBM bandwidth at a stated
efficiency) and the host's dispatch of that work (kernels and engine hooks per micro-step times a
stated host cost per kernel). Eager PyTorch launches kernels asynchronously, so whichever queue is
longer sets the pace. Every figure is a named field of :class:`GpuFigures`, :class:`HostFigures`
or :class:`EngineKernels`; a calibration replaces the GEMM efficiency or the host cost.
Communication time comes from :func:`calculators.communication.estimate_communication` (an α–β
model); this module decides how much of it the engine hides behind the micro-steps. Offload
traffic crosses the host link and is not hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from calculators.activations import Regime, activations
from calculators.architecture import Architecture, block_kinds, dense_layers
from calculators.batch import Batch, Checkpointing
from calculators.conventions import (
    FP32_BYTES,
    PRECISION_BYTES,
    Engine,
    Optimizer,
    Precision,
    Stage,
)

# bench/results/plan_profile (1B GPT, torch 2.11, H200, seq 1024): cuBLAS GEMM kernels ran at
# 713-796 TFLOP/s, 72-80 % of the 989.5 TFLOP/s dense BF16 peak, at micro-batches 1 to 8.
DEFAULT_EFFICIENCY = 0.75
DEFAULT_EFFICIENCY_SOURCE = (
    "stated default 0.75 of the dense peak for GEMMs: cuBLAS kernels of a 1B GPT reached "
    "72-80 % of an H200's BF16 peak at micro-batches of 1 to 8 × 1024 tokens "
    "(bench/results/plan_profile)"
)
# bench/results/plan_profile: SDPA's flash kernels (forward + backward, causal, head dim 128,
# seq 1024) reached 377 TFLOP/s = 38 % of the dense peak counted as token_flops counts them.
ATTENTION_EFFICIENCY = 0.38
# Element-wise, norm, cast and copy kernels stream HBM; 80 % of the datasheet bandwidth is what
# the profile's multi-tensor Adam reached (19.4 ms for 72 B × 1.01 G params on an H200's 4.8 TB/s).
MEMORY_EFFICIENCY = 0.80
# Passes over the activation bytes a micro-step saves (calculators.activations, no
# checkpointing): forward writes every saved tensor and its element-wise ops read their inputs
# (2); backward reads every saved tensor, writes the gradient of each and the next op reads it,
# and the element-wise backward kernels read input and gradient (4). Profile check: non-GEMM
# kernel time grows 2.1-2.8 ms per 1024-token sequence = 6 × 1.53 GB at 3.84 TB/s ± 15 %.
ACTIVATION_PASSES_FORWARD = 2
ACTIVATION_PASSES_BACKWARD = 4
# Bytes per parameter the engine streams every micro-step outside GEMMs: forward casts the fp32
# weight to bf16 (read 4, write 2: autocast, or FSDP2's all-gather copy-in); backward casts the
# bf16 weight gradient back (2 + 4), accumulates it into the fp32 .grad (read 4 + 4, write 4)
# and copies it into a DDP bucket / the reduce-scatter input and back (4 + 4 + 4 + 4), and the
# embedding backward's dense gradient is zeroed and scattered (≈ 8 over the embedding share):
# 6 forward, 6 + 12 + 16 + 8 = 42 backward. Profile check: the part of non-GEMM kernel time that
# does not grow with the micro-batch is 12.6 ms (DDP) to 14.8 ms (FSDP2) = 48-57 B at 3.84 TB/s.
PARAMETER_BYTES_FORWARD = 6
PARAMETER_BYTES_BACKWARD = 42
# Host cost of dispatching one kernel from eager PyTorch (Python module call, autograd recording,
# the dispatcher, the launch): bench/results/plan_profile, DDP at 1-2 sequences per micro-step
# (GPU idle half the step): 51.5-59.8 ms of host time per micro-step over 1,606-1,644 launches =
# 31-36 µs on the profiled host (a cloud VM's x86 cores, Python 3.12).
DEFAULT_HOST_SECONDS_PER_KERNEL = 33e-6
DEFAULT_HOST_SOURCE = (
    "stated default 33 µs per kernel: eager PyTorch on a cloud x86 host dispatched 1,606-1,644 "
    "kernels per micro-step in 51.5-59.8 ms of host time (bench/results/plan_profile, DDP, "
    "GPU half idle)"
)

# Causal attention: FlashAttention-style kernels (PyTorch SDPA's flash backend) skip the blocks
# above the diagonal, so QKᵀ and AV cost half of the full s × s products.
CAUSAL_FRACTION = 0.5
# FlashAttention-2 (arXiv 2307.08691) §4.1: the backward pass has 5 matmuls to forward's 2,
# "2.5× the FLOPs of the forward pass" (it recomputes the scores).
ATTENTION_BACKWARD_FACTOR = 2.5
# A linear layer's backward computes the input gradient and the weight gradient: 2 × forward
# (Narayanan et al. 2021, arXiv 2104.04473 §5.1, the 72·B·s·l·h² count).
LINEAR_BACKWARD_FACTOR = 2


@dataclass(frozen=True)
class TokenFlops:
    """Matmul FLOPs per token of one training micro-step.

    Attributes:
        forward: forward pass (linears, attention scores, output head).
        backward: backward pass.
        recompute: the forward work activation checkpointing repeats in backward.
        attention_forward: the attention-score part of ``forward`` (QKᵀ and AV).
    """

    forward: float
    backward: float
    recompute: float
    attention_forward: float

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


def token_flops(
    arch: Architecture,
    seq_len: int,
    checkpointing: Checkpointing,
    causal: bool = True,
    every_n_layers: int = 1,
) -> TokenFlops:
    """FLOPs per token: 2 per multiply-add of every matmul a token passes through.

    Per block: qkv 2·h·(q + 2kv), output projection 2·q·h, MLP 2·h·f per matrix (2 matrices, 3
    when gated) for each of ``experts_per_token`` experts, a router 2·h·E and any shared
    expert; attention QKᵀ and AV 2·s·q each, halved by causality (``causal``: a kernel that
    skips the masked half; one given a padding mask as a bias computes every product).
    DeepSeek: its latent attention's five projections, QKᵀ over the 192-wide q/k heads and AV
    over the 128-wide v heads, dense blocks before the MoE blocks. Head 2·h·V. Embedding
    look-ups, norms, softmax and element-wise work are not matmuls and are not counted (the
    efficiency absorbs them).
    Full checkpointing recomputes every block's forward (with ``every_n_layers``, blocks 0, n,
    2n, ... only); selective recomputes the attention core (QKᵀ, softmax, AV) as
    ``measure.workloads`` checkpoints it.
    """
    dense = dense_layers(arch)
    # all blocks' (DeepSeek's dense blocks, then its MoE blocks)
    linear = sum(n * _block_linear(arch, first < dense) for first, n in block_kinds(arch))
    m = arch.modelling
    if m is not None and m.latent_attention is not None:
        # latent attention: QKᵀ over the q/k heads' width, AV over the value heads'
        mla = m.latent_attention
        widths = arch.heads * (mla.qk_head_dim + mla.v_head_dim)
    else:
        widths = 2 * arch.q_dim
    attention = 2 * seq_len * widths * (CAUSAL_FRACTION if causal else 1.0)
    emb = arch.embed_proj_dim or arch.hidden
    head = 2 * emb * arch.vocab_size
    layers = arch.layers
    forward = linear + layers * attention + head
    backward = (
        LINEAR_BACKWARD_FACTOR * (linear + head) + ATTENTION_BACKWARD_FACTOR * layers * attention
    )
    if checkpointing is Checkpointing.FULL:
        # the checkpointed blocks 0, n, 2n, ...: ceil(dense / n) of them dense
        every = range(0, layers, every_n_layers)
        dense_run = len(range(0, min(dense, layers), every_n_layers))
        recompute = (
            dense_run * _block_linear(arch, True)
            + (len(every) - dense_run) * _block_linear(arch, dense >= layers)
            + len(every) * attention
        )
    elif checkpointing is Checkpointing.SELECTIVE:
        recompute = layers * attention
    else:
        recompute = 0
    return TokenFlops(
        forward=float(forward),
        backward=float(backward),
        recompute=float(recompute),
        attention_forward=float(layers * attention),
    )


def _block_linear(arch: Architecture, dense: bool) -> int:
    """Linear FLOPs per token of one block (a dense-MLP block, or an MoE block)."""
    h, q, kv = arch.hidden, arch.q_dim, arch.kv_dim
    m = arch.modelling
    mla = m.latent_attention if m is not None else None
    if mla is not None:
        q_width = arch.heads * mla.qk_head_dim
        rank = mla.q_lora_rank
        macs = h * q_width if rank is None else h * rank + rank * q_width
        macs += h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
        macs += mla.kv_lora_rank * arch.heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        macs += arch.heads * mla.v_head_dim * h
    else:
        macs = h * (q + 2 * kv) + q * h
    mlp_matrices = 3 if arch.gated_mlp else 2
    if dense:
        f = m.dense_ffn if m is not None and m.dense_ffn and arch.num_experts > 1 else arch.ffn
        return 2 * (macs + h * f * mlp_matrices)
    macs += h * arch.ffn * mlp_matrices * arch.experts_per_token + h * arch.num_experts
    if m is not None and m.shared_expert_ffn:
        macs += h * m.shared_expert_ffn * mlp_matrices + (h if m.shared_expert_gate else 0)
    return 2 * macs


def peak_flops_for(precision: Precision, peak_16bit: float, peak_fp32: float) -> float:
    """The peak a precision's matmuls run at: 16-bit tensor cores, or FP32 without TF32."""
    return peak_fp32 if precision is Precision.FP32 else peak_16bit


# torch.optim.Adam's default multi-tensor path (torch/optim/adam.py ``_multi_tensor_adam``) over
# fp32 parameters, one foreach kernel per line, bytes read + written per parameter:
# _foreach_lerp_(m, g) 4+4+4, _foreach_mul_(v) 4+4, _foreach_addcmul_(v, g, g) 4+4+4,
# _foreach_sqrt(v) 4+4, _foreach_div_ 4+4, _foreach_add_(eps) 4+4, _foreach_addcdiv_(p, m, d)
# 4+4+4+4 = 72 B; AdamW's decoupled decay adds _foreach_mul_(p) 4+4.
TORCH_FOREACH_ADAM_BYTES = 72
TORCH_FOREACH_ADAMW_BYTES = 80


def optimizer_bytes_per_param(
    precision: Precision,
    k: float,
    engine: Engine = Engine.DEEPSPEED,
    optimizer: Optimizer | None = None,
) -> float:
    """Device-memory bytes an element-wise optimizer step reads and writes per parameter.

    The torch engines keep fp32 parameters (autocast or FSDP2's mixed-precision policy) and run
    Adam's multi-tensor path: 72 B (80 B AdamW), one pass per foreach kernel. Otherwise (a fused
    optimizer such as DeepSpeed's FusedAdam) every optimizer-state byte (K, the fp32 master
    included) is read and written once, the fp32 gradient is read, and the working copy is
    written (and read too without a master copy): mixed-precision Adam 2·12 + 4 + 2 = 30 B.
    """
    if engine is Engine.TORCH and precision is not Precision.BF16:
        if optimizer is Optimizer.ADAM:
            return TORCH_FOREACH_ADAM_BYTES
        if optimizer is Optimizer.ADAMW:
            return TORCH_FOREACH_ADAMW_BYTES
    param = PRECISION_BYTES[precision].parameter
    reads_param = 0 if precision.is_mixed else param
    return 2 * k + FP32_BYTES + param + reads_param


@dataclass(frozen=True)
class GpuFigures:
    """What the GPU side of a micro-step assumes.

    Attributes:
        gemm_efficiency: fraction of the dense peak the linear layers' GEMMs reach.
        attention_efficiency: fraction of the dense peak the attention kernels reach.
        memory_efficiency: fraction of the HBM bandwidth the memory-bound kernels reach.
        activation_passes_forward: passes over the saved activation bytes in forward.
        activation_passes_backward: passes over them in backward.
        parameter_bytes_forward: bytes per parameter streamed in forward outside GEMMs.
        parameter_bytes_backward: the same in backward.
    """

    gemm_efficiency: float = DEFAULT_EFFICIENCY
    attention_efficiency: float = ATTENTION_EFFICIENCY
    memory_efficiency: float = MEMORY_EFFICIENCY
    activation_passes_forward: float = ACTIVATION_PASSES_FORWARD
    activation_passes_backward: float = ACTIVATION_PASSES_BACKWARD
    parameter_bytes_forward: float = PARAMETER_BYTES_FORWARD
    parameter_bytes_backward: float = PARAMETER_BYTES_BACKWARD


@dataclass(frozen=True)
class HostFigures:
    """What the host side of a micro-step assumes.

    Attributes:
        seconds_per_kernel: host time to dispatch one kernel (or one engine-hook step).
        source: where it comes from, in words.
    """

    seconds_per_kernel: float = DEFAULT_HOST_SECONDS_PER_KERNEL
    source: str = DEFAULT_HOST_SOURCE


@dataclass(frozen=True)
class EngineKernels:
    """Host work per parameter tensor per micro-step, in kernel dispatches.

    Attributes:
        forward: kernels per parameter tensor in forward.
        backward: kernels per parameter tensor in backward.
        hooks: engine-hook steps per parameter tensor per micro-step (Python work of the
            engine's hooks, each costing about one dispatch).
        per_collective: further hook steps per parameter tensor for each collective the engine
            issues per micro-step when the group has more than one rank.
        collectives: collectives per tensor per micro-step (all-gathers and reduce-scatters).
        reason: where the counts come from.
    """

    forward: float
    backward: float
    hooks: float
    per_collective: float
    collectives: int
    reason: str


# bench/results/plan_profile, Nd 1, launches per micro-step / 197 parameter tensors of the 1B GPT:
# DDP 413 forward (2.1) and 1,193 backward (6.1); FSDP2 reshard 650 / 1,052 (3.3 / 5.3), no
# reshard 613 / 726 (3.1 / 3.7). FSDP2's host time above its launches (FSDP::pre_forward,
# pre_backward, post_backward_reduce regions) is 41-50 ms per micro-step = 7 dispatches per
# tensor; with real collectives (Nd > 1) its copy-in/copy-out bookkeeping adds about one per
# tensor per collective (+20 ms per micro-step at Nd 2 and 4 over 3 collectives).
_DDP = EngineKernels(
    2,
    6,
    0,
    0,
    0,
    "DDP + autocast: a cast and a kernel per tensor forward; input and weight "
    "gradients, the cast back, accumulation and the bucket copy backward",
)
_FSDP2_RESHARD = EngineKernels(
    3,
    6,
    7,
    1,
    3,
    "FSDP2 fully_shard per block (reshard after forward): copy-in/out kernels in "
    "forward and again in backward; per-parameter hook work in pre/post forward and backward; "
    "all-gather twice and reduce-scatter once per micro-step",
)
_FSDP2_KEEP = EngineKernels(
    3,
    4,
    7,
    1,
    2,
    "FSDP2 fully_shard per block (no reshard after forward): copy-in/out kernels "
    "in forward; per-parameter hook work; one all-gather and one reduce-scatter per micro-step",
)
# DeepSpeed was not profiled: its bf16 engine runs without autocast (bf16 parameters, no casts)
# and reduces gradients from per-parameter hooks into IPG buckets (stages 1-2); stage 3 runs
# per-parameter fetch / release hooks as FSDP2 does. Counts carried over from the torch engines.
_DS_LOW = EngineKernels(
    2,
    5,
    1,
    0,
    0,
    "DeepSpeed stages 0-2 (not profiled): DDP's counts without autocast casts, "
    "plus one hook step per tensor for the IPG bucket copy",
)
_DS_STAGE3 = EngineKernels(
    3,
    6,
    7,
    1,
    3,
    "DeepSpeed stage 3 (not profiled): FSDP2's counts (per-parameter fetch and "
    "release hooks, two all-gathers and a reduce-scatter per micro-step)",
)


def engine_kernels(engine: Engine, stage: Stage) -> EngineKernels:
    """Host dispatches per parameter tensor per micro-step of one engine and stage."""
    if engine is Engine.TORCH:
        if stage is Stage.PARAMETERS:
            return _FSDP2_RESHARD
        if stage is Stage.GRADIENTS:
            return _FSDP2_KEEP
        return _DDP
    return _DS_STAGE3 if stage is Stage.PARAMETERS else _DS_LOW


@dataclass(frozen=True)
class MicroStep:
    """Seconds of one micro-step (forward + backward) on each queue.

    Attributes:
        gemm_forward: linear-layer and head GEMMs of forward.
        gemm_backward: those of backward and recomputation.
        attention_forward: attention kernels of forward.
        attention_backward: those of backward and recomputation.
        memory_forward: memory-bound kernels of forward (element-wise, norms, casts, copies).
        memory_backward: those of backward and recomputation.
        host_forward: host dispatch of forward.
        host_backward: host dispatch of backward.
        kernels: kernels dispatched per micro-step.
        hook_steps: engine-hook steps per micro-step (host only).
    """

    gemm_forward: float
    gemm_backward: float
    attention_forward: float
    attention_backward: float
    memory_forward: float
    memory_backward: float
    host_forward: float
    host_backward: float
    kernels: float
    hook_steps: float

    @property
    def gpu_forward(self) -> float:
        return self.gemm_forward + self.attention_forward + self.memory_forward

    @property
    def gpu_backward(self) -> float:
        return self.gemm_backward + self.attention_backward + self.memory_backward

    @property
    def gpu(self) -> float:
        return self.gpu_forward + self.gpu_backward

    @property
    def host(self) -> float:
        return self.host_forward + self.host_backward

    @property
    def matmul(self) -> float:
        return (
            self.gemm_forward
            + self.gemm_backward
            + self.attention_forward
            + self.attention_backward
        )

    @property
    def memory_bound(self) -> float:
        return self.memory_forward + self.memory_backward

    @property
    def seconds(self) -> float:
        """The slower queue sets the pace (eager PyTorch launches asynchronously)."""
        return max(self.gpu, self.host)

    @property
    def host_bound(self) -> bool:
        return self.host > self.gpu


def activation_bytes(arch: Architecture, batch: Batch, regime: Regime) -> int:
    """Bytes a micro-step's blocks, head and loss save for backward without checkpointing: what
    the memory-bound kernels stream (embedding indices and autocast's weight copies left out)."""
    plain = replace(
        batch,
        activation_checkpointing=Checkpointing.NONE,
        checkpoint_offload=False,
        checkpoint_every_n_layers=1,
    )
    a = activations(arch, plain, regime)
    return a.per_layer.total * arch.layers + a.head + a.logits + a.loss


def micro_step(
    arch: Architecture,
    params: int,
    tensors: int,
    batch: Batch,
    regime: Regime,
    peak_flops: float,
    memory_bandwidth: float,
    kernels: EngineKernels,
    ranks_in_group: int,
    gpu: GpuFigures,
    host: HostFigures,
) -> MicroStep:
    """One micro-step's GPU work and host dispatch.

    GEMMs: linear and head FLOPs (:func:`token_flops`) over ``peak × gemm_efficiency``;
    attention FLOPs over ``peak × attention_efficiency``; memory-bound kernels: passes over the
    saved activation bytes plus bytes per parameter, over ``bandwidth × memory_efficiency``
    (full checkpointing repeats forward's passes over the blocks' bytes). Host: kernels per
    parameter tensor (forward, backward) plus the engine's hook steps, times the host cost per
    kernel. ``params`` are those whose casts and gradients this rank streams (the whole model:
    FSDP2 unshards every block), ``ranks_in_group`` the ranks collectives span.
    """
    # a padding mask, or eager attention's matmuls, compute every score
    eager = arch.modelling is not None and arch.modelling.eager_attention
    flops = token_flops(
        arch,
        batch.seq_len,
        batch.activation_checkpointing,
        causal=not (batch.padded or eager),
        every_n_layers=batch.checkpoint_every_n_layers,
    )
    tokens = batch.micro_batch_size * batch.seq_len
    attn_fwd = flops.attention_forward
    attn_bwd = ATTENTION_BACKWARD_FACTOR * attn_fwd
    # the share of the blocks backward runs forward again (every_n_layers: the checkpointed)
    rerun_share = 0.0
    if batch.activation_checkpointing is Checkpointing.FULL:
        rerun_share = batch.checkpointed_layers(arch.layers) / arch.layers
    attn_recompute = attn_fwd * rerun_share
    if batch.activation_checkpointing is Checkpointing.SELECTIVE:
        attn_recompute = attn_fwd
    gemm_fwd = flops.forward - attn_fwd
    gemm_bwd = flops.backward - attn_bwd + flops.recompute - attn_recompute
    gemm_rate = peak_flops * gpu.gemm_efficiency
    attn_rate = peak_flops * gpu.attention_efficiency

    act = activation_bytes(arch, batch, regime)
    rerun = 0  # full checkpointing reruns the blocks' forward in backward
    if batch.activation_checkpointing is Checkpointing.FULL:
        a = activations(
            arch,
            replace(
                batch,
                activation_checkpointing=Checkpointing.NONE,
                checkpoint_offload=False,
                checkpoint_every_n_layers=1,
            ),
            regime,
        )
        rerun = a.per_layer.total * batch.checkpointed_layers(arch.layers)
    bandwidth = memory_bandwidth * gpu.memory_efficiency
    mem_fwd = act * gpu.activation_passes_forward + params * gpu.parameter_bytes_forward
    mem_bwd = (
        act * gpu.activation_passes_backward
        + rerun * gpu.activation_passes_forward
        + params * gpu.parameter_bytes_backward
    )
    if bandwidth > 0:
        mem_fwd_s, mem_bwd_s = mem_fwd / bandwidth, mem_bwd / bandwidth
    else:
        mem_fwd_s = mem_bwd_s = 0.0

    recompute_kernels = kernels.forward * rerun_share
    k_fwd = tensors * kernels.forward
    k_bwd = tensors * (kernels.backward + recompute_kernels)
    hooks = tensors * kernels.hooks
    if ranks_in_group > 1:
        hooks += tensors * kernels.per_collective * kernels.collectives
    cost = host.seconds_per_kernel
    # hook steps split as FSDP2's regions do: about half in forward (pre/post forward)
    return MicroStep(
        gemm_forward=gemm_fwd * tokens / gemm_rate,
        gemm_backward=gemm_bwd * tokens / gemm_rate,
        attention_forward=attn_fwd * tokens / attn_rate,
        attention_backward=(attn_bwd + attn_recompute) * tokens / attn_rate,
        memory_forward=mem_fwd_s,
        memory_backward=mem_bwd_s,
        host_forward=(k_fwd + hooks / 2) * cost,
        host_backward=(k_bwd + hooks / 2) * cost,
        kernels=k_fwd + k_bwd,
        hook_steps=hooks,
    )


@dataclass(frozen=True)
class PhaseComm:
    """Communication of one phase per optimizer step, split into what repeats per micro-step.

    Attributes:
        repeated_seconds: time of the calls issued on every micro-step (per micro-step).
        repeated_calls: those calls per micro-step.
        once_seconds: time of the calls issued once per optimizer step.
        once_calls: those calls.
    """

    repeated_seconds: float = 0.0
    repeated_calls: float = 0.0
    once_seconds: float = 0.0
    once_calls: float = 0.0

    def total(self, micro_steps: int) -> float:
        return self.repeated_seconds * micro_steps + self.once_seconds


def split_phase(
    seconds: float, calls: int, seconds_one: float, calls_one: int, micro_steps: int
) -> PhaseComm:
    """Split a phase's per-step time into per-micro-step and once-per-step parts.

    ``seconds``/``calls`` are the phase's figures at ``micro_steps`` micro-steps,
    ``seconds_one``/``calls_one`` the same engine's at one micro-step; both are linear in the
    micro-step count (every call costs the same at any count), so
    ``seconds = r · micro_steps + o`` and ``seconds_one = r + o``.
    """
    if micro_steps <= 1:
        return PhaseComm(once_seconds=seconds, once_calls=calls)
    r = max(0.0, (seconds - seconds_one) / (micro_steps - 1))
    rc = max(0.0, (calls - calls_one) / (micro_steps - 1))
    return PhaseComm(r, rc, max(0.0, seconds_one - r), max(0.0, calls_one - rc))


def _exposed_one(comm: float, calls: float, window: float) -> float:
    """Communication left on the critical path when it overlaps ``window`` seconds of compute.

    One call's worth cannot hide: the first all-gather of a forward before any layer computes,
    the last gradient bucket after the last layer's backward. The rest hides up to the window.
    """
    if comm <= 0:
        return 0.0
    first = comm / calls if calls >= 1 else comm
    return first + max(0.0, comm - first - window)


def exposed_seconds(phase: PhaseComm, micro_steps: int, window: float, overlapped: bool) -> float:
    """Exposed time of a phase over one optimizer step.

    Args:
        phase: the phase's communication.
        micro_steps: micro-batches per optimizer step.
        window: compute of this phase in one micro-step, seconds.
        overlapped: the engine runs these collectives on a side stream while it computes.
    """
    if not overlapped:
        return phase.total(micro_steps)
    earlier = (micro_steps - 1) * _exposed_one(phase.repeated_seconds, phase.repeated_calls, window)
    last = _exposed_one(
        phase.repeated_seconds + phase.once_seconds,
        phase.repeated_calls + phase.once_calls,
        window,
    )
    return earlier + last
