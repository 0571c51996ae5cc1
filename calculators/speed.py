"""Step time of one training configuration: compute, exposed communication, offload transfer.

Compute is the model's matmul FLOPs per token over the GPU's dense peak at a *stated*
efficiency (the fraction of peak the matmuls achieve, set by a calibration or the default).
Communication time comes from :func:`calculators.communication.estimate_communication` (an α–β
model); this module decides how much of it the engine hides behind compute. Offload traffic
crosses the host link and is not hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculators.architecture import Architecture, block_kinds, dense_layers
from calculators.batch import Checkpointing
from calculators.conventions import FP32_BYTES, PRECISION_BYTES, Precision
from calculators.errors import InputError

# Llama 3 paper (arXiv 2407.21783) Table 4: 38-43 % BF16 model-FLOPs utilisation on H100s.
DEFAULT_EFFICIENCY = 0.40
DEFAULT_EFFICIENCY_SOURCE = (
    "stated default 0.40: Llama 3 (arXiv 2407.21783) Table 4 reports 38-43 % BF16 MFU on H100"
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


def token_flops(arch: Architecture, seq_len: int, checkpointing: Checkpointing) -> TokenFlops:
    """FLOPs per token: 2 per multiply-add of every matmul a token passes through.

    Per block: qkv 2·h·(q + 2kv), output projection 2·q·h, MLP 2·h·f per matrix (2 matrices, 3
    when gated) for each of ``experts_per_token`` experts, a router 2·h·E and any shared
    expert; attention QKᵀ and AV 2·s·q each, halved by causality. DeepSeek: its latent
    attention's five projections, QKᵀ over the 192-wide q/k heads and AV over the 128-wide v
    heads, dense blocks before the MoE blocks. Head 2·h·V. Embedding look-ups, norms, softmax and
    element-wise work are not matmuls and are not counted (the efficiency absorbs them).
    Full checkpointing recomputes every block's forward; selective recomputes the attention
    core (QKᵀ, softmax, AV) as ``measure.workloads`` checkpoints it.
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
    attention = 2 * seq_len * widths * CAUSAL_FRACTION
    emb = arch.embed_proj_dim or arch.hidden
    head = 2 * emb * arch.vocab_size
    layers = arch.layers
    forward = linear + layers * attention + head
    backward = (
        LINEAR_BACKWARD_FACTOR * (linear + head) + ATTENTION_BACKWARD_FACTOR * layers * attention
    )
    if checkpointing is Checkpointing.FULL:
        recompute = linear + layers * attention
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


def optimizer_bytes_per_param(precision: Precision, k: float) -> float:
    """Device-memory bytes an element-wise optimizer step reads and writes per parameter.

    Every optimizer-state byte (K, the fp32 master included) is read and written once, the fp32
    gradient is read, and the working copy is written (and read too without a master copy):
    mixed-precision Adam 2·12 + 4 + 2 = 30 B.
    """
    param = PRECISION_BYTES[precision].parameter
    reads_param = 0 if precision.is_mixed else param
    return 2 * k + FP32_BYTES + param + reads_param


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


def achieved_efficiency(
    flops_per_rank: float, peak_flops: float, measured_seconds: float, other_seconds: float
) -> float:
    """Fraction of peak the matmuls reached in a measured step.

    ``other_seconds`` is the predicted non-compute part (exposed communication, optimizer step,
    offload transfer), taken off the measured step time before dividing.
    """
    compute = measured_seconds - other_seconds
    if measured_seconds <= 0:
        raise InputError("step_time_s", "a measured step time must be above 0 seconds")
    if compute <= 0:
        raise InputError(
            "step_time_s",
            f"the measured step ({measured_seconds:.4g} s) is not longer than the predicted "
            f"communication and optimizer time ({other_seconds:.4g} s): nothing left for compute",
        )
    return flops_per_rank / (peak_flops * compute)
