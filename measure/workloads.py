"""Workloads built from the calculator's inputs: a GPT-style decoder and an MLP of
``layers`` x Linear(hidden, hidden).

The decoder is the canonical module of :mod:`calculators.architecture`: its
``named_parameters()`` list the same names, shapes and order as
:func:`calculators.architecture.tensors` (a test checks it), so the engine model's exact
partitions (ZeroRedundancyOptimizer, FSDP2 dim-0 padding) apply to the module measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from calculators.architecture import Activation, Architecture, Norm, PositionEmbedding
from measure.mlp_presets import MLPSpec
from measure.spec import MeasureSpec, ModelKind


def mlp_tensors(spec: MLPSpec) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, FSDP group) of each MLP parameter, in ``named_parameters`` order."""
    out: list[tuple[str, tuple[int, ...], str]] = []
    for i in range(spec.layers):
        out.append((f"layers.{i}.weight", (spec.hidden, spec.hidden), f"layers.{i}"))
        out.append((f"layers.{i}.bias", (spec.hidden,), f"layers.{i}"))
    return out


class ReferenceMLP(nn.Module):
    """L x Linear(h, h) + ReLU; ``layers`` holds the linears so FSDP2 wraps each one."""

    def __init__(self, spec: MLPSpec) -> None:
        super().__init__()
        self.spec = spec
        self.layers = nn.ModuleList(nn.Linear(spec.hidden, spec.hidden) for _ in range(spec.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.relu(layer(x))
        return x

    def shard_units(self) -> list[nn.Module]:
        return list(self.layers)


# --- the decoder ------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """x / rms(x) * weight (weight only, as calculators.architecture counts it)."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _norm(arch: Architecture, width: int) -> nn.Module:
    if arch.norm is Norm.RMSNORM:
        return RMSNorm(width)
    return nn.LayerNorm(width, bias=arch.bias)


def _act(arch: Architecture) -> Callable[[torch.Tensor], torch.Tensor]:
    acts: dict[Activation, Callable[[torch.Tensor], torch.Tensor]] = {
        Activation.GELU: F.gelu,
        Activation.RELU: F.relu,
        Activation.SILU: F.silu,
    }
    return acts[arch.activation]


def _rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding on (batch, heads, seq, d_head); no parameters."""
    seq, d = x.shape[-2], x.shape[-1]
    half = d // 2
    inv = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = torch.arange(seq, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return torch.cat((rotated, x[..., 2 * half :]), dim=-1) if d % 2 else rotated


class Attention(nn.Module):
    """Fused qkv, causal SDPA, output projection."""

    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        self.arch = arch
        self.qkv = nn.Linear(arch.hidden, arch.q_dim + 2 * arch.kv_dim, bias=arch.has_qkv_bias)
        self.proj = nn.Linear(arch.q_dim, arch.hidden, bias=arch.bias)

    def core(self, qkv: torch.Tensor) -> torch.Tensor:
        a = self.arch
        b, s, _ = qkv.shape
        q, k, v = qkv.split((a.q_dim, a.kv_dim, a.kv_dim), dim=-1)
        q = q.view(b, s, a.heads, a.d_head).transpose(1, 2)
        k = k.view(b, s, a.n_kv_heads, a.d_head).transpose(1, 2)
        v = v.view(b, s, a.n_kv_heads, a.d_head).transpose(1, 2)
        if a.position_embedding is PositionEmbedding.ROPE:
            q, k = _rope(q), _rope(k)
        if a.n_kv_heads != a.heads:
            rep = a.heads // a.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(b, s, a.q_dim)

    def forward(self, x: torch.Tensor, selective: bool = False) -> torch.Tensor:
        qkv = self.qkv(x)
        if selective and torch.is_grad_enabled():
            y = checkpoint(self.core, qkv, use_reentrant=False)
        else:
            y = self.core(qkv)
        return self.proj(y)  # type: ignore[no-any-return]


class MLP(nn.Module):
    """fc1/fc2, or gate/up/down when gated."""

    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        h, f, b = arch.hidden, arch.ffn, arch.bias
        self.act = _act(arch)
        self.gated = arch.gated_mlp
        if self.gated:
            self.gate = nn.Linear(h, f, bias=b)
            self.up = nn.Linear(h, f, bias=b)
            self.down = nn.Linear(f, h, bias=b)
        else:
            self.fc1 = nn.Linear(h, f, bias=b)
            self.fc2 = nn.Linear(f, h, bias=b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down(self.act(self.gate(x)) * self.up(x))  # type: ignore[no-any-return]
        return self.fc2(self.act(self.fc1(x)))  # type: ignore[no-any-return]


class Block(nn.Module):
    """Pre-norm block: ln1, attn, ln2, mlp (or router + experts)."""

    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        self.arch = arch
        self.ln1 = _norm(arch, arch.hidden)
        self.attn = Attention(arch)
        self.ln2 = _norm(arch, arch.hidden)
        self.selective = False
        if arch.num_experts == 1:
            self.mlp = MLP(arch)
        else:
            self.router = nn.Linear(arch.hidden, arch.num_experts, bias=False)
            self.experts = nn.ModuleList(MLP(arch) for _ in range(arch.num_experts))

    def _moe(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights = self.router(flat).float().softmax(dim=-1)
        top_w, top_i = weights.topk(self.arch.experts_per_token, dim=-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (top_i == e).nonzero(as_tuple=True)
            # every expert runs (possibly on no rows) so each parameter gets a gradient
            y = expert(flat[rows]) * top_w[rows, slot, None].to(flat.dtype)
            out = out.index_add(0, rows, y.to(out.dtype))
        return out.view_as(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), self.selective)
        h = self.ln2(x)
        return x + (self.mlp(h) if self.arch.num_experts == 1 else self._moe(h))


class GPT(nn.Module):
    """The canonical decoder of :mod:`calculators.architecture`, module by module."""

    def __init__(self, arch: Architecture, checkpointing: str = "none") -> None:
        super().__init__()
        self.arch = arch
        emb = arch.embed_proj_dim or arch.hidden
        projected = arch.embed_proj_dim is not None and arch.embed_proj_dim != arch.hidden
        self.embed = nn.Embedding(arch.vocab_size, emb)
        self.project_in = nn.Linear(emb, arch.hidden, bias=False) if projected else None
        self.pos = None
        if arch.position_embedding is PositionEmbedding.LEARNED:
            assert arch.max_seq_len is not None  # Architecture.validate guarantees it
            self.pos = nn.Embedding(arch.max_seq_len + arch.position_offset, arch.hidden)
        self.embed_norm = _norm(arch, emb) if arch.embedding_norm else None
        blocks = [Block(arch) for _ in range(arch.layers)]
        for block in blocks:
            block.selective = checkpointing == "selective"
        self.blocks = nn.ModuleList(blocks)
        self.ln_f = _norm(arch, arch.hidden) if arch.final_norm else None
        self.project_out = nn.Linear(arch.hidden, emb, bias=False) if projected else None
        self.head = None
        if not arch.tied_embeddings:
            self.head = nn.Linear(emb, arch.vocab_size, bias=arch.lm_head_bias)
        self.checkpointing = checkpointing

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        if self.project_in is not None:
            x = self.project_in(x)
        if self.pos is not None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = x + self.pos(positions + self.arch.position_offset)
        for block in self.blocks:
            if self.checkpointing == "full" and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.ln_f is not None:
            x = self.ln_f(x)
        if self.project_out is not None:
            x = self.project_out(x)
        if self.head is None:
            return F.linear(x, self.embed.weight)
        return self.head(x)  # type: ignore[no-any-return]

    def shard_units(self) -> list[nn.Module]:
        return list(self.blocks)


# --- building a workload from a spec ----------------------------------------------------------


Batch = tuple[torch.Tensor, torch.Tensor]
Forward = Callable[
    [Callable[..., Any], torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]


@dataclass
class Workload:
    """A module, how to make one micro-batch, and how a training loop gets its loss.

    Attributes:
        name: what it is, for reports.
        architecture: the decoder's architecture as the calculator reads it (``None`` for the
            MLP and for a family the calculator does not read).
        tensors: (name, shape, FSDP group) of each parameter, for the engine model.
        build: makes the module on ``device``.
        make_batch: makes (inputs, targets) on ``device``.
        forward: runs the (wrapped) module on a batch and returns (output the loop holds, loss).
        shard_units: the submodules FSDP2 shards one by one before the root.
    """

    name: str
    architecture: Architecture | None
    tensors: list[tuple[str, tuple[int, ...], str]]
    build: Callable[[torch.device], nn.Module]
    make_batch: Callable[[torch.device, torch.Generator], Batch]
    forward: Forward
    shard_units: Callable[[nn.Module], list[nn.Module]]

    @property
    def params(self) -> int:
        return sum(math.prod(shape) for _, shape, _ in self.tensors)


def _units(module: nn.Module) -> list[nn.Module]:
    return module.shard_units()  # type: ignore[no-any-return,operator]


def loss_forward(
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Forward:
    """``out = module(x); loss(out, y)``: the plain loop of a training script."""

    def forward(
        module: Callable[..., Any], x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = module(x)
        return out, loss(out, y)

    return forward


def gpt_tensors(arch: Architecture) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, FSDP group) from :func:`calculators.architecture.tensors`."""
    from calculators.architecture import tensors

    return [
        (t.name, t.shape, "root" if t.layer is None else f"blocks.{t.layer}") for t in tensors(arch)
    ]


def fp32_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``logits.float()`` cross-entropy, as a typical training script writes it."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def gpt_workload(
    arch: Architecture, micro_batch: int, seq_len: int, checkpointing: str = "none"
) -> Workload:

    def build(device: torch.device) -> nn.Module:
        with torch.device(device):
            return GPT(arch, checkpointing)

    def make_batch(device: torch.device, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (micro_batch, seq_len)
        tokens = torch.randint(0, arch.vocab_size, shape, generator=gen).to(device)
        targets = torch.randint(0, arch.vocab_size, shape, generator=gen).to(device)
        return tokens, targets

    return Workload(
        name=f"gpt L{arch.layers} h{arch.hidden} (b{micro_batch} s{seq_len})",
        architecture=arch,
        tensors=gpt_tensors(arch),
        build=build,
        make_batch=make_batch,
        forward=loss_forward(fp32_cross_entropy),
        shard_units=_units,
    )


def mlp_workload(spec: MLPSpec) -> Workload:
    def build(device: torch.device) -> nn.Module:
        with torch.device(device):
            return ReferenceMLP(spec)

    def make_batch(device: torch.device, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(spec.batch, spec.hidden, generator=gen).to(device)
        y = torch.randn(spec.batch, spec.hidden, generator=gen).to(device)
        return x, y

    def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out.float(), target)

    return Workload(
        name=f"mlp {spec.layers}x Linear({spec.hidden},{spec.hidden}) batch {spec.batch}",
        architecture=None,
        tensors=mlp_tensors(spec),
        build=build,
        make_batch=make_batch,
        forward=loss_forward(mse),
        shard_units=_units,
    )


def build_workload(spec: MeasureSpec) -> Workload:
    """The workload a checked request names."""
    choice = spec.model
    if choice.kind is ModelKind.MLP:
        assert choice.mlp is not None
        return mlp_workload(choice.mlp)
    if choice.kind is ModelKind.HF:
        from measure.engines.hf import hf_workload

        return hf_workload(spec)
    assert choice.architecture is not None
    return gpt_workload(
        choice.architecture, spec.micro_batch_size, spec.seq_len, spec.checkpointing.value
    )
