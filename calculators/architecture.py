"""Decoder architectures and their exact parameter counts.

The canonical module is a GPT-style decoder as PyTorch would build it (``measure/workloads.py``
builds the same module, and a test checks both list the same tensors in the same order):

- token embedding ``(vocab, hidden)``, learned positions ``(max_seq_len + offset, hidden)`` when
  ``position_embedding == "learned"``, an optional embedding norm (BLOOM);
- per block: norm, fused qkv projection ``(q + 2·kv, hidden)``, output projection
  ``(hidden, q)``, norm, MLP (``fc1``/``fc2``, or ``gate``/``up``/``down`` when gated), with
  ``num_experts`` copies of the MLP and a bias-free router when ``num_experts > 1``;
- a final norm and an output head ``(vocab, hidden)`` unless the embeddings are tied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import lru_cache
from typing import Protocol

from calculators.errors import InputError

MAX_DIM = 16_777_216  # 2^24: no dimension of a trainable model comes near it
MAX_BLOCK_MLPS = 65_536  # layers × experts; DeepSeek-V3 has 61 × 256 = 15,616


class Norm(StrEnum):
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class PositionEmbedding(StrEnum):
    LEARNED = "learned"
    ROPE = "rope"
    ALIBI = "alibi"
    NONE = "none"


class Activation(StrEnum):
    GELU = "gelu"
    RELU = "relu"
    SILU = "silu"


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek's multi-head latent attention (``DeepseekV3Attention``).

    Queries go through a low-rank ``q_a_proj`` → RMSNorm → ``q_b_proj`` (or one ``q_proj`` when
    ``q_lora_rank`` is ``None``); keys and values through ``kv_a_proj_with_mqa`` (a
    ``kv_lora_rank`` latent plus one shared ``qk_rope_head_dim`` rotary key) → RMSNorm on the
    latent → ``kv_b_proj`` (per-head non-rotary keys and values); ``o_proj`` reads the values.

    Attributes:
        q_lora_rank: width of the query latent; ``None``: a full-rank ``q_proj``.
        kv_lora_rank: width of the key/value latent.
        qk_nope_head_dim: per-head query/key width without rotary embedding.
        qk_rope_head_dim: per-head query/key width with rotary embedding (the key's is shared).
        v_head_dim: per-head value width.
    """

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class TransformersModelling:
    """How a Hugging Face family's transformers modelling code differs from the canonical module.

    An :class:`Architecture` carrying one is trained as ``AutoModelForCausalLM`` builds it
    (``calculators/transformers_activations.py``); without one it is the canonical decoder.

    Attributes:
        family: the ``model_type`` (``llama``, ``gemma2``, ...).
        norm_plus_one: Gemma's RMSNorm, ``x_normed * (1 + weight)`` computed in fp32.
        qk_norm: an RMSNorm over each query and key head (Qwen3, Gemma-3): a ``head_dim``
            weight each.
        sandwich_norms: four norms per layer (Gemma-2/3 post-attention and pre/post-feedforward).
        fused_projections: one ``qkv_proj`` and one ``gate_up_proj`` linear (Phi-3).
        residual_dropout: each layer's attention and MLP outputs pass an ``nn.Dropout`` module
            (Phi-3's ``resid_attn_dropout`` and ``resid_mlp_dropout``).
        out_proj_first: the attention registers ``o_proj`` before ``qkv_proj`` (Phi-3), so the
            model allocates them in that order when it is built.
        experts_first: the MoE block registers its experts before its router (Qwen3-MoE,
            DeepSeek-V3), so ``named_parameters`` lists them first; it still runs the router
            first.
        rotary_cat: the rotation ends in ``torch.cat`` (partial rotary, Phi-3).
        rotary_dim: dimensions rotated per head; ``None`` means ``head_dim``.
        rope_kinds: distinct rotary embeddings in use (Gemma-3: local and global).
        nope_layers: layers that rotate nothing (SmolLM3's ``no_rope_layers`` zeros): their
            attention reads the projections' outputs as they are.
        nope_sliding_layers: how many of ``nope_layers`` are sliding-window layers.
        final_logit_softcap: ``tanh`` soft-capping of the logits (Gemma-2; Gemma-3 where its
            config sets ``final_logit_softcapping``).
        shared_expert_ffn: width of the always-on shared expert (Qwen2-MoE, DeepSeek-V3).
        fused_experts: the experts are two 3-D parameters, ``experts.gate_up_proj``
            (E, 2·ffn, hidden) and ``experts.down_proj`` (E, hidden, ffn), as transformers ≥ 5
            registers them (``MixtralExperts``, ``Qwen2MoeExperts``, DeepSeek-V3's); FSDP2
            then shards them on the expert dimension.
        shared_expert_gate: the shared expert's output passes a sigmoid gate (Qwen2-MoE's
            ``shared_expert_gate``; DeepSeek-V3 adds its shared experts ungated).
        router_fp32: the router casts its input and weight to fp32 itself and scores with a
            sigmoid (``DeepseekV3TopkRouter``).
        latent_attention: multi-head latent attention in place of q/k/v projections (DeepSeek).
        dense_layers: the first this many layers keep a dense MLP of ``dense_ffn`` in an MoE
            model (DeepSeek's ``first_k_dense_replace``).
        dense_ffn: the dense layers' MLP width.
        router_normalize: top-k routing weights renormalised in place.
        router_weights_fp32: routing weights stay fp32 (Mixtral) rather than the logits' dtype.
        use_cache: ``config.use_cache``: forward fills a ``DynamicCache`` unless checkpointing.
        out_bias: bias on ``o_proj`` (Llama's ``attention_bias`` covers q, k, v and o);
            ``None`` follows the architecture's ``bias``.
        sliding_window: attention window of the sliding layers (``None``: none).
        sliding_layers: how many layers attend through ``sliding_window``.
        layer_pattern: each layer's ``(attends through sliding_window, rotates q and k)`` where
            the layers differ (``config.json``'s ``layer_types``, SmolLM3's ``no_rope_layers``);
            empty where every layer is alike, as ``sliding_layers`` and ``nope_layers`` say.
        eager_attention: the model is built with ``attn_implementation="eager"``
            (``eager_attention_forward``: the attention scores and probabilities are tensors
            autograd saves) rather than SDPA.
        attn_softcap: eager attention soft-caps the scores with ``tanh`` (Gemma-2's
            ``attn_logit_softcapping``; SDPA ignores it).
        attention_dropout: attention applies dropout (``attention_dropout`` > 0) to the
            probabilities in training (eager attention, and SDPA's math path, save for it).
        traced: a trace of what this model's code saves (``measure/trace.py``), used in place
            of the analytical figures for the batch it was traced at, in each regime asked.
    """

    family: str
    norm_plus_one: bool = False
    qk_norm: bool = False
    sandwich_norms: bool = False
    fused_projections: bool = False
    residual_dropout: bool = False
    out_proj_first: bool = False
    experts_first: bool = False
    rotary_cat: bool = False
    rotary_dim: int | None = None
    rope_kinds: int = 1
    nope_layers: int = 0
    nope_sliding_layers: int = 0
    final_logit_softcap: bool = False
    shared_expert_ffn: int | None = None
    fused_experts: bool = False
    shared_expert_gate: bool = True
    router_fp32: bool = False
    latent_attention: LatentAttention | None = None
    dense_layers: int = 0
    dense_ffn: int | None = None
    router_normalize: bool = True
    router_weights_fp32: bool = True
    use_cache: bool = True
    out_bias: bool | None = None
    sliding_window: int | None = None
    sliding_layers: int = 0
    layer_pattern: tuple[tuple[bool, bool], ...] = ()
    eager_attention: bool = False
    attn_softcap: bool = False
    attention_dropout: bool = False
    traced: ActivationTrace | None = None


