"""Activation memory of a decoder training step, tensor by tensor.

The figures follow what autograd saves for backward in the canonical module
(``calculators/architecture.py``; ``measure/workloads.py`` runs it): pre-norm blocks,
``x = x + proj(sdpa(qkv(ln1(x))))``, ``x = x + fc2(act(fc1(ln2(x))))``, a final norm, the
output head and a cross-entropy on ``logits.float()``. Three dtype regimes cover the engines:

- ``autocast``: fp32 parameters under ``torch.autocast(bfloat16)`` (DDP, ZeroRedundancyOptimizer,
  DeepSpeed is not this). The residual stream stays fp32 (bf16 + fp32 promotes); norms run in
  fp32; each linear saves a bf16 copy of its input and of its weight (autocast's cast cache).
- ``half``: 16-bit parameters and activations (FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16)``,
  DeepSpeed fp16/bf16, pure bf16). Korthikanti et al. 2022's 34·s·b·h per layer for
  flash-style attention comes out of this regime with ffn = 4h.
- ``fp32``: everything in fp32.

Attention through ``scaled_dot_product_attention`` (flash / memory-efficient kernels) saves
q, k, v, its output and a logsumexp; it never keeps the s × s scores and softmax
(Korthikanti's 5·a·s/h term: scores, softmax output and a dropout mask).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cached_property
from itertools import accumulate

from calculators.architecture import (
    Activation,
    Architecture,
    Norm,
    PositionEmbedding,
    TracedActivations,
)
from calculators.batch import Batch, Checkpointing
from calculators.conventions import FP32_BYTES, HALF_BYTES
from calculators.errors import InputError
from calculators.reduction_scratch import reduction_scratch

INDEX_BYTES = 8  # int64 token ids and targets


class Regime(StrEnum):
    """Dtypes of parameters and activations during forward."""

    AUTOCAST = "autocast"
    HALF = "half"
    FP32 = "fp32"


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one block keeps for backward (per micro-batch, per device)."""

    norms: int
    linear_inputs: int
    attention: int
    mlp: int

    @property
    def total(self) -> int:
        return self.norms + self.linear_inputs + self.attention + self.mlp


