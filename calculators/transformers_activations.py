"""Activation memory of a model trained with transformers' own modelling code.

``AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")`` trained with the loss
from ``labels``, as Hugging Face users run it. Every term below is a tensor autograd saves in
transformers 5.x's modelling files (``models/<family>/modeling_<family>.py``), in the dtype
it has there; ``measure/trace.py`` runs the same code under fake tensors and CI checks that the
two agree byte for byte for every family.

Notation: ``t`` tokens of the micro-batch, ``h`` hidden, ``q``/``kv`` query and key/value
widths, ``f`` MLP width; ``res`` bytes of the residual stream (bf16 under ``half``, fp32 under
``autocast`` and ``fp32``), ``lin`` bytes a linear produces (bf16, bf16, fp32).

What differs from the canonical decoder (``calculators/activations.py``):

- RMSNorm (``LlamaRMSNorm.forward``) computes in fp32: ``x.to(float32)`` (saved by ``pow``
  and ``mul``), the fp32 ``rsqrt``, ``x_normed.to(input_dtype)`` (saved by ``weight * ·``)
  and the output (saved by the next linear). Gemma's norm (``GemmaRMSNorm``) keeps the fp32
  normalised tensor and ``1 + weight.float()`` instead, and casts its output back.
- Under autocast each ``nn.Linear`` casts its fp32 input to bf16 for itself: separate
  ``q_proj``/``k_proj``/``v_proj`` keep three bf16 copies of the norm output, gate and up two
  (the canonical fused ``qkv`` keeps one). Autocast's cast cache only holds leaf tensors.
- Rotary embeddings: ``cos`` and ``sin`` (``(1, s, rotary_dim)``, the residual dtype) are
  saved once for the model; ``q * cos + rotate_half(q) * sin`` saves only them. Under
  autocast the rotated q and k are fp32 (bf16 × fp32 promotes) and SDPA saves bf16 copies.
- SDPA with no mask dispatches to flash attention with ``enable_gqa`` (no ``repeat_kv``):
  q, k, v, the output and an fp32 logsumexp ``(b, heads, s)``. With a mask (a padded batch, or
  a sliding window the sequence reaches) transformers expands k/v to every query head
  (``repeat_kv``) and torch 2.11 on Hopper runs cuDNN attention in 16-bit
  (``bench/gpu/sdpa_choice.py --mask``): it saves the mask as a bias in q's dtype
  ``(b, 1, s, s)`` and writes its output in q's layout. In fp32 the memory-efficient
  kernel runs instead (logsumexp padded to 32 rows) where every head has its own key/value
  head; with grouped-query heads it takes no ``enable_gqa``, so SDPA's math path runs: k/v
  expanded, scaled copies of q and k and the fp32 softmax probabilities ``(b, heads, s, s)``.
  With ``use_cache`` (the config default when not checkpointing) k and v are the
  ``DynamicCache``'s concatenated copies: same bytes. The cache lives as long as the model
  output, which the loop drops once it has the loss, so what SDPA does not also save (the
  fp32 copies under autocast) counts only while the model computes its loss.
- Phi-3 rotates with ``torch.cat`` (partial rotary), so the attention output is laid out
  (b, heads, s, d) and ``transpose(1, 2).contiguous()`` copies it for ``o_proj``.
- Loss from ``labels`` (``loss/loss_utils.py`` ``ForCausalLMLoss``): ``logits.float()``
  (transient), ``log_softmax`` saves its fp32 output, ``nll_loss`` the shifted labels (a view of
  the padded ``(b, s + 1)`` labels when b = 1, a contiguous ``(b, s)`` copy otherwise) and an
  fp32 ``total_weight`` scalar. Gemma-2's final logit softcapping saves ``tanh``'s output.
- Mixture of experts through transformers' default experts kernel on CUDA (``grouped_mm``,
  ``integrations/moe.py``): router softmax (fp32), top-k indices, the sort permutation and its
  inverse, a gather index, the sentinel mask, the gathered ``t·k × h`` input, gate/up output,
  activation, product, routing weights and the down output, all ``t·k`` rows whatever the
  routing. Under autocast the experts run in fp32 (``input.to(weight.dtype)``).
- Gradient checkpointing (``model.gradient_checkpointing_enable()``, non-reentrant): each layer
  keeps its ``hidden_states`` input, plus ``position_ids`` and ``cos``/``sin`` for all layers;
  ``use_cache`` is forced off.
- Eager attention (``attn_implementation="eager"`` in the config body): ``eager_attention_forward``
  keeps the (b, heads, s, s) probabilities in fp32 and in q's dtype beside copies of q, k and v
  (``_eager_attention``), and its softmax backward holds three more fp32 tensors of that size
  (``eager_attention_backward``).
"""

from __future__ import annotations

from dataclasses import dataclass

from calculators.architecture import (
    Activation,
    Architecture,
    LatentAttention,
    TransformersModelling,
    block_kinds,
    dense_layers,
)
from calculators.batch import Batch, Checkpointing
from calculators.conventions import FP32_BYTES, HALF_BYTES
from calculators.reduction_scratch import reduction_scratch

INDEX_BYTES = 8  # int64
BOOL_BYTES = 1
INT32_BYTES = 4
EFFICIENT_LSE_ROWS = 32  # mem-efficient attention pads logsumexp rows to a multiple of 32


def _m(arch: Architecture) -> TransformersModelling:
    if arch.modelling is None:
        raise ValueError("the architecture does not follow transformers' modelling code")
    return arch.modelling


@dataclass(frozen=True)
class Dtypes:
    """Bytes per element of the tensors a regime produces."""

    res: int  # residual stream (embedding output and the adds)
    lin: int  # a linear's output
    experts: int  # MoE experts' compute (the expert weights' dtype)
    autocast: bool


def dtypes(regime: str) -> Dtypes:
    if regime == "autocast":
        return Dtypes(FP32_BYTES, HALF_BYTES, FP32_BYTES, True)
    if regime == "half":
        return Dtypes(HALF_BYTES, HALF_BYTES, HALF_BYTES, False)
    return Dtypes(FP32_BYTES, FP32_BYTES, FP32_BYTES, False)


@dataclass(frozen=True)
class LayerTerms:
    norms: int
    linear_inputs: int
    attention: int
    mlp: int


def _norm_internal(arch: Architecture, rows: int, width: int, in_bytes: int) -> int:
    """What an RMSNorm saves besides its output (``rows`` vectors of ``width``)."""
    saved = FP32_BYTES * rows * width + FP32_BYTES * rows  # x.to(float32) (or x) and rsqrt
    if _m(arch).norm_plus_one:
        # GemmaRMSNorm: the fp32 normalised x and (1 + weight.float()) saved by their product
        saved += FP32_BYTES * rows * width + FP32_BYTES * width
    else:
        # LlamaRMSNorm: x_normed.to(input_dtype), saved by weight * ·
        saved += in_bytes * rows * width
    return saved


def _norm_output(d: Dtypes, t: int, width: int, consumers: int) -> int:
    """The norm output the following linears save: one tensor, or under autocast one bf16
    copy per linear (each ``nn.Linear`` casts its fp32 input itself)."""
    if d.autocast:
        return consumers * HALF_BYTES * t * width
    return d.lin * t * width


def _attention_consumers(arch: Architecture) -> int:
    return 1 if _m(arch).fused_projections else 3


def _mlp_consumers(arch: Architecture, dense: bool) -> int:
    if dense:
        return 1 if _m(arch).fused_projections else 2
    # the router's linear, and the shared expert's gate, up and its sigmoid gate
    m = _m(arch)
    return 1 + (2 + int(m.shared_expert_gate) if m.shared_expert_ffn else 0)


def _mlp_inputs(arch: Architecture, d: Dtypes, t: int, dense: bool) -> int:
    """What the MLP's linears save of the post-attention norm's output."""
    h = arch.hidden
    m = _m(arch)
    if dense or not m.router_fp32 or d.autocast:
        return _norm_output(d, t, h, _mlp_consumers(arch, dense))
    # DeepseekV3TopkRouter: F.linear(x.type(float32), weight.type(float32)) saves an fp32
    # copy of x unless x is fp32 already; the shared experts save x itself
    if d.lin == FP32_BYTES:
        return FP32_BYTES * t * h
    return FP32_BYTES * t * h + (d.lin * t * h if m.shared_expert_ffn else 0)


def _gated_mlp_tensors(arch: Architecture) -> int:
    """The ``tokens × ffn`` tensors a gated MLP (``down_proj(act_fn(gate_proj(x)) *
    up_proj(x))``) saves: the gate and up projections' outputs, the activation's and the
    product's. SiLU and GELU save their input, the gate projection's output; ReLU saves its
    output, which the product saves too, so nothing keeps the gate projection's. Phi-3's fused
    ``gate_up_proj`` output stays whole either way (the product saves ``up``, a view of it)."""
    relu = arch.activation is Activation.RELU and not _m(arch).fused_projections
    return 3 if relu else 4