@dataclass(frozen=True)
class TracedActivations:
    """Bytes autograd saved when the model's own code ran one forward + loss (traced).

    Attributes:
        regime: ``half``, ``autocast`` or ``fp32``.
        micro_batch_size: sequences traced.
        seq_len: tokens per sequence traced.
        checkpointing: transformers' gradient checkpointing was on.
        padded: the batch came with an ``attention_mask`` that has padding.
        saved: activation bytes saved for backward (parameters and weight copies excluded).
        autocast_weights: bf16 weight copies autograd saved (autocast).
        logits: the output logits.
        loss_transient: tensors alive only inside the loss.
        cache: the key/value cache in the output.
        cache_only: the part of the cache nothing saved shares.
    """

    regime: str
    micro_batch_size: int
    seq_len: int
    checkpointing: bool
    padded: bool
    saved: int
    autocast_weights: int
    logits: int
    loss_transient: int
    cache: int
    cache_only: int


class ActivationTrace(Protocol):
    """The model's own code traced for one batch: each regime's figures when first asked."""

    @property
    def micro_batch_size(self) -> int: ...

    @property
    def seq_len(self) -> int: ...

    @property
    def checkpointing(self) -> bool: ...

    @property
    def padded(self) -> bool: ...

    def __call__(self, regime: str) -> TracedActivations:
        """The figures in ``regime`` (``half``, ``autocast`` or ``fp32``)."""
        ...


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer, enough to count its parameters exactly.

    Attributes:
        layers: transformer blocks.
        hidden: model width.
        heads: attention (query) heads.
        vocab_size: rows of the token embedding.
        ffn_hidden: MLP inner width; ``None`` means 4 × hidden.
        max_seq_len: context length; the learned position table has this many rows.
        kv_heads: key/value heads (grouped-query attention); ``None`` means ``heads``.
        head_dim: width of one head; ``None`` means hidden / heads.
        tied_embeddings: the output head reuses the token embedding.
        bias: biases on the attention and MLP linears (and LayerNorm).
        qkv_bias: bias on the qkv projection alone (Qwen2); ``None`` follows ``bias``.
        lm_head_bias: bias on the output head.
        norm: LayerNorm (weight and bias unless ``bias`` is false) or RMSNorm (weight).
        position_embedding: learned table, RoPE, ALiBi or none (only learned has parameters).
        position_offset: extra rows in the learned table (OPT adds 2).
        gated_mlp: SwiGLU-style MLP with gate, up and down projections.
        activation: MLP non-linearity (for activation memory; no parameters).
        num_experts: MLP copies per block (mixture of experts); 1 is dense.
        experts_per_token: experts each token is routed to.
        embedding_norm: a norm right after the token embedding (BLOOM).
        final_norm: a norm before the output head.
        embed_proj_dim: OPT's ``word_embed_proj_dim`` when it differs from hidden.
        modelling: transformers' modelling code this model is trained with; ``None`` for the
            canonical decoder.
    """

    layers: int
    hidden: int
    heads: int
    vocab_size: int
    ffn_hidden: int | None = None
    max_seq_len: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    tied_embeddings: bool = False
    bias: bool = True
    qkv_bias: bool | None = None
    lm_head_bias: bool = False
    norm: Norm = Norm.LAYERNORM
    position_embedding: PositionEmbedding = PositionEmbedding.LEARNED
    position_offset: int = 0
    gated_mlp: bool = False
    activation: Activation = Activation.GELU
    num_experts: int = 1
    experts_per_token: int = 1
    embedding_norm: bool = False
    final_norm: bool = True
    embed_proj_dim: int | None = None
    modelling: TransformersModelling | None = None

    def __post_init__(self) -> None:
        validate(self)

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def d_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.d_head

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.d_head

    @property
    def has_qkv_bias(self) -> bool:
        return self.bias if self.qkv_bias is None else self.qkv_bias


def validate(arch: Architecture) -> None:
    """Raise :class:`InputError` naming the field when the architecture cannot exist."""
    prefix = "model.architecture"
    for name in ("layers", "hidden", "heads", "vocab_size"):
        if not 1 <= getattr(arch, name) <= MAX_DIM:
            raise InputError(f"{prefix}.{name}", f"must be between 1 and {MAX_DIM}")
    for name in ("ffn_hidden", "max_seq_len", "kv_heads", "head_dim", "embed_proj_dim"):
        value = getattr(arch, name)
        if value is not None and not 1 <= value <= MAX_DIM:
            raise InputError(f"{prefix}.{name}", f"must be between 1 and {MAX_DIM} when given")
    if not 0 <= arch.position_offset <= MAX_DIM:
        raise InputError(f"{prefix}.position_offset", f"must be between 0 and {MAX_DIM}")
    if not 1 <= arch.num_experts <= MAX_DIM:
        raise InputError(f"{prefix}.num_experts", f"must be between 1 and {MAX_DIM}")
    if arch.head_dim is None and arch.hidden % arch.heads:
        raise InputError(
            f"{prefix}.heads", f"{arch.heads} heads do not divide hidden size {arch.hidden}"
        )
    if arch.heads % arch.n_kv_heads:
        raise InputError(
            f"{prefix}.kv_heads", f"{arch.n_kv_heads} kv heads do not divide {arch.heads} heads"
        )
    if arch.position_embedding is PositionEmbedding.LEARNED and arch.max_seq_len is None:
        raise InputError(f"{prefix}.max_seq_len", "is required with learned position embeddings")
    if arch.layers * arch.num_experts > MAX_BLOCK_MLPS:
        raise InputError(
            f"{prefix}.num_experts",
            f"layers × num_experts = {arch.layers * arch.num_experts} MLPs, over {MAX_BLOCK_MLPS}",
        )
    if not 1 <= arch.experts_per_token <= arch.num_experts:
        raise InputError(
            f"{prefix}.experts_per_token", f"must be between 1 and num_experts ({arch.num_experts})"
        )


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor of the canonical module.

    Attributes:
        name: dotted name as ``nn.Module.named_parameters`` would give it.
        shape: its shape.
        layer: the block index, or ``None`` for embeddings (-) and the head.
        tp_split: Megatron-style tensor parallelism splits it across TP ranks (column- or
            row-parallel weights, column-parallel biases, the vocabulary); norms, row-parallel
            biases, position tables and routers are replicated.
        stage_hint: ``"first"`` for embeddings, ``"last"`` for final norm and head, else
            ``"layer"``: where pipeline parallelism places it.
    """

    name: str
    shape: tuple[int, ...]
    layer: int | None = None
    tp_split: bool = False
    stage_hint: str = "layer"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class _Linear:
    name: str
    out_features: int
    in_features: int
    bias: bool
    tp_split_bias: bool