@dataclass(frozen=True)
class ActivationBreakdown:
    """Activation bytes of one micro-batch, by where they are born.

    Attributes:
        per_layer: what one block saves without checkpointing.
        layers: all blocks together under the checkpointing policy (what stays alive at the
            end of forward).
        recompute: the extra bytes of the one block being recomputed in backward (full
            checkpointing only).
        embedding: token ids kept by the embedding and the residual input.
        head: what the final norm and the output head save.
        logits: bytes of the 16-bit (or fp32) logits the head returns, kept by the caller.
        loss: the fp32 logits copy and the log-softmax output the cross-entropy saves.
        loss_transient: bytes alive only inside the loss call (the fp32 copy of the logits
            before log-softmax frees it).
        autocast_weights: bf16 copies of linear weights held by autocast for backward (and
            the fp32 copies of DeepSeek's router weights its code makes from 16-bit ones).
        cache: bytes of the key/value cache transformers' models fill during a training forward
            (``use_cache``), held by the model output for as long as the loop keeps it.
        cache_only: the part of ``cache`` that nothing saved for backward shares: alive while
            the model's forward computes the loss from ``labels``, gone once the loop has taken
            the loss from the output and dropped the rest (transformers' Trainer:
            ``compute_loss`` returns ``outputs["loss"]``), so not part of ``end_of_forward``.
        offloaded: bytes of the checkpointed layers' inputs held in pinned host memory
            (``batch.checkpoint_offload``), not on the device and not in ``layers``.
        every_n_layers: full checkpointing of layers 0, n, 2n, ... only (transformers'
            ``every_n_layers``); the others keep all they save.
        block_saved: what each block keeps at the end of forward (``every_n_layers`` > 1): a
            checkpointed one its input, or nothing when offload holds it in host memory; the
            others all they save, each by its kind (dense or MoE, sliding-window or full
            attention, rotary or not).
        block_copies: autocast's weight copies each block saves (``every_n_layers`` > 1; in
            ``autocast_weights``): those of the blocks that are not checkpointed.
        cast_cache: autocast's weight copies that only its cast cache holds: those of the
            checkpointed layers, whose forward saves nothing, alive until the autocast region
            exits (a transformers model computes its loss inside it).
    """

    per_layer: LayerActivations
    layers: int
    recompute: int
    embedding: int
    head: int
    logits: int
    loss: int
    loss_transient: int
    autocast_weights: int
    cache: int = 0
    cache_only: int = 0
    offloaded: int = 0
    every_n_layers: int = 1
    block_saved: tuple[int, ...] = ()
    block_copies: tuple[int, ...] = ()
    cast_cache: int = 0

    @cached_property
    def _saved_prefix(self) -> tuple[int, ...]:
        return (0, *accumulate(self.block_saved))

    @cached_property
    def _copies_prefix(self) -> tuple[int, ...]:
        return (0, *accumulate(self.block_copies))

    def saved(self, block: int, blocks: int) -> int:
        """What block ``block`` of ``blocks`` keeps at the end of forward."""
        if self.every_n_layers == 1:
            return self.layers // blocks
        return self.block_saved[block]

    def saved_below(self, block: int, blocks: int) -> int:
        """What blocks ``0 .. block - 1`` keep at the end of forward."""
        if self.every_n_layers == 1:
            return block * (self.layers // blocks)
        return self._saved_prefix[block]

    def saved_after(self, block: int, blocks: int) -> int:
        """What blocks ``block + 1 .. blocks - 1`` keep at the end of forward (freed by the time
        block ``block`` runs backward)."""
        if self.every_n_layers == 1:
            return (blocks - 1 - block) * (self.layers // blocks)
        return self.layers - self._saved_prefix[block + 1]

    def most_saved_below(self, blocks: range, per_block: int, own: bool = False) -> int:
        """The largest ``saved_below(i) + per_block × i`` over ``blocks`` (with ``own``, plus
        ``saved(i)``): a walk over the blocks' sums without a call per block, for moments whose
        other terms are linear in the block (``every_n_layers`` > 1)."""
        prefix, saved = self._saved_prefix, self.block_saved
        if own:
            return max(prefix[i] + saved[i] + per_block * i for i in blocks)
        return max(prefix[i] + per_block * i for i in blocks)

    def plain_copies_below(self, block: int) -> int:
        """Autocast's weight copies the layers before ``block`` that are not checkpointed save."""
        if self.every_n_layers == 1:
            return 0
        return self._copies_prefix[block]

    def recomputed(self, block: int) -> bool:
        """Whether backward runs block ``block``'s forward again (full checkpointing only)."""
        return self.recompute > 0 and block % self.every_n_layers == 0

    @property
    def end_of_forward(self) -> int:
        """Everything alive when forward and the loss are done and the loop holds only the
        logits and the loss (the key/value cache died with the rest of the model output)."""
        return (
            self.layers
            + self.embedding
            + self.head
            + self.logits
            + self.loss
            + self.autocast_weights
        )


def _bytes(regime: Regime) -> tuple[int, int]:
    """(residual-stream bytes, linear-activation bytes) per element."""
    if regime is Regime.AUTOCAST:
        return FP32_BYTES, HALF_BYTES
    if regime is Regime.HALF:
        return HALF_BYTES, HALF_BYTES
    return FP32_BYTES, FP32_BYTES


def layer_activations(
    arch: Architecture,
    batch: Batch,
    regime: Regime,
    tp: int = 1,
) -> LayerActivations:
    """What one block saves for backward (Korthikanti et al. 2022 §4, per saved tensor).

    Tensor parallelism splits the attention and MLP interiors over ``tp`` (Megatron column /
    row parallel); norms and residuals stay whole (no sequence parallelism).
    """
    t = batch.tokens
    res, lin = _bytes(regime)
    h, f = arch.hidden, arch.ffn
    stats = _norm_stats(arch, t)
    # Each norm saves its input (the residual stream); the linear after it saves its input
    # cast to the compute dtype (autocast: a bf16 copy; otherwise the norm output itself).
    norms = 2 * (res * t * h + stats)
    linear_inputs = 2 * lin * t * h  # qkv input and fc1 (gate/up) input
    attention_bytes = _attention_saved(arch, batch, lin, tp)
    if arch.gated_mlp:
        # gate and up outputs (saved by the activation and the product), activation output,
        # product (saved by down).
        mlp = 4 * lin * t * f // tp
    elif arch.activation is Activation.RELU:
        # ReLU saves its output, which is also fc2's input: one tensor of t × f.
        mlp = lin * t * f // tp
    else:
        # fc1 output (saved by GELU, which needs its input) and GELU's output (saved by fc2).
        mlp = 2 * lin * t * f // tp
    if arch.num_experts > 1:
        mlp = mlp * arch.experts_per_token + FP32_BYTES * t * arch.num_experts  # router probs
    return LayerActivations(norms, linear_inputs, attention_bytes, mlp)


def _attention_saved(arch: Architecture, batch: Batch, lin: int, tp: int) -> int:
    """What the canonical attention (``measure.workloads.Attention``) saves, in bytes.

    SDPA saves q, k, v, its output and an fp32 logsumexp per head. Without RoPE or grouped
    key/value heads q, k and v are views of the qkv output, whose whole storage stays alive,
    and the kernel lays its output out as q is laid out, (b, s, heads, d), so
    ``transpose(1, 2).reshape(b, s, h)`` is a view and the output projection saves no copy.
    RoPE (``_rope``) saves the cos and sin it made for q and for k (s × d/2 each, in q's dtype)
    and hands SDPA new rotated q and k (``torch.cat``), laid out (b, heads, s, d): the output
    follows, and the reshape for the output projection copies it. Grouped key/value heads are
    expanded by ``repeat_interleave`` into new k and v as wide as q, whose backward saves no
    input. The qkv output outlives forward only while SDPA saves a view of it. Tensor
    parallelism splits all but the cos and sin over ``tp``."""
    t, s = batch.tokens, batch.seq_len
    q, kv = arch.q_dim, arch.kv_dim
    rope = arch.position_embedding is PositionEmbedding.ROPE
    grouped = arch.n_kv_heads != arch.heads
    # SDPA's output and its logsumexp
    terms = [lin * t * q, FP32_BYTES * t * arch.heads]
    if not rope or not grouped:  # q (no RoPE) or v (no grouping) is a view of the qkv output
        terms.append(lin * t * (q + 2 * kv))
    if rope:
        terms.append(lin * t * q)  # rotated q
        if not grouped:
            terms.append(lin * t * kv)  # rotated k (expanded below when grouped)
        terms.append(lin * t * q)  # the output's copy for the output projection
    if grouped:
        terms.append(2 * lin * t * q)  # the expanded k and v
    cos_sin = 4 * lin * s * (arch.d_head // 2) if rope else 0  # for q and for k
    return sum(term // tp for term in terms) + cos_sin


def mlp_backward(
    arch: Architecture, batch: Batch, moved: bool = False, recomputed: bool = False
) -> int | None:
    """With 16-bit parameters (the module cast, as DeepSpeed does): what the canonical block's
    MLP backward holds at its largest beyond its saved tensors and the gradient entering it;
    ``None`` for a mixture of experts (not modelled). ``moved``: a gradient hook takes each
    weight gradient away once accumulated (DeepSpeed's stage 2 and 3). ``recomputed``: the
    block runs again under non-reentrant checkpointing, whose unpack hook hands each recomputed
    saved tensor over once, so a tensor only one node saved is freed when that node's backward
    returns.

    ``measure.workloads.MLP``, its ops' backward in autograd's order:

    - The output projection writes its input's gradient (tokens × ffn) and its weight's
      (ffn × hidden) before freeing its saved input.
    - ReLU saves its output, which is the projection's saved input, and the gated product
      ``act(gate) * up`` writes both factors' gradients with the product freed: two tokens × ffn
      tensors, beside the projection's weight gradient unless a hook moved it. GELU and SiLU
      write their input's gradient as that input is freed: nothing above that.
    - The input projection (``up`` first when gated: made last in forward) writes its input's
      gradient (tokens × hidden) and its weight's (hidden × ffn); by then the activation's
      input and output are freed and one tokens × ffn gradient stands in for them (ReLU's input
      was never saved).
    - With biases, autograd then sums each projection's bias gradient over the tokens
      (``validate_outputs``: ``sum_to`` the bias's shape) with both gradients above alive, and
      the reduction kernel stages its partial sums in a buffer sized by its launch
      configuration (:func:`calculators.reduction_scratch.reduction_scratch`, a Hopper GPU's):
      up to 132 MiB, far above the bias. In a recomputed block the projection's saved input
      is gone by then where no other node saved it (the output projection's but under ReLU,
      the input projection's but when gated). The bias gradients themselves (a vector each)
      are left out."""
    if arch.num_experts > 1:
        return None
    t, f, h = batch.tokens, arch.ffn, arch.hidden
    kept = 0 if moved else HALF_BYTES * f * h  # the output projection's weight gradient
    relu = not arch.gated_mlp and arch.activation is Activation.RELU
    out_projection = HALF_BYTES * (t * f + f * h)
    in_projection = HALF_BYTES * (t * h + h * f) + kept - (0 if relu else HALF_BYTES * t * f)
    candidates = [out_projection, in_projection]
    if arch.bias:
        out_freed = HALF_BYTES * t * f if recomputed and not relu else 0
        in_freed = HALF_BYTES * t * h if recomputed and not arch.gated_mlp else 0
        candidates.append(out_projection - out_freed + reduction_scratch(h, t))
        candidates.append(in_projection - in_freed + reduction_scratch(f, t))
    if arch.gated_mlp or relu:
        candidates.append(HALF_BYTES * 2 * t * f + kept)
    return max(candidates)


def final_norm_saved(arch: Architecture, batch: Batch) -> int:
    """What the canonical decoder's final norm saves in 16 bits: its input and fp32 statistics
    (mean and rstd; rstd only for RMSNorm)."""
    t = batch.tokens
    return HALF_BYTES * t * arch.hidden + _norm_stats(arch, t)


def _norm_stats(arch: Architecture, tokens: int) -> int:
    """The fp32 statistics one norm saves: LayerNorm its mean and rstd, RMSNorm its rstd."""
    return (1 if arch.norm is Norm.RMSNORM else 2) * FP32_BYTES * tokens


def linear_weight_elements(arch: Architecture, tp: int = 1) -> int:
    """Elements of every linear weight the forward multiplies by (head included)."""
    from calculators.architecture import tensor_counts

    total = 0
    for tensor, count in tensor_counts(arch):
        if len(tensor.shape) >= 2 and not tensor.name.startswith(("embed.", "pos.")):
            total += count * (tensor.numel // tp if tensor.tp_split else tensor.numel)
    if arch.tied_embeddings:
        total += arch.vocab_size * (arch.embed_proj_dim or arch.hidden) // tp
    return total


def _head_elements(arch: Architecture, tp: int) -> int:
    """Elements of the output projection (the head, or the tied embedding used as one)."""
    return arch.vocab_size * (arch.embed_proj_dim or arch.hidden) // tp


def activations(
    arch: Architecture,
    batch: Batch,
    regime: Regime,
    tp: int = 1,
    pp: int = 1,
) -> ActivationBreakdown:
    """Activation bytes of one micro-batch on one device.

    Full checkpointing keeps each block's input (the residual stream) and recomputes one block
    at a time in backward; selective checkpointing recomputes the attention core only, whose
    quadratic scores SDPA never keeps, so with SDPA it saves just the logsumexp.
    """
    if arch.modelling is not None:
        return _transformers_activations(arch, batch, regime, tp, pp)
    if batch.checkpoint_offload:
        raise InputError(
            "batch.checkpoint_offload",
            "offload is transformers' gradient checkpointing option (a model given by "
            "hf_config or a preset of a transformers family); the canonical decoder's "
            "checkpoints keep their inputs on the device",
        )
    if batch.checkpoint_every_n_layers > 1:
        raise InputError(
            "batch.checkpoint_every_n_layers",
            "every_n_layers is transformers' gradient checkpointing option (a model given by "
            "hf_config or a preset of a transformers family); the canonical decoder "
            "checkpoints every block",
        )
    if batch.padded:
        raise InputError(
            "batch.padded",
            "a padded attention_mask is modelled for transformers' modelling code (a model "
            "given by hf_config or a preset of a transformers family); the canonical decoder "
            "attends without a mask",
        )
    t = batch.tokens
    res, lin = _bytes(regime)
    per_layer = layer_activations(arch, batch, regime, tp)
    layers_here = arch.layers // pp
    # selective checkpointing recomputes the attention core from the qkv output, which the
    # checkpoint keeps, and keeps the core's (b, s, q) output, which the output projection saves:
    # all else the core saved (SDPA's logsumexp; RoPE's and grouped heads' copies) is recomputed
    core_kept = lin * t * (arch.q_dim + 2 * arch.kv_dim) // tp + lin * t * arch.q_dim // tp
    core_recomputed = per_layer.attention - core_kept
    block_weights = HALF_BYTES * (linear_weight_elements(arch, tp) - _head_elements(arch, tp))
    if batch.activation_checkpointing is Checkpointing.FULL:
        # torch.utils.checkpoint keeps each block's input; backward recomputes one block at a
        # time, autocast casting that block's weights again.
        layers = layers_here * res * t * arch.hidden
        recompute = per_layer.total + (
            block_weights // arch.layers if regime is Regime.AUTOCAST else 0
        )
    elif batch.activation_checkpointing is Checkpointing.SELECTIVE:
        # the attention core is recomputed: its input (qkv) and output stay saved by the
        # linears around it; what goes is SDPA's logsumexp (and RoPE's and grouped heads'
        # copies).
        layers = layers_here * (per_layer.total - core_recomputed)
        recompute = core_recomputed
    else:
        layers = layers_here * per_layer.total
        recompute = 0
    stats = _norm_stats(arch, t)
    head = (res * t * arch.hidden + stats if arch.final_norm else 0) + lin * t * arch.hidden
    vocab = arch.vocab_size // tp
    logits = lin * t * vocab
    # cross_entropy(logits.float()): log_softmax saves its fp32 output; nll_loss keeps targets.
    loss = FP32_BYTES * t * vocab + INDEX_BYTES * t
    loss_transient = FP32_BYTES * t * vocab if lin != FP32_BYTES else 0
    # autocast's cast cache dies when the autocast region exits; what outlives it is what
    # autograd saved: every linear's bf16 weight, or only the head's when blocks are checkpointed.
    autocast_weights = 0
    if regime is Regime.AUTOCAST:
        autocast_weights = HALF_BYTES * _head_elements(arch, tp)
        if batch.activation_checkpointing is not Checkpointing.FULL:
            autocast_weights += block_weights
    return ActivationBreakdown(
        per_layer=per_layer,
        layers=layers,
        recompute=recompute,
        embedding=INDEX_BYTES * t,
        head=head,
        logits=logits,
        loss=loss,
        loss_transient=loss_transient,
        autocast_weights=autocast_weights,
    )


def _transformers_activations(
    arch: Architecture, batch: Batch, regime: Regime, tp: int, pp: int
) -> ActivationBreakdown:
    """The same breakdown for a model trained with transformers' modelling code
    (``calculators/transformers_activations.py``)."""
    from calculators import transformers_activations as hf

    if tp != 1 or pp != 1:
        raise InputError("tp", "transformers' modelling code is modelled without tp/pp splits")
    keys = hf.sdpa_math_fallback(arch, batch, regime.value)
    if keys:
        mla = arch.modelling.latent_attention if arch.modelling is not None else None
        heads = (
            f"q/k {mla.qk_head_dim} and v {mla.v_head_dim} wide"
            if mla is not None
            else f"{arch.d_head} wide"
        )
        align = "4 in fp32" if regime is Regime.FP32 else "8 in 16-bit"
        raise InputError(
            f"model.hf_config.{keys[0]}",
            f"attention heads {heads}: CUDA's fused SDPA kernels take widths that are a "
            f"multiple of {align}, so SDPA runs its math path here, which is not modelled "
            '(eager attention is: "attn_implementation": "eager")',
            also=tuple(f"model.hf_config.{k}" for k in keys[1:]),
        )
    terms = hf.model_terms(arch, batch, regime.value)
    full = batch.activation_checkpointing is Checkpointing.FULL
    traced = _traced(arch, batch, regime, full)
    per_layer = LayerActivations(
        terms.per_layer.norms,
        terms.per_layer.linear_inputs,
        terms.per_layer.attention,
        terms.per_layer.mlp,
    )
    layers, recompute = terms.layers, terms.recompute
    if batch.activation_checkpointing is Checkpointing.SELECTIVE:
        # the attention core recomputed: only SDPA's logsumexp goes
        lse = FP32_BYTES * batch.tokens * arch.heads
        layers -= arch.layers * lse
        recompute = lse
    autocast_weights = hf.weight_copies(arch, regime.value, checkpointed=full)
    every_copy = hf.weight_copies(arch, regime.value, checkpointed=False)
    # autocast caches each weight's cast while its region lasts: the checkpointed layers' copies
    # too, which their forward does not save
    cast_cache = every_copy - autocast_weights if full and regime is Regime.AUTOCAST else 0
    if full:
        # backward casts the recomputed layer's weights again
        recompute += hf.layer_weight_copies(arch, regime.value)
    offloaded = offloaded_inputs(arch, batch, regime)
    each = hf.dtypes(regime.value).res * batch.tokens * arch.hidden  # one layer's input
    if offloaded:
        # save_on_cpu packs each checkpoint's hidden_states argument into pinned host memory
        # (the masks, rotary tables and position_ids ride in the call's keyword arguments and
        # stay on the device); backward copies a layer's input back for its recomputation, and
        # with an fp32 residual stream the recomputed input norm saves that copy itself
        # (``x.to(float32)`` returns it), which ``terms.recompute`` leaves to ``layers``
        layers -= offloaded
        if hf.dtypes(regime.value).res == FP32_BYTES:
            recompute += each
    analytical = ActivationBreakdown(
        per_layer=per_layer,
        layers=layers,
        recompute=recompute,
        embedding=terms.embedding,
        head=terms.head,
        logits=terms.logits,
        loss=terms.loss,
        loss_transient=terms.loss_transient,
        autocast_weights=autocast_weights,
        cache=terms.cache,
        cache_only=terms.cache_only,
        offloaded=offloaded,
        cast_cache=cast_cache,
    )
    n = batch.checkpoint_every_n_layers
    if full and n > 1:
        # every_n_layers: layers 0, n, 2n, ... run under the checkpoint (their input kept, or
        # in host memory), the others save all they save without it; autocast's weight
        # copies of those stay saved too
        kept = 0 if batch.checkpoint_offload else each
        plain = hf.plain_layers(arch, batch, regime.value)
        copies = hf.weight_copies_by_layer(arch, regime.value)
        checkpointed = [i % n == 0 for i in range(arch.layers)]
        saved = tuple(kept if c else p for c, p in zip(checkpointed, plain, strict=True))
        unchecked_copies = tuple(0 if c else w for c, w in zip(checkpointed, copies, strict=True))
        checkpointed_copies = sum(copies) - sum(unchecked_copies)
        return replace(
            analytical,
            layers=sum(saved),
            autocast_weights=autocast_weights + sum(unchecked_copies),
            every_n_layers=n,
            block_saved=saved,
            block_copies=unchecked_copies,
            cast_cache=checkpointed_copies if regime is Regime.AUTOCAST else 0,
        )
    if traced is not None:
        # the trace's totals in place of the formulas: the layers carry whatever the trace
        # saved beyond the embedding, head and loss terms (the recomputed layer stays analytical)
        return replace(
            analytical,
            layers=traced.saved - terms.embedding - terms.head - terms.loss - offloaded,
            logits=traced.logits,
            loss_transient=traced.loss_transient,
            autocast_weights=traced.autocast_weights,
            cache=traced.cache,
            cache_only=traced.cache_only,
        )
    return analytical


def offloaded_inputs(arch: Architecture, batch: Batch | None, regime: Regime) -> int:
    """Bytes of pinned host memory transformers' checkpoint offload fills in one micro-batch's
    forward (``batch.checkpoint_offload``): every layer's ``hidden_states`` argument, freed as
    backward copies it back; 0 without offload."""
    if batch is None or not batch.checkpoint_offload:
        return 0
    from calculators import transformers_activations as hf

    checkpointed = batch.checkpointed_layers(arch.layers)
    return checkpointed * hf.dtypes(regime.value).res * batch.tokens * arch.hidden


def _traced(
    arch: Architecture, batch: Batch, regime: Regime, checkpointing: bool
) -> TracedActivations | None:
    """The trace of this batch in ``regime``, when the architecture carries one of it."""
    assert arch.modelling is not None
    t = arch.modelling.traced
    if (
        t is None
        or batch.checkpoint_every_n_layers > 1
        or (t.micro_batch_size, t.seq_len, t.checkpointing, t.padded)
        != (
            batch.micro_batch_size,
            batch.seq_len,
            checkpointing,
            batch.padded,
        )
    ):
        return None
    return t(regime.value)