def layer_terms(
    arch: Architecture,
    batch: Batch,
    regime: str,
    use_cache: bool,
    masked: bool = False,
    dense: bool | None = None,
    rotated: bool = True,
) -> LayerTerms:
    """Bytes one decoder layer saves for backward, without checkpointing.

    ``masked``: a layer whose SDPA takes a mask: every layer of a padded batch, or a
    sliding-window layer whose window the sequence reaches. transformers then builds a boolean
    mask (``masking_utils._ignore_causal_mask_sdpa`` refuses the ``is_causal`` shortcut),
    ``sdpa_attention_forward`` expands k/v with ``repeat_kv`` (no GQA with a mask), and SDPA
    saves the mask converted to a float bias in q's dtype (``_mask_bias``). In 16-bit the
    kernel is cuDNN attention (torch 2.11 on an H100: ``bench/gpu/sdpa_choice.py --mask``),
    whose logsumexp is not padded and whose output follows q's layout; in fp32 the
    memory-efficient kernel, whose logsumexp is padded to 32 rows.

    ``dense``: a layer with a dense MLP (every layer of a dense model, DeepSeek's first
    ``dense_layers``); by default the model's own kind.

    ``rotated``: the layer rotates q and k (all but SmolLM3's NoPE layers). Under autocast a
    layer that does not hands attention its bf16 projections, which need no cast: with one
    key/value head, attention then saves views of k and v where a rotated layer's casts copy.
    """
    if dense is None:
        dense = arch.num_experts == 1
    d = dtypes(regime)
    t, b, s = batch.tokens, batch.micro_batch_size, batch.seq_len
    h, q, kv = arch.hidden, arch.q_dim, arch.kv_dim
    n_norms = 4 if _m(arch).sandwich_norms else 2
    # input norms read the residual stream; Gemma-2/3's post-attention and post-feedforward
    # norms read a linear's output
    norms = 2 * _norm_internal(arch, t, h, d.res)
    if _m(arch).sandwich_norms:
        norms += (n_norms - 2) * _norm_internal(arch, t, h, d.lin)
    # (MoE experts gather rows of the norm output and save only the index)
    linear_inputs = _mlp_inputs(arch, d, t, dense)
    f = (_m(arch).dense_ffn or arch.ffn) if arch.num_experts > 1 else arch.ffn
    mlp = _gated_mlp_tensors(arch) * d.lin * t * f if dense else _moe_terms(arch, t, d)
    mla = _m(arch).latent_attention
    if mla is not None:
        a_norms, a_inputs, attention = _latent_attention_terms(arch, mla, batch, d, masked)
        return LayerTerms(norms + a_norms, linear_inputs + a_inputs, attention, mlp)
    linear_inputs += _norm_output(d, t, h, _attention_consumers(arch))

    attention = 0
    if _m(arch).qk_norm:
        attention += _norm_internal(arch, t * arch.heads, arch.d_head, d.lin)
        attention += _norm_internal(arch, t * arch.n_kv_heads, arch.d_head, d.lin)
    sdpa = HALF_BYTES if regime != "fp32" else FP32_BYTES
    grouped = arch.n_kv_heads != arch.heads
    if _m(arch).eager_attention:
        # with one key/value head and one sequence, repeat_kv's expanded view reshapes to
        # (heads, d, s) without a copy, so bmm saves views of k and v where autocast casts
        # nothing: it casts a rotated layer's fp32 k, and v where the cache holds it in k's
        # dtype; without a cache v is the projection's own bf16 output
        one = arch.n_kv_heads == 1 and b == 1
        k_views = one and (not d.autocast or not rotated)
        v_views = one and (not d.autocast or not (use_cache and rotated))
        k_saved = q if grouped and not k_views else kv
        v_saved = q if grouped and not v_views else kv
        attention += _eager_attention(arch, batch, sdpa, q, k_saved, v_saved, q)
        if _m(arch).fused_projections and not use_cache and b == 1 and (v_views or not grouped):
            # v is a view of the fused qkv output, and for one sequence the second matmul's
            # (b·heads, s, d) reshape of it is a view too: the whole output stays alive
            attention += d.lin * t * (q + kv)
        return LayerTerms(norms, linear_inputs, attention, mlp)
    math = _sdpa_math_path(arch, regime, masked)
    efficient = regime == "fp32" and not math
    # repeat_kv with a mask; the math path expands k/v itself
    gqa_expanded = (masked or math) and grouped and not _mqa_views(arch, regime, masked, rotated)
    k_width = q if gqa_expanded else kv
    # v is cast as k is where the cache holds it (the cache allocates v in k's dtype); without
    # a cache, autocast's bf16 v needs no cast, and with one key/value head SDPA saves a view
    v_cast_as_k = use_cache or not d.autocast
    v_views = _mqa_views(arch, regime, masked, rotated if v_cast_as_k else False)
    v_copied = (masked or math) and grouped and not v_views
    v_width = q if v_copied else kv
    attention += sdpa * t * (q + k_width + v_width)  # q, k, v as SDPA saves them
    if _m(arch).fused_projections and not use_cache and not v_copied:
        # v is a view of the fused qkv output: the whole output stays alive
        attention += d.lin * t * (q + kv)
    attention += sdpa * t * q  # output (o_proj's input)
    if math:
        # the math path saves a scaled copy of q, of the expanded k (counted above as q, k)
        # and the softmax probabilities; its (b, heads, s, d) output is copied for o_proj
        # (transpose(1, 2).contiguous(), the output above) and saved by nothing
        attention += FP32_BYTES * b * arch.heads * s * s
        if _m(arch).attention_dropout:
            # its at::dropout is CUDA's fused native_dropout: a boolean mask, and the dropped
            # probabilities the second matmul saves (the kernels save only an RNG state)
            attention += (BOOL_BYTES + FP32_BYTES) * b * arch.heads * s * s
    elif _m(arch).rotary_cat and not efficient:
        # flash's and cuDNN's output follows q's layout (empty_like); the memory-efficient
        # kernel always writes (b, s, heads, d), so only it needs no copy
        attention += sdpa * t * q  # transpose(1, 2).contiguous() copy for o_proj
    if masked:
        attention += _mask_bias(batch, sdpa)
    if not math:  # the math path keeps no logsumexp
        attention += _logsumexp(arch, batch, efficient)
    return LayerTerms(norms, linear_inputs, attention, mlp)


def _eager_attention(
    arch: Architecture,
    batch: Batch,
    sdpa: int,
    q_width: int,
    k_width: int,
    v_width: int,
    out_width: int,
) -> int:
    """What ``eager_attention_forward`` saves (``attn_implementation="eager"``), per layer.

    ``torch.matmul(query, key_states.transpose(2, 3))`` runs as ``bmm`` on (b·heads, s, d)
    reshapes: the rotated q and k are laid out (b, s, heads, d) (elementwise ops follow the
    projection's layout), so the reshape copies them, and ``repeat_kv`` has already copied
    grouped key/value heads to every query head; ``bmm`` saves the copies, in SDPA's dtype
    (autocast casts the fp32 rotated tensors to bf16 first). The scores are scaled (and with
    Gemma-2's soft-capping divided, ``tanh``-ed, which saves its output, and multiplied), the
    mask is added (saving nothing), ``softmax(..., dtype=float32)`` saves its fp32 probabilities
    and ``.to(query.dtype)`` a 16-bit copy that the second ``matmul`` saves with v; in fp32 that
    cast is the same tensor. Dropout in training (``attention_dropout`` > 0) saves a boolean mask
    (CUDA's fused ``native_dropout``) and its output stands in for the 16-bit copy, or in fp32
    is one more tensor. The output (b, heads, s, d) is copied by ``transpose(1, 2).contiguous()``
    for ``o_proj``. Every layer takes a mask (no ``is_causal`` shortcut): nothing of it is saved.
    """
    m = _m(arch)
    t, b, s = batch.tokens, batch.micro_batch_size, batch.seq_len
    scores = b * arch.heads * s * s
    saved = sdpa * t * (q_width + k_width + v_width)  # q, k, v as bmm saves them
    saved += FP32_BYTES * scores  # softmax's fp32 output
    if sdpa != FP32_BYTES:
        saved += sdpa * scores  # its cast to q's dtype, saved by the second matmul
    if m.attn_softcap:
        saved += sdpa * scores  # tanh's output
    if m.attention_dropout:
        saved += BOOL_BYTES * scores + (sdpa * scores if sdpa == FP32_BYTES else 0)
    saved += sdpa * t * out_width  # output copy (o_proj's input)
    return saved


def eager_softmax_forward(arch: Architecture, batch: Batch, regime: str) -> int:
    """What a layer holds at its eager attention's softmax in forward, beyond its input (0: SDPA,
    or not a transformers model): its input norm's saved tensors and output, the latent norms
    of DeepSeek's attention, q, k and v as the first ``matmul`` saves them, and the scores.

    ``softmax(attn_weights, dtype=torch.float32)`` on 16-bit scores converts them to an fp32
    copy first (ATen's ``softmax`` takes its half-to-float kernel for fp16 only; bf16 is
    converted), then writes the fp32 output, while the variable still holds the 16-bit scores;
    on fp32 scores it writes the output beside them. Against what the attention saves
    (:func:`_eager_attention`) that is one fp32 scores tensor more, where the 16-bit copy of the
    probabilities stands for the 16-bit scores, and the output copy not made yet. The rest of
    the layer (the post-attention norms, the MLP) has not run. A recomputed or checkpointed
    layer holds the same as locals."""
    if arch.modelling is None or not _m(arch).eager_attention:
        return 0
    d = dtypes(regime)
    t, h = batch.tokens, arch.hidden
    sdpa = HALF_BYTES if regime != "fp32" else FP32_BYTES
    mla = _m(arch).latent_attention
    if mla is not None:
        norms, inputs, attention = _latent_attention_terms(arch, mla, batch, d, batch.padded)
        out = sdpa * t * arch.heads * mla.v_head_dim
    else:
        attention = layer_terms(arch, batch, regime, use_cache=False, masked=batch.padded).attention
        norms, inputs = 0, _norm_output(d, t, h, _attention_consumers(arch))
        out = sdpa * t * arch.q_dim
    scores = batch.micro_batch_size * arch.heads * batch.seq_len**2
    norms += _norm_internal(arch, t, h, d.res)
    return norms + inputs + attention - out + FP32_BYTES * scores