def _norm(arch: Architecture, name: str, width: int, layer: int | None, hint: str) -> list[Tensor]:
    out = [Tensor(f"{name}.weight", (width,), layer, False, hint)]
    if arch.norm is Norm.LAYERNORM and arch.bias:
        out.append(Tensor(f"{name}.bias", (width,), layer, False, hint))
    return out


def _linear(spec: _Linear, layer: int | None, hint: str) -> list[Tensor]:
    out = [Tensor(f"{spec.name}.weight", (spec.out_features, spec.in_features), layer, True, hint)]
    if spec.bias:
        out.append(
            Tensor(f"{spec.name}.bias", (spec.out_features,), layer, spec.tp_split_bias, hint)
        )
    return out


def _mlp(arch: Architecture, prefix: str, layer: int, width: int | None = None) -> list[Tensor]:
    h, f, b = arch.hidden, width or arch.ffn, arch.bias
    if arch.gated_mlp and arch.modelling is not None and arch.modelling.fused_projections:
        # Phi-3's gate_up_proj: the gate's rows, then the up projection's, in one linear
        specs = [
            _Linear(f"{prefix}.gate_up", 2 * f, h, b, True),
            _Linear(f"{prefix}.down", h, f, b, False),
        ]
    elif arch.gated_mlp:
        specs = [
            _Linear(f"{prefix}.gate", f, h, b, True),
            _Linear(f"{prefix}.up", f, h, b, True),
            _Linear(f"{prefix}.down", h, f, b, False),
        ]
    else:
        specs = [_Linear(f"{prefix}.fc1", f, h, b, True), _Linear(f"{prefix}.fc2", h, f, b, False)]
    return [t for spec in specs for t in _linear(spec, layer, "layer")]