def _mqa_views(arch: Architecture, regime: str, masked: bool, rotated: bool = True) -> bool:
    """Whether a masked layer's ``repeat_kv`` hands SDPA views rather than copies: with one
    key/value head, ``expand`` then ``reshape`` merges a size-1 dim with a stride-0 one, which
    needs no copy, so SDPA saves views of the cache's own k and v (under autocast its bf16
    casts of a rotated layer's fp32 k and v are full-size copies instead)."""
    return masked and arch.n_kv_heads == 1 and (regime != "autocast" or not rotated)


def _sdpa_math_path(arch: Architecture, regime: str, masked: bool) -> bool:
    """Whether a layer's SDPA runs its math path: fp32 with no mask, where transformers asks SDPA
    for grouped-query heads (enable_gqa), which the memory-efficient kernel does not take
    (sdp_utils.cpp check_batch_size_and_num_heads_dense<false>) and flash and cuDNN run no fp32,
    so SDPA falls back to ``_scaled_dot_product_attention_math``. (DeepSeek's latent attention
    has as many key/value heads as query heads.)"""
    return regime == "fp32" and not masked and arch.n_kv_heads != arch.heads


def sdpa_math_fallback(arch: Architecture, batch: Batch, regime: str) -> tuple[str, ...]:
    """The ``config.json`` keys whose head widths send SDPA to its math path where the figures
    do not model it (empty: they do). CUDA's fused kernels take a head only as wide as their
    matmuls align (sdp_utils.cpp): cuDNN and the memory-efficient kernel a multiple of 8 in
    16-bit (``minimum_gemm_alignment``: 128 bits), the memory-efficient kernel a multiple of 4 in
    fp32; flash takes any width up to 256, but one width for q, k and v and no mask. A head
    they all refuse runs ``_scaled_dot_product_attention_math``, which upcasts 16-bit q, k and
    v to fp32 and keeps fp32 scores: DeepSeek's latent attention (q/k and v of two widths) with
    a width off that multiple, and a layer with a mask (a padded batch, a reached sliding
    window; in fp32 also every layer of a model with a key/value head per query head) whose
    head width is off it. (fp32 over grouped heads without a mask runs the math path whatever
    the width, and that is modelled.)"""
    m = _m(arch)
    if arch.modelling is None or m.eager_attention:
        return ()
    align = FP32_BYTES if regime == "fp32" else 8
    mla = m.latent_attention
    if mla is not None:
        if mla.qk_head_dim % align or mla.v_head_dim % align:
            return ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        return ()
    masked = _some_layer_masked(arch, batch)
    # the layers a fused kernel must take: those with a mask; in fp32 also those of a model
    # with a key/value head per query head (the memory-efficient kernel's)
    fused = masked or (regime == "fp32" and arch.n_kv_heads == arch.heads)
    return ("head_dim",) if fused and arch.d_head % align else ()


def _some_layer_masked(arch: Architecture, batch: Batch) -> bool:
    """Whether some layer's SDPA takes a mask: a padded batch, or a sliding window reached."""
    return batch.padded or _windowed_layers(arch, batch) > 0


def _mask_bias(batch: Batch, sdpa: int) -> int:
    """The float bias SDPA's kernel saves: the (b, 1, s, s) boolean mask converted to q's dtype
    (``convert_boolean_attn_mask``; a mask expanded over the batch becomes a whole one). The
    memory-efficient kernel pads a copy's last dim to a multiple of 16 for itself (``pad_bias``)
    and saves the bias it was given (an H100 run at s = 1000 saves 1000 columns)."""
    s = batch.seq_len
    return sdpa * batch.micro_batch_size * s * s