def dense_layers(arch: Architecture) -> int:
    """Blocks with a dense MLP: all of a dense model, DeepSeek's first ``dense_layers`` of an
    MoE model, none of the other MoE models."""
    if arch.num_experts == 1:
        return arch.layers
    m = arch.modelling
    return min(m.dense_layers, arch.layers) if m is not None else 0


def block_kinds(arch: Architecture) -> list[tuple[int, int]]:
    """``(first block, blocks)`` of each kind of block, in order: the dense blocks, then the
    MoE blocks (one kind when all blocks are alike)."""
    dense = dense_layers(arch)
    if 0 < dense < arch.layers:
        return [(0, dense), (dense, arch.layers - dense)]
    return [(0, arch.layers)]


def _replicated(tensors: list[Tensor]) -> list[Tensor]:
    return [replace(t, tp_split=False) for t in tensors]


def _latent_attention(arch: Architecture, p: str, i: int) -> list[Tensor]:
    """``DeepseekV3Attention``'s parameters in registration order (``attention_bias`` on the
    two down projections and ``o_proj``); the down projections are replicated under tensor
    parallelism (Megatron-LM's MLA), the up projections column- and ``o_proj`` row-parallel."""
    m = arch.modelling
    assert m is not None and m.latent_attention is not None
    mla, h, heads, b = m.latent_attention, arch.hidden, arch.heads, arch.has_qkv_bias
    q_width = heads * mla.qk_head_dim
    out: list[Tensor] = []
    if mla.q_lora_rank is None:
        out += _linear(_Linear(f"{p}.attn.q", q_width, h, False, True), i, "layer")
    else:
        out += _replicated(
            _linear(_Linear(f"{p}.attn.q_a", mla.q_lora_rank, h, b, False), i, "layer")
        )
        out += _norm(arch, f"{p}.attn.q_a_norm", mla.q_lora_rank, i, "layer")
        out += _linear(_Linear(f"{p}.attn.q_b", q_width, mla.q_lora_rank, False, True), i, "layer")
    kv_a = _Linear(f"{p}.attn.kv_a", mla.kv_lora_rank + mla.qk_rope_head_dim, h, b, False)
    out += _replicated(_linear(kv_a, i, "layer"))
    out += _norm(arch, f"{p}.attn.kv_a_norm", mla.kv_lora_rank, i, "layer")
    kv_b = heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    out += _linear(_Linear(f"{p}.attn.kv_b", kv_b, mla.kv_lora_rank, False, True), i, "layer")
    out_bias = bool(m.out_bias)
    out += _linear(
        _Linear(f"{p}.attn.proj", h, heads * mla.v_head_dim, out_bias, False), i, "layer"
    )
    return out


def _fused_experts(arch: Architecture, prefix: str, layer: int) -> list[Tensor]:
    """transformers ≥ 5's expert parameters: every expert's gate and up rows in one 3-D tensor,
    every expert's down projection in another (``experts.gate_up_proj``, ``experts.down_proj``;
    no biases)."""
    e, h, f = arch.num_experts, arch.hidden, arch.ffn
    return [
        Tensor(f"{prefix}.gate_up_proj", (e, 2 * f, h), layer, True, "layer"),
        Tensor(f"{prefix}.down_proj", (e, h, f), layer, True, "layer"),
    ]


def _block(arch: Architecture, i: int, experts: int) -> list[tuple[Tensor, bool]]:
    """Block ``i``'s parameters in registration order with only the first ``experts`` experts,
    each with whether it belongs to an expert."""
    p = f"blocks.{i}"
    h = arch.hidden
    m = arch.modelling
    out = _norm(arch, f"{p}.ln1", h, i, "layer")
    if m is not None and m.latent_attention is not None:
        out += _latent_attention(arch, p, i)
    elif m is None or m.fused_projections:
        out += _linear(
            _Linear(f"{p}.attn.qkv", arch.q_dim + 2 * arch.kv_dim, h, arch.has_qkv_bias, True),
            i,
            "layer",
        )
    else:
        # transformers' q_proj, k_proj and v_proj, three linears (each its own ZeRO-3 fetch),
        # in the order the attention runs them: a head norm right after its projection
        for name, rows in (("q", arch.q_dim), ("k", arch.kv_dim), ("v", arch.kv_dim)):
            spec = _Linear(f"{p}.attn.{name}", rows, h, arch.has_qkv_bias, True)
            out += _linear(spec, i, "layer")
            if m.qk_norm and name != "v":
                out += _norm(arch, f"{p}.attn.{name}_norm", arch.d_head, i, "layer")
    if m is None or m.latent_attention is None:
        out_bias = arch.bias if m is None or m.out_bias is None else m.out_bias
        out += _linear(_Linear(f"{p}.attn.proj", h, arch.q_dim, out_bias, False), i, "layer")
    if m is not None and m.sandwich_norms:
        out += _norm(arch, f"{p}.post_attn_norm", h, i, "layer")
    out += _norm(arch, f"{p}.ln2", h, i, "layer")
    tagged = [(t, False) for t in out]
    if i < dense_layers(arch):
        width = m.dense_ffn if m is not None and arch.num_experts > 1 else None
        tagged += [(t, False) for t in _mlp(arch, f"{p}.mlp", i, width)]
    else:
        router = Tensor(f"{p}.router.weight", (arch.num_experts, h), i, False, "layer")
        if m is not None and m.fused_experts:
            fused = [(t, False) for t in _fused_experts(arch, f"{p}.experts", i)]
            tagged += [*fused, (router, False)] if m.experts_first else [(router, False), *fused]
        else:
            tagged.append((router, False))
            for e in range(experts):
                tagged += [(t, True) for t in _mlp(arch, f"{p}.experts.{e}", i)]
        if m is not None and m.shared_expert_ffn:
            tagged += [(t, False) for t in _mlp(arch, f"{p}.shared_expert", i, m.shared_expert_ffn)]
            if m.shared_expert_gate:
                gate = Tensor(f"{p}.shared_expert_gate.weight", (1, h), i, False, "layer")
                tagged.append((gate, False))
    if m is not None and m.sandwich_norms:
        tagged += [(t, False) for t in _norm(arch, f"{p}.post_mlp_norm", h, i, "layer")]
    return tagged