def _logsumexp(arch: Architecture, batch: Batch, efficient: bool) -> int:
    """SDPA's fp32 logsumexp: (b, heads, s), rows padded to 32 by the memory-efficient kernel."""
    s = batch.seq_len
    rows = -(-s // EFFICIENT_LSE_ROWS) * EFFICIENT_LSE_ROWS if efficient else s
    return FP32_BYTES * batch.micro_batch_size * arch.heads * rows


def _latent_follows_q(d: Dtypes) -> bool:
    """Whether SDPA writes its output in q's layout. With 16-bit q, k and v and no mask, CUDA
    runs flash attention (q, k and v of one width, at most 256) or cuDNN attention, which it
    picks on Hopper with torch 2.11 for DeepSeek's 192-wide q/k and 128-wide v
    (``torch._fused_sdp_choice``: cuDNN on an H100 for 96/64 and 192/128), and cuDNN attention
    for every width with a mask: both write the output like q. fp32 goes to the
    memory-efficient kernel, which writes (b, s, heads, d).
    On a GPU that runs the memory-efficient kernel in 16-bit too, the copy counted below is
    not made: the figure then errs high by one (tokens × heads × v) tensor per layer."""
    return d.lin == HALF_BYTES


def _latent_attention_terms(
    arch: Architecture, mla: LatentAttention, batch: Batch, d: Dtypes, masked: bool
) -> tuple[int, int, int]:
    """(norms, linear inputs, attention) of ``DeepseekV3Attention`` through SDPA.

    q: ``q_b_proj(q_a_layernorm(q_a_proj(x)))`` (or ``q_proj(x)``) split into a non-rotary and
    a rotary part; k/v: ``kv_a_proj_with_mqa(x)`` split into the latent (normed, then
    ``kv_b_proj`` to per-head non-rotary keys and values) and one rotary key for all heads.
    The rotation saves only cos/sin; ``torch.cat`` builds q (fp32 under autocast: the rotated
    part promotes, so SDPA saves a bf16 cast), ``expand_kv`` copies k into a new tensor in
    ``kv_b_proj``'s dtype, and v is a view of ``kv_b_proj``'s output, which SDPA keeps whole.
    With a mask (a padded batch) 16-bit runs cuDNN attention too, fp32 the memory-efficient
    kernel; either saves the mask's bias.
    """
    t, heads = batch.tokens, arch.heads
    h, r, rope = arch.hidden, mla.kv_lora_rank, mla.qk_rope_head_dim
    q_lora = mla.q_lora_rank
    norms = 0
    if q_lora is not None:
        norms += _norm_internal(arch, t, q_lora, d.lin)
    # kv_a_layernorm reads the latent slice of kv_a's output: to(float32) copies it, or when
    # it is fp32 already, pow saves the slice, a view of the whole output (latent + rotary key)
    latent_in = FP32_BYTES * t * (r + rope) if d.lin == FP32_BYTES else FP32_BYTES * t * r
    norms += latent_in + FP32_BYTES * t + d.lin * t * r  # input, rsqrt, x_normed.to(dtype)
    # q_a_proj (or q_proj) and kv_a_proj_with_mqa read the input norm's output; q_b_proj and
    # kv_b_proj each a latent norm's (with use_cache, kv_b_proj reads the cache's copy of it:
    # the same bytes)
    inputs = _norm_output(d, t, h, 2)
    if q_lora is not None:
        inputs += _norm_output(d, t, q_lora, 1)
    inputs += _norm_output(d, t, r, 1)
    sdpa = HALF_BYTES if d.lin == HALF_BYTES else FP32_BYTES
    qk, v = mla.qk_head_dim, mla.v_head_dim
    if _m(arch).eager_attention:
        # q (torch.cat) and k (expand_kv's new tensor) are laid out (b, heads, s, d), so bmm
        # saves them as they are (q's bf16 cast under autocast); v, a view of kv_b_proj's
        # output laid out (b, s, heads, ·), is copied by the reshape (b > 1), and that output
        # is then saved by nothing
        attention = _eager_attention(arch, batch, sdpa, heads * qk, heads * qk, 0, heads * v)
        if batch.micro_batch_size == 1:
            # one sequence: the reshape of v is a view, so kv_b_proj's output stays whole
            attention += d.lin * t * heads * (mla.qk_nope_head_dim + v)
        else:
            attention += sdpa * t * heads * v
        return norms, inputs, attention
    attention = sdpa * t * heads * qk  # q: torch.cat (its bf16 cast under autocast)
    attention += d.lin * t * heads * qk  # k: expand_kv's new tensor
    attention += d.lin * t * heads * (mla.qk_nope_head_dim + v)  # kv_b output, v a view of it
    attention += sdpa * t * heads * v  # output (o_proj's input)
    follows_q = _latent_follows_q(d)
    if follows_q:
        # q from torch.cat is laid out (b, heads, s, d): flash's or cuDNN's output follows it,
        # and transpose(1, 2).contiguous() copies it for o_proj
        attention += sdpa * t * heads * v
    if masked:
        attention += _mask_bias(batch, sdpa)
    attention += _logsumexp(arch, batch, efficient=not follows_q)
    return norms, inputs, attention


def _router_bytes(m: TransformersModelling, d: Dtypes) -> int:
    """The router's probabilities: fp32 (``softmax(router_logits.float())``), bf16 where autocast
    casts an fp32 router's linear."""
    return HALF_BYTES if m.router_fp32 and d.autocast else FP32_BYTES


def _routing_weight_bytes(m: TransformersModelling, d: Dtypes) -> int:
    """The top-k routing weights the weighted product multiplies by (and saves)."""
    if m.router_fp32:
        return _router_bytes(m, d)
    return FP32_BYTES if m.router_weights_fp32 else d.lin


def _moe_terms(arch: Architecture, t: int, d: Dtypes) -> int:
    """``MixtralSparseMoeBlock`` / ``Qwen2MoeSparseMoeBlock`` / ``DeepseekV3MoE`` through
    ``grouped_mm``.

    DeepSeek's router scores with a sigmoid of its fp32 linear (bf16 under autocast, which
    casts F.linear's inputs whatever their dtype); its group-limited choice (top-2 sums per
    group, then ``topk_group`` groups) ends in indices, so what it saved along the way dies
    before the layer ends; ``scores.gather(1, indices)`` keeps the indices.
    """
    e, k, f, h = arch.num_experts, arch.experts_per_token, arch.ffn, arch.hidden
    m = _m(arch)
    n = t * k  # token-expert assignments
    router = _router_bytes(m, d)
    saved = router * t * e  # softmax(router_logits.float()) / sigmoid(router_logits)
    saved += INDEX_BYTES * t * k  # top-k indices
    if m.router_normalize:
        saved += router * t + router * t * k  # sum and the clone the in-place div saves
    saved += 3 * INDEX_BYTES * n  # sort permutation, gather index (perm // k), inverse perm
    saved += BOOL_BYTES * n  # sentinel mask
    if d.experts == HALF_BYTES:
        saved += INT32_BYTES * e  # offsets, saved by torch's grouped_mm
    x = d.experts
    saved += x * n * h  # gathered input (masked_fill), saved by the up grouped_mm
    saved += x * n * 2 * f  # gate_up output (masked), saved by act and the product
    saved += 2 * x * n * f  # act(gate), act * up (down's input)
    weight_bytes = _routing_weight_bytes(m, d)
    saved += weight_bytes * n  # routing weights, saved by the weighted product
    saved += x * n * h  # down output (masked), saved by the weighted product
    fs = m.shared_expert_ffn
    if fs:
        saved += _gated_mlp_tensors(arch) * d.lin * t * fs  # the shared expert's gated MLP
        if m.shared_expert_gate:
            saved += d.lin * t + d.lin * t * h  # sigmoid(shared_expert_gate) and shared output
    return saved


def _shared_output_waiting(arch: Architecture, batch: Batch, d: Dtypes) -> int:
    """A gated shared expert's output gradient, made by the gate product's backward before the
    routed experts' and waiting through it for the shared expert's (0: none)."""
    m = _m(arch)
    return d.lin * batch.tokens * arch.hidden if m.shared_expert_ffn and m.shared_expert_gate else 0


def experts_backward(
    arch: Architecture, batch: Batch, regime: str, down_bytes: int | None = None
) -> int:
    """The most a MoE layer's backward holds beyond what the layer saved (0: no experts).

    ``integrations/moe.py`` ``grouped_mm_experts_forward`` ends with ``weighted_out = proj_out *
    sample_weights_g``, un-permuted by an index and summed over the top-k. Backward starts
    there: the index's backward writes the un-permuted gradient (token-expert rows × hidden),
    then the weighted product's backward writes both its inputs' gradients at that size before
    autograd casts and sums them — three such tensors in the product's dtype, which is fp32
    where the routing weights are (Mixtral's softmax in fp32), and the experts' one cast back to
    their dtype, while the layer's saved tensors are all still alive.

    Then the experts run in reverse: the weighted product frees the down output and the
    routing weights, the down ``grouped_mm`` writes ``down_proj``'s gradient and frees its input,
    the activation's and product's backward free ``act(gate)``, ``act * up`` and the gate/up
    output, and the gate/up ``grouped_mm`` writes ``gate_up_proj``'s gradient, then its input's.
    Alive then beyond the saved layer: both experts' weight gradients (E × 3 × ffn × hidden, the
    weights' dtype; ``down_bytes`` per element of ``down_proj``'s where given, 0 where a hook
    has moved it by then), the gate/up output's gradient and the gathered input's gradient,
    which stand in for the gate/up output and the gathered input still saved.

    A gated shared expert (Qwen2-MoE: ``sigmoid(gate(x)) * shared(x)``, computed before the
    routed experts and gated after them) has its output's gradient made first, by the gate
    product's backward; it waits through the routed experts' backward for the shared expert's,
    which runs after them.
    """
    if arch.modelling is None or arch.num_experts <= 1:
        return 0
    d = dtypes(regime)
    m = _m(arch)
    e, k, f, h = arch.num_experts, arch.experts_per_token, arch.ffn, arch.hidden
    n = batch.tokens * k
    x = d.experts
    weight_bytes = _routing_weight_bytes(m, d)
    product = max(x, weight_bytes)
    combine = 3 * product * n * h + (x * n * h if product != x else 0)
    down = x if down_bytes is None else down_bytes
    grads = x * e * 2 * f * h + down * e * f * h
    freed = 2 * x * n * f + weight_bytes * n  # act(gate) and act * up; the routing weights
    return max(combine, grads - freed, 0) + _shared_output_waiting(arch, batch, d)


def experts_product_backward(arch: Architecture, batch: Batch, regime: str, down_bytes: int) -> int:
    """An experts layer's gated product's backward, beyond the layer's saved tensors and the
    gradient entering it (0: no experts). The weighted product's backward has freed the down
    output (``proj_out``); the down ``grouped_mm`` has written its input's gradient (token-expert
    rows × ffn) and ``down_proj``'s weight gradient (``down_bytes`` per element where it stays
    alive, 0 where a hook has moved it or it is counted elsewhere) and freed that saved input;
    the product's backward writes both factors' gradients. A gated shared expert's output
    gradient waits through it (:func:`_shared_output_waiting`)."""
    if arch.modelling is None or arch.num_experts <= 1:
        return 0
    d = dtypes(regime)
    t, h, f = batch.tokens, arch.hidden, arch.ffn
    n = t * arch.experts_per_token
    x = d.experts
    waiting = _shared_output_waiting(arch, batch, d)
    return 2 * x * n * f + down_bytes * arch.num_experts * f * h - x * n * h + waiting


def _norm_backward(
    arch: Architecture,
    rows: int,
    width: int,
    in_bytes: int,
    recomputed: bool = False,
    weight_done: bool = False,
) -> int:
    """Bytes an RMSNorm's backward holds at its largest beyond what was alive when its output's
    gradient arrived (``rows`` vectors of ``width``, input and output ``in_bytes`` wide;
    ``recomputed``: in a block that non-reentrant checkpointing recomputed; ``weight_done``:
    only the ops after the weight's gradient is accumulated, where a hook may allocate).

    The autograd formulas run from the output back. First the weight product's backward
    (Gemma's ``to(input_dtype)`` first, whose backward casts the gradient to fp32 and frees the
    16-bit one, then ``x_normed * (1 + weight)`` in fp32; Llama's ``weight * x`` in the input's
    dtype): ``MulBackward0`` writes both factors' gradients at the full size, and autograd
    sums the weight's over the rows (``validate_outputs``: ``sum_to``), the reduction kernel
    staging its partial sums in a buffer sized by its launch configuration
    (:func:`calculators.reduction_scratch.reduction_scratch`), both gradients alive, and the
    node's input gradient: the engine drops it after the outputs are checked. The saved
    tensors are released after that too, but in a recomputed block checkpointing's unpack hook
    gave the node the only reference to the normalised tensor, gone as the node returns. Then
    ``x * rsqrt(var)``, which leaves x's first gradient (fp32) waiting for the second; ``mean``'s
    backward (``expand`` then ``div``) and ``pow``'s (``grad * (2 * x.pow(1))``: three more)
    make four fp32 tensors on top of it. By then the incoming gradient, the normalised tensor
    the weight product saved (16-bit in Llama's norm, fp32 in Gemma's) and the fp32 ``rsqrt``
    statistics are freed; ``x.to(float32)`` stays saved until ``pow``'s backward ends. Vectors
    of ``width`` (the weight's gradient) are left out."""
    n = rows * width
    plus_one = _m(arch).norm_plus_one
    normed = FP32_BYTES if plus_one else in_bytes
    statistics = 5 * FP32_BYTES * n - in_bytes * n - normed * n - FP32_BYTES * rows
    if weight_done:
        return statistics
    cast = (FP32_BYTES - in_bytes) * n if plus_one else 0  # the fp32 copy, the 16-bit one freed
    product = FP32_BYTES if plus_one else in_bytes
    weight = cast + 2 * product * n + reduction_scratch(width, rows)
    if recomputed:
        weight -= normed * n
    return max(statistics, weight)


def _recomputed(batch: Batch) -> bool:
    """Whether every decoder layer is recomputed in backward (non-reentrant checkpointing)."""
    return (
        batch.activation_checkpointing is Checkpointing.FULL
        and batch.checkpoint_every_n_layers == 1
    )


def final_norm_backward(arch: Architecture, batch: Batch, weight_done: bool = False) -> int:
    """With 16-bit parameters (the module cast, as DeepSpeed does): what the final norm's
    backward adds at its largest to the instant the head's weight gradient exists (``weight_done``:
    after the norm's weight gradient is accumulated, :func:`_norm_backward`).

    At that instant the loss's saved log-softmax output and, with soft-capping, ``tanh``'s
    output are freed, and the gradient of the head's input stands in for the head's saved input
    (the norm's output); it is the gradient entering the norm (:func:`_norm_backward`)."""
    return _norm_backward(arch, batch.tokens, arch.hidden, HALF_BYTES, weight_done=weight_done)


def final_norm_held(arch: Architecture, batch: Batch, regime: str) -> int:
    """What the final norm holds at its largest in backward, the head's backward done (0: not
    a transformers model): what it saved, its output's gradient (the residual stream's dtype:
    under autocast the head's bf16 input gradient is cast back) and :func:`_norm_backward`. The
    loss's and the head's saved tensors are freed by then; the whole model's activations are
    still saved below it."""
    if arch.modelling is None:
        return 0
    res = dtypes(regime).res
    t, h = batch.tokens, arch.hidden
    return _norm_internal(arch, t, h, res) + res * t * h + _norm_backward(arch, t, h, res)


def layer_backward(
    arch: Architecture,
    batch: Batch,
    dense: bool,
    moved: bool = False,
    moved_by_norms: bool | None = None,
) -> int:
    """With 16-bit parameters: what a layer's backward holds at its largest beyond its saved
    tensors and the gradient entering it (``dense``: a dense-MLP layer, else an experts layer;
    ``moved``: a gradient hook takes each weight gradient away as soon as it is accumulated, as
    DeepSpeed's stage 2 and 3 hooks do; ``moved_by_norms``: the MLP's weight gradients are gone
    by the norms' backward, by default as ``moved`` says: stage 3 reduces a leaf module's
    gradients together once its input's gradient exists).

    - Dense MLP ``down(act(gate) * up)``: ``down``'s backward writes its input's gradient and
      frees that saved input, the product's backward writes both factors' gradients: two
      ``tokens × ffn`` tensors beyond the saved layer (Phi-3's fused ``gate_up_proj`` the same,
      its ``chunk`` backward concatenating them once the activation's input is freed).
    - Experts (``integrations/moe.py`` ``grouped_mm_experts_forward``): the output is the sum
      over the top-k rows of ``proj_out * routing_weight``, reordered by ``inv_perm``; the sum's
      backward materialises a ``tokens·k × hidden`` gradient, the reorder's backward
      (``new_zeros`` + ``index_put``) another, then the product's backward writes both factors'
      gradients in the promoted dtype and casts the experts' one back: three ``tokens·k ×
      hidden`` tensors in the product's dtype (fp32 with fp32 routing weights) and one in the
      experts' dtype. Then the gated product's backward: ``down``'s input gradient and both
      factors' (``tokens·k × ffn`` each) less ``down``'s freed input and the freed ``proj_out``,
      with ``down_proj``'s weight gradient; and the gate/up ``grouped_mm`` writing its input's
      gradient with both experts' weight gradients alive (:func:`experts_backward`); with
      ``moved``, ``down_proj``'s is gone by then. A shared expert's backward may run first and
      free what it saved; that is not subtracted (errs high by at most those bytes). A gated
      shared expert's output gradient waits through the routed experts' backward.
    - Sandwich norms (Gemma-2/3): the post-feedforward norm's backward runs first, with the whole
      layer saved (:func:`_norm_backward`), on the gradient entering the layer, which the
      residual stream keeps.
    - An eager attention's backward (:func:`eager_attention_backward`).
    - The norms between MLP and attention, the MLP's weight gradients made (:func:`norms_backward`,
      16-bit where no hook has moved them).
    - Where no hook moves a gradient: ``down``'s weight gradient beside the dense MLP's, and the
      input norm's backward at the layer's end (:func:`input_norm_backward`), every weight
      gradient of the layer made and, of what the layer saved, only that norm's left.
    """
    t, h = batch.tokens, arch.hidden
    m = _m(arch)
    x = HALF_BYTES
    kept = 0 if (moved if moved_by_norms is None else moved_by_norms) else x
    candidates = []
    if dense or arch.num_experts <= 1:
        candidates.append(dense_layer_backward(arch, batch, "half", kept=not moved))
    else:
        # the weighted product's backward; further down the gated product's (down's input
        # gradient and both factors', down's saved input and the weighted product's saved
        # proj_out freed; down_proj's weight gradient written), then the gate/up grouped_mm
        # with both experts' weight gradients at once
        down = 0 if moved else x
        candidates.append(experts_product_backward(arch, batch, "half", down))
        candidates.append(experts_backward(arch, batch, "half", down))
        if m.shared_expert_ffn:
            candidates.append(2 * x * t * m.shared_expert_ffn)
    candidates.append(_post_feedforward_norm_backward(arch, batch, "half"))
    candidates.append(eager_attention_backward(arch, batch, "half"))
    candidates.append(norms_backward(arch, batch, "half", kept, dense))
    if kept:
        weights = _layer_weight_elements(arch, dense) - _mlp_linear_elements(arch, dense)
        weights += _mlp_weight_elements(arch, dense)
        saved = _total(layer_terms(arch, batch, "half", False, masked=batch.padded, dense=dense))
        # input_norm_backward counts the gradient entering the layer as the residual stream's
        end = input_norm_backward(arch, batch, "half") - x * t * h
        candidates.append(end + kept * weights - saved)
    return max(candidates)


def _post_feedforward_norm_backward(arch: Architecture, batch: Batch, regime: str) -> int:
    """Gemma-2/3's post-feedforward norm's backward, the first of a layer's (0: no sandwich
    norms): :func:`_norm_backward` on its output's gradient, which is the gradient entering the
    layer: the residual stream keeps it, so the norm's backward does not free it."""
    if not _m(arch).sandwich_norms:
        return 0
    d = dtypes(regime)
    t, h = batch.tokens, arch.hidden
    return d.res * t * h + _norm_backward(arch, t, h, d.lin, _recomputed(batch))


def dense_layer_backward(arch: Architecture, batch: Batch, regime: str, kept: bool = True) -> int:
    """What a dense layer's first backward ops hold at their largest beyond its saved tensors
    and the gradient entering it, with ``down_proj``'s weight gradient kept where autograd makes
    it (``kept``: FSDP2 keeps a block's unsharded gradients until its post-backward; not where a
    DeepSpeed hook moves each away): ``down``'s backward writes its input's gradient and weight
    gradient and frees that saved input, then the product's backward writes both factors'
    gradients (:func:`layer_backward`'s dense MLP); Gemma-2/3's post-feedforward norm's backward
    runs before it (:func:`_post_feedforward_norm_backward`). 0 for a model without dense
    layers.

    With biases on the MLP (Llama's ``mlp_bias``) autograd sums each bias's gradient over the
    tokens (``validate_outputs``: ``sum_to``), the reduction kernel staging its partial sums in
    a buffer sized by its launch configuration
    (:func:`calculators.reduction_scratch.reduction_scratch`), while the node's outputs are
    alive: ``down``'s beside its input's and weight's gradients, its saved input not yet freed;
    ``up``'s (the engine runs it before the activation's backward: it was made later) beside
    its input's and weight's gradients and both factors' gradients, which stand in for the
    freed factors, the product's gradient gone."""
    if arch.modelling is None or (arch.num_experts > 1 and dense_layers(arch) == 0):
        return 0
    x = dtypes(regime).lin
    t, h = batch.tokens, arch.hidden
    m = _m(arch)
    f = (m.dense_ffn or arch.ffn) if arch.num_experts > 1 else arch.ffn
    down = x * f * h if kept else 0
    mlp = 2 * x * t * f + down
    if arch.bias:
        # a weight's gradient is the node's output: alive while the bias is summed, moved or not
        mlp = max(
            mlp,
            x * t * f + x * f * h + reduction_scratch(h, t),
            x * t * h - x * t * f + x * f * h + down + reduction_scratch(f, t),
        )
    return max(mlp, _post_feedforward_norm_backward(arch, batch, regime))


def _mlp_linear_elements(arch: Architecture, dense: bool) -> int:
    """Elements of one layer's MLP ``nn.Linear`` weights: the gated MLP's three, or the router
    and a shared expert with its gate (the experts' 3-D weights are no ``nn.Linear``)."""
    h = arch.hidden
    if dense:
        f = (_m(arch).dense_ffn or arch.ffn) if arch.num_experts > 1 else arch.ffn
        return 3 * h * f
    m = _m(arch)
    elements = arch.num_experts * h  # router
    if m.shared_expert_ffn:
        elements += 3 * h * m.shared_expert_ffn + (h if m.shared_expert_gate else 0)
    return elements


def _mlp_weight_elements(arch: Architecture, dense: bool) -> int:
    """Elements of one layer's MLP weights: its linears, and an experts layer's 3-D weights."""
    experts = 0 if dense else arch.num_experts * 3 * arch.ffn * arch.hidden
    return _mlp_linear_elements(arch, dense) + experts


def norms_backward(
    arch: Architecture, batch: Batch, regime: str, grad_bytes: int, dense: bool | None = None
) -> int:
    """What the norms between a layer's MLP and its attention hold at their largest in backward,
    beyond the layer's saved tensors and the gradient entering the layer (0: not a transformers
    model). ``grad_bytes``: bytes per element of the MLP's weight gradients, alive by then where
    autograd keeps them (FSDP2's unsharded gradients, DDP's ``param.grad``; 0: none kept).

    By the pre-MLP norm's backward (Llama's ``post_attention_layernorm``, Gemma-2/3's
    ``pre_feedforward_layernorm``) the MLP has run backward: what it saved is freed (and what
    Gemma-2/3's post-feedforward norm saved), its weight gradients made, and the gradient of the
    norm's output (residual-stream dtype) arrives; the norm's backward then holds
    :func:`_norm_backward` more. Gemma-2/3's post-attention norm follows, the pre-feedforward
    norm's saved tensors freed, on its 16-bit output's gradient. With the MLP narrower than the
    hidden size or in 16-bit training, where the norm's fp32 temporaries outweigh the MLP's
    gradients, this is a layer's largest backward moment. ``dense``: a layer of that kind
    (DeepSeek's first layers are dense); by default the largest of the model's kinds."""
    if arch.modelling is None:
        return 0
    d = dtypes(regime)
    t, h = batch.tokens, arch.hidden
    m = _m(arch)
    kinds = {start < dense_layers(arch) for start, _ in block_kinds(arch)}
    again = _recomputed(batch)
    best = 0
    for kind in kinds if dense is None else {dense}:
        terms = layer_terms(arch, batch, regime, use_cache=False, masked=batch.padded, dense=kind)
        held = grad_bytes * _mlp_weight_elements(arch, kind)
        held -= terms.mlp + _mlp_inputs(arch, d, t, kind)
        if m.sandwich_norms:
            held -= _norm_internal(arch, t, h, d.lin)  # the post-feedforward norm ran first
        best = max(best, held + d.res * t * h + _norm_backward(arch, t, h, d.res, again))
        if m.sandwich_norms:
            held -= _norm_internal(arch, t, h, d.res)
            best = max(best, held + d.lin * t * h + _norm_backward(arch, t, h, d.lin, again))
    return best


def input_norm_backward(arch: Architecture, batch: Batch, regime: str) -> int:
    """The end of a layer's backward, its input norm's (0: not a transformers model): of the
    layer only what that norm saved is left, the gradient through the residual stream waits for
    the norm's input gradient to be added to it, the norm's output gradient arrives (both in the
    residual stream's dtype) and the norm's backward holds :func:`_norm_backward` more. The
    layer's weight gradients are left to the engine."""
    if arch.modelling is None:
        return 0
    d = dtypes(regime)
    t, h = batch.tokens, arch.hidden
    backward = _norm_backward(arch, t, h, d.res, _recomputed(batch))
    return _norm_internal(arch, t, h, d.res) + 2 * d.res * t * h + backward


def eager_attention_backward(arch: Architecture, batch: Batch, regime: str) -> int:
    """What a layer's eager attention backward holds at its largest beyond the layer's saved
    tensors and the gradient entering the layer (0: SDPA's fused kernels; the memory-efficient
    one's is :func:`efficient_attention_backward`).

    By then the layer's MLP, its input norm (and Gemma-2/3's post-feedforward and post-attention
    norms) have run backward and freed what they saved. With ``S`` = b·heads·s² scores: the
    second ``bmm``'s backward writes the probabilities' gradient (``S`` in q's dtype) and frees
    the 16-bit probabilities it saved; the cast's backward writes it in fp32; ``softmax``'s
    backward then writes an fp32 input gradient beside it while the fp32 probabilities are
    still saved (the 16-bit scores were converted to fp32 before ``_softmax``, so its gradient is
    fp32 too), and CUDA's kernel holds one more fp32 tensor of that size while it runs
    (``bench/gpu/eager_backward_probe.py``: 4·S bytes more during ``_softmax_backward_data``
    than after it, at s = 512, 1,024 and 2,048 on an H200). That is 12·S bytes written, less the
    2·S of the freed 16-bit copy, in 16-bit (and under autocast, whose cast for the matmul is
    that copy); in fp32 the probabilities are one tensor, freed only after ``softmax``'s
    backward: 12·S. Dropout's backward writes the gradient of its input and frees its own
    input gradient and its boolean mask; in fp32 its output, which the second ``bmm`` saved, is
    freed by that ``bmm``'s backward. Soft-capping frees more than it writes before that point.
    ``o_proj``'s backward has freed the output copy it saved and the second ``bmm``'s the v it
    saved, whose gradient (expanded to every head) is alive beside them (a live-storage count
    of the step on the CPU, under autocast with checkpointing, holds these and no more).

    SDPA's math path (fp32 over grouped key/value heads without a mask, :func:`layer_terms`) runs
    the same ops, its probabilities fp32: its backward holds what an fp32 eager attention's does
    (a layer without a mask is enough: the largest layer decides)."""
    m = _m(arch)
    # a layer without a mask: none under padding, nor where every layer's window is reached
    unmasked = not batch.padded and _windowed_layers(arch, batch) < arch.layers
    math = m.latent_attention is None and _sdpa_math_path(arch, regime, masked=not unmasked)
    if not m.eager_attention and not math:
        return 0
    d = dtypes(regime)
    sdpa = HALF_BYTES if regime != "fp32" else FP32_BYTES
    t = batch.tokens
    scores = batch.micro_batch_size * arch.heads * batch.seq_len * batch.seq_len
    grads = (10 if sdpa == HALF_BYTES else 12) * scores
    mla = m.latent_attention
    width = arch.heads * mla.v_head_dim if mla is not None else arch.q_dim
    grads += sdpa * t * width  # v's gradient, every head's
    # o_proj's backward freed its input (the output copy), the second bmm's the v it saved
    freed = _freed_before_attention(arch, batch, regime) + sdpa * t * width
    if m.attention_dropout:
        # dropout's backward freed its mask; in fp32 its output, which the second bmm saved, is
        # a tensor of its own, freed by that bmm's backward (in 16 bits it stands in for the
        # freed copy above)
        freed += BOOL_BYTES * scores + (FP32_BYTES * scores if sdpa == FP32_BYTES else 0)
    if mla is not None:
        one = batch.micro_batch_size == 1  # v a view of kv_b_proj's output, kept whole
        nope = mla.qk_nope_head_dim
        freed += d.lin * t * arch.heads * (nope + mla.v_head_dim) if one else sdpa * t * width
    else:
        # with one key/value head and one sequence bmm saved a view of v (layer_terms) unless
        # autocast cast the cache's fp32 copy of it
        checkpointed = batch.activation_checkpointing is Checkpointing.FULL
        cast = d.autocast and m.use_cache and not checkpointed
        if not (arch.n_kv_heads == 1 and batch.micro_batch_size == 1 and not cast):
            grouped = arch.n_kv_heads != arch.heads
            freed += sdpa * t * (arch.q_dim if grouped else arch.kv_dim)
    return max(grads - freed, 0)


def _freed_before_attention(arch: Architecture, batch: Batch, regime: str) -> int:
    """What a layer's backward has freed when it reaches its attention core: what the MLP (or
    the experts) and the norms after the attention saved (the largest layer's kind)."""
    d = dtypes(regime)
    t = batch.tokens
    dense = dense_layers(arch) >= arch.layers or arch.num_experts <= 1
    terms = layer_terms(arch, batch, regime, use_cache=False, masked=batch.padded, dense=dense)
    freed = terms.mlp + _mlp_inputs(arch, d, t, dense)
    return freed + (3 if _m(arch).sandwich_norms else 1) * _norm_internal(
        arch, t, arch.hidden, d.res
    )


def efficient_backward_workspace(batch: Batch, heads: int, qk_width: int, v_width: int) -> int:
    """The workspace the memory-efficient kernel's fp32 backward allocates (none for dK and dV,
    whose fp32 outputs are their own accumulators): per batch and head, one ``GradQTempStorage``
    (a 16-byte lock, counter and pad, then a kBlockSizeI × kBlockSizeJ fp32 tile) per
    kBlockSizeI queries and kBlockSizeJ columns of q's width (``kernel_backward.h``,
    ``workspace_elements_gq``). ``attention_backward.cu`` launches the first fp32 kernel whose
    kMaxK takes the widest head: 64 × 64 tiles up to 64, 128 × 64 up to 128 (sm80 and
    later), 64 × 64 beyond."""
    widest = max(qk_width, v_width)
    block_i, block_j = (128, 64) if 64 < widest <= 128 else (64, 64)
    tiles = -(-batch.seq_len // block_i) * -(-qk_width // block_j)
    per_head = tiles * (16 + FP32_BYTES * block_i * block_j)
    return batch.micro_batch_size * heads * per_head


def efficient_attention_backward(arch: Architecture, batch: Batch, regime: str) -> int:
    """What a layer's SDPA backward holds in the memory-efficient kernel beyond the layer's
    saved tensors and the gradient entering the layer (0 where another kernel runs: the
    figures take it in fp32, on a layer with a mask or with a key/value head per query head;
    flash and cuDNN run the 16-bit layers).

    ``_efficient_attention_backward`` writes fp32 gradients of q, k and v as SDPA took them
    (grouped heads expanded by ``repeat_kv`` under a mask), then ``delta`` (b·heads·s fp32)
    and its workspace (:func:`efficient_backward_workspace`), beside the gradient of its output
    (o_proj's input gradient). o_proj's saved input stays: the kernel writes its output
    (b, s, heads, d), so ``transpose(1, 2).contiguous()`` returns that same tensor, which SDPA
    saved too. By then the MLP and the norms after the attention have run backward and freed
    what they saved."""
    m = _m(arch)
    if arch.modelling is None or m.eager_attention or regime != "fp32":
        return 0
    if _sdpa_math_path(arch, regime, _some_layer_masked(arch, batch)):
        return 0  # eager_attention_backward counts it
    mla = m.latent_attention
    t, heads = batch.tokens, arch.heads
    if mla is not None:
        qk, v = mla.qk_head_dim, mla.v_head_dim
    else:
        qk = v = arch.d_head
    written = FP32_BYTES * t * heads * (2 * qk + 2 * v)  # dq, dk, dv, the output's gradient
    written += FP32_BYTES * batch.micro_batch_size * heads * batch.seq_len  # delta
    written += efficient_backward_workspace(batch, heads, qk, v)
    return max(written - _freed_before_attention(arch, batch, regime), 0)


def attention_core_backward(arch: Architecture, batch: Batch, regime: str) -> int:
    """A layer's attention core in backward: an eager attention's (or SDPA's math path's,
    :func:`eager_attention_backward`), else the memory-efficient kernel's
    (:func:`efficient_attention_backward`); 0 for the other fused kernels or no transformers
    model."""
    if arch.modelling is None:
        return 0
    return eager_attention_backward(arch, batch, regime) or efficient_attention_backward(
        arch, batch, regime
    )


def first_layer_backward(arch: Architecture, batch: Batch, moved: bool = False) -> int:
    """:func:`layer_backward` of the first layer (DeepSeek's first layers are dense)."""
    return layer_backward(arch, batch, dense_layers(arch) > 0, moved)


def last_layer_backward(
    arch: Architecture, batch: Batch, moved: bool = False, moved_by_norms: bool | None = None
) -> int:
    """With 16-bit parameters: bytes above the same instant as :func:`final_norm_backward` at
    the largest point of the last layer's first backward ops (:func:`layer_backward`; its saved
    tensors alive, or recomputed under checkpointing), net of what the final norm saved, freed
    by then (the norm's input gradient stands in for the head's input gradient)."""
    dense = dense_layers(arch) >= arch.layers
    return layer_backward(arch, batch, dense, moved, moved_by_norms) - _norm_internal(
        arch, batch.tokens, arch.hidden, HALF_BYTES
    )


def _total(terms: LayerTerms) -> int:
    return terms.norms + terms.linear_inputs + terms.attention + terms.mlp


@dataclass(frozen=True)
class ModelTerms:
    """What one micro-batch keeps at the end of forward, by place."""

    per_layer: LayerTerms
    per_layer_total: int
    layers: int
    recompute: int
    embedding: int
    head: int
    logits: int
    loss: int
    loss_transient: int
    cache: int
    cache_only: int


def model_terms(arch: Architecture, batch: Batch, regime: str) -> ModelTerms:
    d = dtypes(regime)
    t, b, s = batch.tokens, batch.micro_batch_size, batch.seq_len
    h, v = arch.hidden, arch.vocab_size
    checkpointed = batch.activation_checkpointing is Checkpointing.FULL
    use_cache = _m(arch).use_cache and not checkpointed
    m = _m(arch)
    # layers whose SDPA takes a mask: every layer of a padded batch, else the sliding-window
    # layers whose window the sequence reaches
    windowed = _windowed_layers(arch, batch)
    masked = arch.layers if batch.padded else windowed
    dense = dense_layers(arch)
    # (dense?, layers) of each kind: DeepSeek's dense layers, then its MoE layers
    kinds = [(start < dense, n) for start, n in block_kinds(arch)]
    per_layer = layer_terms(arch, batch, regime, use_cache, masked=batch.padded, dense=kinds[-1][0])
    total = _total(per_layer)
    # cos and sin (batch dim 1: position_ids is arange(s)[None]), once per rotary embedding;
    # saved by the rotation, or kept as every checkpointed call's argument
    rotates = m.nope_layers < arch.layers or checkpointed
    rotary = 2 * d.res * s * (m.rotary_dim or arch.d_head) * m.rope_kinds if rotates else 0
    embedding = INDEX_BYTES * t + rotary
    if checkpointed:
        # each checkpointed call keeps its hidden_states argument; position_ids ride along,
        # and so does the boolean sliding-window mask every windowed layer shares (one
        # (1, 1, s, s) storage, expanded over the batch), alive until the first layer's
        # backward is done (a bf16 CPU run frees it a few ops before the embedding's backward)
        layers = arch.layers * d.res * t * h
        embedding += INDEX_BYTES * s + _checkpointed_masks(arch, batch, bool(windowed), d)
        # the layers with a mask and those without, each kind that is there
        masks = {mask for mask, n in ((True, masked), (False, arch.layers - masked)) if n}
        recompute_total = max(
            _total(layer_terms(arch, batch, regime, False, masked=mask, dense=kind))
            for kind, _ in kinds
            for mask in masks
        )
        if d.res == FP32_BYTES:
            # the recomputed input norm's x.to(float32) is the fp32 block input itself, which
            # the checkpoint already keeps (counted in ``layers``)
            recompute_total -= d.res * t * h
    elif batch.padded:
        layers = sum(
            n * _total(layer_terms(arch, batch, regime, use_cache, masked=True, dense=kind))
            for kind, n in kinds
        )
        layers += _unrotated(arch, batch, regime, use_cache, m.nope_layers, masked=True)
        recompute_total = 0
    else:
        # sliding-window and NoPE layers exist only in families whose layers are all of one kind
        masked_total = _total(layer_terms(arch, batch, regime, use_cache, masked=True))
        layers = masked * masked_total - masked * total
        for kind, n in kinds:
            layers += n * _total(layer_terms(arch, batch, regime, use_cache, dense=kind))
        nope_masked = m.nope_sliding_layers if windowed else 0
        layers += _unrotated(arch, batch, regime, use_cache, nope_masked, masked=True)
        layers += _unrotated(arch, batch, regime, use_cache, m.nope_layers - nope_masked)
        recompute_total = 0
    head = _norm_internal(arch, t, h, d.res) + _norm_output(d, t, h, 1)
    logits = d.lin * t * v
    if _m(arch).final_logit_softcap:
        head += d.lin * t * v  # tanh(logits / cap) saved by tanh's backward
    labels = INDEX_BYTES * (s + 1) if b == 1 else INDEX_BYTES * t
    loss = FP32_BYTES * t * v + labels + FP32_BYTES  # log_softmax output, targets, total_weight
    loss_transient = FP32_BYTES * t * v if d.lin != FP32_BYTES else 0
    cache, cache_only = _cache(arch, t, d, regime, masked, b == 1) if use_cache else (0, 0)
    return ModelTerms(
        per_layer=per_layer,
        per_layer_total=total,
        layers=layers,
        recompute=recompute_total,
        embedding=embedding,
        head=head,
        logits=logits,
        loss=loss,
        loss_transient=loss_transient,
        cache=cache,
        cache_only=cache_only,
    )


def _windowed_layers(arch: Architecture, batch: Batch) -> int:
    """The sliding-window layers whose window the batch's sequence reaches (their SDPA then
    takes a mask)."""
    m = _m(arch)
    window = m.sliding_window
    return m.sliding_layers if window is not None and batch.seq_len >= window else 0


def plain_layers(arch: Architecture, batch: Batch, regime: str) -> list[int]:
    """What each decoder layer keeps for backward when ``every_n_layers`` leaves it unchecked:
    all it saves, with the key/value cache off (the model's ``gradient_checkpointing`` flag is
    set, so transformers drops ``use_cache`` in training). Layers differ by their MLP (DeepSeek's
    dense first layers), their attention (a sliding-window layer whose window the sequence
    reaches takes a mask; a padded batch masks every layer) and their rotary embedding
    (SmolLM3's NoPE layers)."""
    m = _m(arch)
    reached = m.sliding_window is not None and batch.seq_len >= m.sliding_window
    dense = dense_layers(arch)
    kept: dict[tuple[bool, bool, bool], int] = {}
    out = []
    for i, (sliding, rotated) in enumerate(_layer_pattern(arch)):
        kind = (batch.padded or (sliding and reached), i < dense, rotated)
        if kind not in kept:
            masked, is_dense, _ = kind
            terms = layer_terms(arch, batch, regime, False, masked, is_dense, rotated)
            kept[kind] = _total(terms)
        out.append(kept[kind])
    return out


def final_norm_forward(arch: Architecture, batch: Batch, regime: str) -> int:
    """What the final norm holds at its last op in forward (0: not a transformers model): the
    last block's output (its input), which the decoder's loop variable keeps until the norm
    returns, what it saves (:func:`_norm_internal`), and its output; in 16-bit also the fp32
    tensor its last op reads, a local nothing saves (Llama's ``hidden_states * rsqrt(...)``
    before ``.to(input_dtype)``, Gemma's fp32 product before ``type_as``). In fp32 (and under
    autocast, whose residual stream is fp32) ``to(float32)`` and the last cast return their
    input: the input is the saved ``x`` and that local the saved or returned tensor."""
    if arch.modelling is None:
        return 0
    d = dtypes(regime)
    t, h = batch.tokens, arch.hidden
    held = _norm_internal(arch, t, h, d.res) + d.res * t * h
    if d.res != FP32_BYTES:
        held += d.res * t * h + FP32_BYTES * t * h
    return held


def final_hidden_state(arch: Architecture, batch: Batch, regime: str) -> int:
    """Bytes of the final norm's output that nothing saved shares: the model's output object
    (``outputs.last_hidden_state``) holds it while ``XForCausalLM.forward`` computes the loss from
    ``labels``. Under autocast it is fp32 and the head saves its bf16 cast instead; in 16-bit or
    fp32 the head saves the tensor itself (counted in ``head``)."""
    return FP32_BYTES * batch.tokens * arch.hidden if regime == "autocast" else 0


def _layer_pattern(arch: Architecture) -> tuple[tuple[bool, bool], ...]:
    """Each layer's ``(attends through the sliding window, rotates q and k)``."""
    m = _m(arch)
    alike = (m.sliding_layers == arch.layers, m.nope_layers == 0)
    return m.layer_pattern or (alike,) * arch.layers


def _unrotated(
    arch: Architecture, batch: Batch, regime: str, use_cache: bool, n: int, masked: bool = False
) -> int:
    """What ``n`` layers that rotate nothing save beyond the same layers rotating
    (``layer_terms``' ``rotated``; 0 or less)."""
    if not n:
        return 0
    plain = layer_terms(arch, batch, regime, use_cache, masked=masked, rotated=False)
    return n * (_total(plain) - _total(layer_terms(arch, batch, regime, use_cache, masked=masked)))


def _checkpointed_masks(arch: Architecture, batch: Batch, windowed: bool, d: Dtypes) -> int:
    """The masks every checkpointed call keeps as an argument, alive until the first layer's
    backward is done. For SDPA they are boolean: the sliding-window mask of an unpadded batch is
    one (1, 1, s, s) storage expanded over the batch; a padded batch's masks are (b, 1, s, s),
    one for the full layers and one for the sliding-window layers (``create_causal_mask`` and
    ``create_sliding_window_causal_mask`` each build their own). Eager attention always takes a
    mask: (b, 1, s, s) additive floats in the residual dtype (``eager_mask``), one per kind."""
    m = _m(arch)
    s = batch.seq_len
    # the kinds of layer (sliding-window or full) among the checkpointed ones: only their
    # masks are arguments (with every_n_layers the others' die after forward)
    held = {sliding for sliding, _ in _layer_pattern(arch)[:: batch.checkpoint_every_n_layers]}
    kinds = len(held)
    if m.eager_attention:
        return kinds * d.res * batch.micro_batch_size * s * s
    if not batch.padded:
        return BOOL_BYTES * s * s if windowed and True in held else 0
    return kinds * BOOL_BYTES * batch.micro_batch_size * s * s


def _cache(
    arch: Architecture, t: int, d: Dtypes, regime: str, masked: int, one_sequence: bool
) -> tuple[int, int]:
    """(the ``DynamicCache``'s bytes, the part nothing saved for backward shares).

    ``cache_utils.py`` ``DynamicLayer.update``: torch.cat copies of the rotated k and of v per
    layer, held by the output's past_key_values. SDPA saves the same copies, except under
    autocast: the rotated k is fp32, the cache allocates v in k's dtype (cat promotes), and
    SDPA saves bf16 casts of both; in fp32 with GQA SDPA saves expanded copies instead. A
    layer that rotates nothing (SmolLM3's NoPE layers) caches its bf16 projections under
    autocast, which SDPA saves as they are: such layers follow the 16-bit regime.
    DeepSeek caches the normed latent (which ``kv_b_proj`` then reads, saving the cache's
    copy; under autocast a bf16 cast of it) and the rotary key (copied into every head's k).
    """
    mla = _m(arch).latent_attention
    if mla is not None:
        cache = arch.layers * d.res * t * (mla.kv_lora_rank + mla.qk_rope_head_dim)
        if d.autocast:
            return cache, cache
        return cache, arch.layers * d.res * t * mla.qk_rope_head_dim
    nope = _m(arch).nope_layers if d.autocast else 0
    if not nope:
        return _layers_cache(arch, t, d, regime, arch.layers, masked, one_sequence)
    # ``masked`` is every layer (a padded batch), the sliding layers, or none
    nope_masked = nope if masked == arch.layers else _m(arch).nope_sliding_layers if masked else 0
    rotated = _layers_cache(
        arch, t, d, regime, arch.layers - nope, masked - nope_masked, one_sequence
    )
    plain = _layers_cache(arch, t, dtypes("half"), "half", nope, nope_masked, one_sequence)
    return rotated[0] + plain[0], rotated[1] + plain[1]


def _layers_cache(
    arch: Architecture, t: int, d: Dtypes, regime: str, layers: int, masked: int, one_sequence: bool
) -> tuple[int, int]:
    """``_cache`` of ``layers`` layers (``masked`` of them masked) whose cached k and v have
    ``d.res`` bytes an element."""
    per_layer_cache = 2 * d.res * t * arch.kv_dim
    cache = layers * per_layer_cache
    if _m(arch).eager_attention:
        # eager's bmm saves the cache's own k and v where every head has its own, or views of
        # them where one key/value head serves one sequence; ``repeat_kv`` copies other
        # grouped ones, autocast casts fp32 ones
        copied = arch.n_kv_heads != arch.heads and not (arch.n_kv_heads == 1 and one_sequence)
        return cache, cache if d.autocast or copied else 0
    expanded = arch.n_kv_heads != arch.heads  # SDPA saves repeat_kv copies instead
    # a windowed layer with one key/value head saves views of its cache (``_mqa_views``)
    viewed = masked * per_layer_cache if _mqa_views(arch, regime, bool(masked)) else 0
    if d.autocast or (regime == "fp32" and expanded):
        return cache, cache - viewed
    if expanded:
        return cache, masked * per_layer_cache - viewed
    return cache, 0


def _layer_weight_elements(arch: Architecture, dense: bool) -> int:
    """Elements of one layer's ``nn.Linear`` / ``F.linear`` weights (the experts' 3-D weights
    go through ``grouped_mm`` instead)."""
    h, q, kv = arch.hidden, arch.q_dim, arch.kv_dim
    m = _m(arch)
    mla = m.latent_attention
    if mla is not None:
        heads, q_lora = arch.heads, mla.q_lora_rank
        q_width = heads * mla.qk_head_dim
        elements = q_width * h if q_lora is None else q_lora * h + q_width * q_lora
        elements += (mla.kv_lora_rank + mla.qk_rope_head_dim) * h
        elements += heads * (mla.qk_nope_head_dim + mla.v_head_dim) * mla.kv_lora_rank
        elements += h * heads * mla.v_head_dim
    else:
        elements = h * (q + 2 * kv) + q * h
    return elements + _mlp_linear_elements(arch, dense)


def autocast_weight_elements(arch: Architecture, checkpointed: bool) -> int:
    """Elements of the bf16 weight copies autocast makes and autograd saves: every
    ``nn.Linear`` / ``F.linear`` weight (the experts' 3-D weights go through ``grouped_mm``,
    which autocast does not cast); only the head's when the layers are checkpointed."""
    head = arch.vocab_size * arch.hidden
    if checkpointed:
        return head
    dense = dense_layers(arch)
    return head + sum(
        n * _layer_weight_elements(arch, start < dense) for start, n in block_kinds(arch)
    )


def weight_copies(arch: Architecture, regime: str, checkpointed: bool) -> int:
    """Bytes of weight copies autograd saves at the end of forward: autocast's bf16 copies, or
    with 16-bit parameters DeepSeek's router weights cast to fp32 (``weight.type(float32)``);
    none from checkpointed layers."""
    if regime == "autocast":
        return HALF_BYTES * autocast_weight_elements(arch, checkpointed)
    if regime == "half" and _m(arch).router_fp32 and not checkpointed:
        return FP32_BYTES * (arch.layers - dense_layers(arch)) * arch.num_experts * arch.hidden
    return 0


def weight_copies_by_layer(arch: Architecture, regime: str) -> list[int]:
    """``weight_copies`` of each layer when it is not checkpointed (``every_n_layers``)."""
    dense = dense_layers(arch)
    if regime == "autocast":
        each = {d: HALF_BYTES * _layer_weight_elements(arch, d) for d in {True, False}}
        return [each[i < dense] for i in range(arch.layers)]
    if regime == "half" and _m(arch).router_fp32:
        router = FP32_BYTES * arch.num_experts * arch.hidden
        return [0 if i < dense else router for i in range(arch.layers)]
    return [0] * arch.layers


def layer_weight_copies(arch: Architecture, regime: str) -> int:
    """``weight_copies`` of the heaviest single layer: what backward makes again for the layer
    it recomputes under checkpointing."""
    dense = dense_layers(arch)
    if regime == "autocast":
        return max(
            HALF_BYTES * _layer_weight_elements(arch, start < dense)
            for start, _ in block_kinds(arch)
        )
    if regime == "half" and _m(arch).router_fp32 and dense < arch.layers:
        return FP32_BYTES * arch.num_experts * arch.hidden
    return 0