def block_template(arch: Architecture, i: int) -> list[tuple[Tensor, bool]]:
    """Block ``i``'s parameters with its first expert only, each with whether it belongs to
    an expert (repeated ``num_experts`` times in the block)."""
    return _block(arch, i, 1)


def block_tensors(arch: Architecture, i: int) -> list[Tensor]:
    """The parameters of block ``i`` in registration order."""
    return [t for t, _ in _block(arch, i, arch.num_experts)]


def tensor_counts(arch: Architecture) -> list[tuple[Tensor, int]]:
    """Every distinct parameter tensor with how often it occurs, without naming each copy.

    Blocks of one kind repeat the same tensors and experts the same MLP, so the first block of
    each kind (its expert 0) stands for all of them; the tensors outside the blocks occur once.
    Sums over ``tensors(arch)`` equal sums over this list weighted by the counts.
    """
    one = replace(arch, layers=1, num_experts=1, experts_per_token=1)
    layer: list[tuple[Tensor, int]] = []
    for first, blocks in block_kinds(arch):
        for t, per_expert in block_template(arch, first):
            layer.append((t, blocks * arch.num_experts if per_expert else blocks))
    outside = [t for t in _tensors(one) if t.layer is None]
    return [(t, 1) for t in outside] + layer


def tensors(arch: Architecture) -> list[Tensor]:
    """Every parameter tensor of the canonical module, in ``named_parameters`` order."""
    return list(_tensors(arch))  # a fresh list: callers may extend it (split_for_model_parallel)


@lru_cache(maxsize=16)  # few: a MoE model's list runs to ~50k tensors
def _tensors(arch: Architecture) -> tuple[Tensor, ...]:
    """``tensors`` once per architecture: a sweep asks for the same list per Nd and stage."""
    emb_dim = arch.embed_proj_dim or arch.hidden
    out = [Tensor("embed.weight", (arch.vocab_size, emb_dim), None, True, "first")]
    if arch.embed_proj_dim is not None and arch.embed_proj_dim != arch.hidden:
        out.append(Tensor("project_in.weight", (arch.hidden, emb_dim), None, True, "first"))
    if arch.position_embedding is PositionEmbedding.LEARNED:
        assert arch.max_seq_len is not None  # validate() guarantees it
        rows = arch.max_seq_len + arch.position_offset
        out.append(Tensor("pos.weight", (rows, arch.hidden), None, False, "first"))
    if arch.embedding_norm:
        out += _norm(arch, "embed_norm", emb_dim, None, "first")
    for i in range(arch.layers):
        out += block_tensors(arch, i)
    if arch.final_norm:
        out += _norm(arch, "ln_f", arch.hidden, None, "last")
    if arch.embed_proj_dim is not None and arch.embed_proj_dim != arch.hidden:
        out.append(Tensor("project_out.weight", (emb_dim, arch.hidden), None, True, "last"))
    if not arch.tied_embeddings:
        out.append(Tensor("head.weight", (arch.vocab_size, emb_dim), None, True, "last"))
        if arch.lm_head_bias:
            out.append(Tensor("head.bias", (arch.vocab_size,), None, True, "last"))
    return tuple(out)


def count_params(arch: Architecture) -> int:
    """Exact parameter count, as ``sum(p.numel() for p in module.parameters())`` gives it."""
    return sum(t.numel * count for t, count in tensor_counts(arch))


def count_active_params(arch: Architecture) -> int:
    """Parameters one token passes through (MoE: only ``experts_per_token`` experts)."""
    if arch.num_experts == 1:
        return count_params(arch)
    per_expert = sum(t.numel for t in _mlp(arch, "x", 0))
    moe_layers = arch.layers - dense_layers(arch)
    inactive = moe_layers * (arch.num_experts - arch.experts_per_token) * per_expert
    return count_params(arch) - inactive


@dataclass(frozen=True)
class ModelParallelSplit:
    """Parameters one device holds once TP and PP have divided the model, before ZeRO.

    Attributes:
        params: the heaviest pipeline stage's parameters on one tensor-parallel rank.
        stage_params: each pipeline stage's per-TP-rank parameters.
        largest_tensor: the largest single tensor on that device (DeepSpeed's ZeRO-3 estimator
            uses the largest layer).
    """

    params: int
    stage_params: tuple[int, ...] = field(default=())
    largest_tensor: int = 0


def split_for_model_parallel(arch: Architecture, tp: int, pp: int) -> ModelParallelSplit:
    """Megatron-style split: layers evenly over ``pp`` stages, linears and vocab over ``tp``.

    The first stage holds the embeddings, the last the final norm and head; with tied
    embeddings and ``pp > 1`` the last stage keeps its own copy of the embedding (Megatron-LM
    ``shared_embedding``). TP-split tensors take ``ceil(numel / tp)`` elements.
    """
    if arch.layers % pp:
        raise InputError("pp", f"pipeline degree {pp} does not divide {arch.layers} layers")
    if arch.heads % tp or arch.n_kv_heads % tp and tp % arch.n_kv_heads:
        raise InputError("tp", f"tensor-parallel degree {tp} does not divide {arch.heads} heads")
    per_stage = arch.layers // pp
    stages = [0] * pp
    largest = 0
    all_tensors = tensors(arch)
    if arch.tied_embeddings and pp > 1:
        embed = all_tensors[0]
        all_tensors.append(Tensor("head.weight(shared)", embed.shape, None, True, "last"))
    for t in all_tensors:
        if t.stage_hint == "first":
            s = 0
        elif t.stage_hint == "last":
            s = pp - 1
        else:
            assert t.layer is not None
            s = t.layer // per_stage
        n = -(-t.numel // tp) if t.tp_split else t.numel
        stages[s] += n
        largest = max(largest, n)
    return ModelParallelSplit(max(stages), tuple(stages), largest)
