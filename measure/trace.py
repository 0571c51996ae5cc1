"""What autograd saves when transformers' own modelling code trains a model, traced on CPU.

The model is built from a ``config.json`` body with ``AutoModelForCausalLM.from_config`` under
``FakeTensorMode``: parameters and activations carry shapes, dtypes and storages but no data, so
an 8B config traces in seconds on any machine (no GPU, no weights, no download). One forward with
``labels`` runs in the dtype regime of an engine, and every tensor autograd saves
(``torch.autograd.graph.saved_tensors_hooks``) is collected and deduplicated by storage:

- ``half``: 16-bit parameters (FSDP2 ``MixedPrecisionPolicy``, DeepSpeed bf16);
- ``autocast``: fp32 parameters under ``torch.autocast(bfloat16)`` (DDP, ZeroRedundancyOptimizer);
- ``fp32``: everything fp32.

What the trace substitutes for the GPU, and why:

- Attention: ``scaled_dot_product_attention`` has no flash kernel on CPU, so the trace calls the
  op the CUDA dispatcher picks on an H100/H200 (``sdp_utils.cpp``): with 16-bit q/k/v and no
  mask, ``aten::_scaled_dot_product_flash_attention`` (grouped-query heads natively; where
  torch 2.11 picks cuDNN attention instead, it saves the same bytes); with heads of different
  widths (flash wants q, k and v equally wide: DeepSeek's 192-wide q/k and 128-wide v),
  ``aten::_scaled_dot_product_cudnn_attention``, which ``torch._fused_sdp_choice`` picks there
  on an H100 and whose output follows q's layout; with a mask in 16-bit, cuDNN attention too
  (``bench/gpu/sdpa_choice.py --mask`` on an H100: every width from 64 to 256); in fp32 with a
  mask, or where every head has its own key/value head,
  ``aten::_scaled_dot_product_efficient_attention``; in fp32 with
  grouped-query heads and no mask, ``aten::_scaled_dot_product_attention_math`` (the
  memory-efficient kernel takes no ``enable_gqa``; the math path expands k/v itself and saves
  the softmax probabilities).
  Their autograd formulas (``derivatives.yaml``) decide what is saved, exactly as on the GPU.
  Under autocast the q/k/v are cast to bf16 first (SDPA is on CUDA autocast's lower-precision
  list).
- Mixture of experts: routing is data-dependent, but transformers' default experts kernel on
  Hopper (``grouped_mm``, ``integrations/moe.py``) sorts the ``tokens × top_k`` assignments and
  runs one grouped matmul over all of them, so every shape it saves is ``tokens × top_k`` rows
  whatever the routing: the trace runs that same code path with fake routing values.
- Flash attention's RNG state (a 16-byte and an 8-byte tensor per layer) is reported apart.

Transformers' gradient checkpointing (``model.gradient_checkpointing_enable()``, non-reentrant
``torch.utils.checkpoint``) keeps each checkpointed layer's inputs in the checkpoint's closure,
not through saved-tensor hooks: the trace records the tensor arguments of every checkpointed
call as saved, and nothing from inside it.

A decoder layer that repeats an earlier one (the same modules and settings, called with the
same masks and rotary tables) is played from that layer's recipe rather than run
(``measure/layer_repeats.py``): an 8B config traces in about half the time, the same figures.
``traced_regime`` keeps the last ``TRACES_KEPT`` traces for the questions that ask again, and
the fake model of the last ``MODELS_KEPT`` configs and dtypes with its fake mode: a new batch
of a config traced before runs its forward on the same modules (building a 48-layer mixture of
experts costs as much as tracing it), each trace taking the model alone and leaving it as built
(its layer hooks removed, its layers' ``forward`` and checkpointing restored).

Run ``python -m measure.trace config.json --batch 1 --seq 4096 --regime half`` for a summary.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from calculators.batch import Batch, Checkpointing
from measure.layer_repeats import LayerRepeats, Packed, PlayedStorage
from measure.spec import config_values

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from calculators.activations import ActivationBreakdown
    from calculators.architecture import TracedActivations

REGIMES = ("half", "autocast", "fp32")
# sdp_utils.cpp check_head_dim_size_flash: q, k and v heads of one width, at most 256
FLASH_MAX_HEAD_DIM = 256
HALF = torch.bfloat16


def transformers_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class TraceResult:
    """Bytes a traced forward + loss keeps, by kind (all deduplicated by storage).

    Attributes:
        activations: saved activation storages (parameters, autocast weight copies and the
            attention RNG state excluded).
        autocast_weights: bf16 copies of parameters autocast made and autograd saved.
        rng_state: flash/efficient attention's philox seed and offset tensors.
        logits: the model output's logits (held by the caller, not saved).
        loss_transient: tensors alive only inside the loss call (the fp32 logits copy when the
            logits are 16-bit, and the shifted labels when they are a fresh copy).
        cache: bytes of the key/value cache the output holds (``use_cache``).
        cache_only: the part of ``cache`` autograd does not also save.
        by_layer: activation bytes first saved inside decoder layer ``i`` (``-1``: outside).
        tensors: one row per distinct saved storage: (layer, shape, dtype, bytes, grad_fn).
        played_layers: decoder layers played from an earlier one's recipe, not run.
    """

    activations: int = 0
    autocast_weights: int = 0
    rng_state: int = 0
    logits: int = 0
    loss_transient: int = 0
    cache: int = 0
    cache_only: int = 0
    by_layer: dict[int, int] = field(default_factory=dict)
    tensors: list[tuple[int, tuple[int, ...], str, int, str]] = field(default_factory=list)
    played_layers: int = 0


def _config(hf_config: Mapping[str, Any]) -> Any:
    from transformers import AutoConfig

    dropped = ("architectures", "transformers_version", "torch_dtype", "dtype", "auto_map")
    body = {k: v for k, v in hf_config.items() if not k.startswith("_") and k not in dropped}
    return AutoConfig.for_model(body["model_type"], **config_values(body))


def build_model(hf_config: Mapping[str, Any], dtype: torch.dtype) -> PreTrainedModel:
    """The model transformers builds for ``hf_config`` (call inside a fake or meta mode), with
    SDPA attention unless the body's ``attn_implementation`` says ``eager``."""
    from transformers import AutoModelForCausalLM

    config = _config(hf_config)
    model: PreTrainedModel = AutoModelForCausalLM.from_config(
        config, attn_implementation=hf_config.get("attn_implementation") or "sdpa", dtype=dtype
    )
    if model._can_set_experts_implementation():
        # the default on CUDA (sm80+): one grouped matmul over the sorted assignments
        model.set_experts_implementation("grouped_mm")
    model.train()
    return model


def count_parameters(hf_config: Mapping[str, Any]) -> int:
    """``sum(p.numel())`` over the model transformers builds (on the meta device)."""
    with torch.device("meta"):
        model = build_model(hf_config, torch.float32)
    return sum(p.numel() for p in model.parameters())


def _gpu_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """The SDPA kernel CUDA picks on Hopper, called on fake tensors (see the module doc)."""
    if torch.is_autocast_enabled("cpu"):
        dt = torch.get_autocast_dtype("cpu")
        query, key, value = query.to(dt), key.to(dt), value.to(dt)
    with torch.autocast("cpu", enabled=False):
        same_dims = query.shape[-1] == key.shape[-1] == value.shape[-1] <= FLASH_MAX_HEAD_DIM
        half = query.dtype in (torch.bfloat16, torch.float16)
        if attn_mask is None and half and same_dims:
            # flash attention: grouped-query heads without expanding k/v
            flash: torch.Tensor = torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale
            )[0]
            return flash
        bias = attn_mask
        if bias is not None and bias.dtype == torch.bool:
            # sdpa's convert_boolean_attn_mask: a float bias in q's dtype, a whole tensor even
            # where the mask was expanded over the batch
            bias = torch.zeros(bias.shape, dtype=query.dtype).masked_fill(~bias, float("-inf"))
        if half and key.shape[1] == query.shape[1]:
            # heads of different widths (DeepSeek's latent attention), or a mask (k/v expanded
            # by repeat_kv): cuDNN attention, whose output follows q's layout and which saves
            # the bias as it was given
            cudnn: torch.Tensor = torch.ops.aten._scaled_dot_product_cudnn_attention(
                query, key, value, bias, True, dropout_p, is_causal, False, scale=scale
            )[0]
            return cudnn
        if enable_gqa and key.shape[1] != query.shape[1]:
            # the memory-efficient kernel takes no grouped-query heads
            # (sdp_utils.cpp check_batch_size_and_num_heads_dense<false>), flash and cuDNN no
            # fp32: SDPA falls back to its math path, which expands k/v itself
            # (repeat_interleave) and saves the attention probabilities
            if dropout_p > 0:
                return _math_attention(query, key, value, dropout_p, is_causal, scale)
            math: torch.Tensor = torch.ops.aten._scaled_dot_product_attention_math(
                query,
                key,
                value,
                attn_mask,
                dropout_p,
                is_causal,
                None,
                scale=scale,
                enable_gqa=True,
            )[0]
            return math
        if bias is not None:
            # the kernel pads a copy of the bias for itself; autograd saves the one given
            bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        efficient: torch.Tensor = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, True, dropout_p, is_causal, scale=scale
        )[0]
        return efficient


def _math_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """SDPA's math path (``attention.cpp`` ``_scaled_dot_product_attention_math``) with
    dropout, as CUDA runs it: its ``at::dropout`` is the fused ``native_dropout`` there, which
    saves a boolean mask, where the CPU's saves a mask in the probabilities' dtype. Step for
    step the aten op's: q and k each scaled by the square root of the scale, the causal mask a
    float bias added in place, grouped key/value heads expanded by ``repeat_interleave``."""
    factor = (scale if scale is not None else query.shape[-1] ** -0.5) ** 0.5
    q = query * factor
    rep = query.shape[-3] // key.shape[-3]
    k = key.repeat_interleave(rep, -3)
    v = value.repeat_interleave(rep, -3)
    attn = torch.matmul(q, k.transpose(-2, -1) * factor)
    if is_causal:
        rows, cols = query.shape[-2], key.shape[-2]
        causal = torch.ones(rows, cols, dtype=torch.bool).tril()
        attn.add_(torch.zeros(rows, cols, dtype=query.dtype).masked_fill(~causal, float("-inf")))
    attn = torch.ops.aten._safe_softmax(attn, -1)
    attn = torch.native_dropout(attn, dropout_p, True)[0]
    out: torch.Tensor = torch.matmul(attn, v)
    return out


def _gpu_dropout(
    own: Callable[..., torch.Tensor],
    input: torch.Tensor,  # noqa: A002 (torch's parameter name, so keyword calls still bind)
    p: float = 0.5,
    training: bool = True,
    inplace: bool = False,
) -> torch.Tensor:
    """Dropout as CUDA runs it in training: the fused ``native_dropout``, which saves a boolean
    mask (``Dropout.cpp`` ``is_fused_kernel_acceptable``); on CPU ``dropout`` saves a mask in
    the input's dtype instead."""
    if training and 0 < p < 1 and not inplace:
        return torch.native_dropout(input, p, True)[0]
    return own(input, p, training, inplace)


@contextlib.contextmanager
def _gpu_behaviour(padded: bool = False) -> Iterator[None]:
    """Make the fake run take the branches a GPU run takes (see the module doc)."""
    import transformers.integrations.moe as moe
    import transformers.masking_utils as masking

    saved = (
        torch.nn.functional.scaled_dot_product_attention,
        torch.nn.functional.dropout,
        masking.find_packed_sequence_indices,
        masking._ignore_causal_mask_sdpa,
        moe._can_use_grouped_mm,
    )
    torch.nn.functional.scaled_dot_product_attention = _gpu_sdpa
    torch.nn.functional.dropout = functools.partial(_gpu_dropout, saved[1])
    # position ids 0..s-1 are never a packed sequence; a fake tensor cannot show it, so the
    # check would build a mask that the GPU run does not have
    masking.find_packed_sequence_indices = lambda *_, **__: None
    if padded:
        # a mask with a zero in it is never skipped for SDPA's is_causal; the fake mask holds
        # no values to find the zero in
        masking._ignore_causal_mask_sdpa = lambda *_, **__: False
    # torch's grouped_mm takes bf16 only; fp32 experts (autocast) run transformers' own
    # fallback op, which saves the same input and weight
    # (transformers' parameter names, so a keyword call still binds)
    moe._can_use_grouped_mm = lambda input, weight, offs: weight.dtype == torch.bfloat16  # noqa: ARG005
    try:
        yield
    finally:
        (
            torch.nn.functional.scaled_dot_product_attention,
            torch.nn.functional.dropout,
            masking.find_packed_sequence_indices,
            masking._ignore_causal_mask_sdpa,
            moe._can_use_grouped_mm,
        ) = saved


def _static_rotary_frequencies(model: torch.nn.Module) -> None:
    """Run each rotary embedding without its frequency update (``modeling_rope_utils``
    ``dynamic_rope_update``), still under ``torch.no_grad()`` as its forward is decorated.

    LongRoPE (Phi-3.5-mini, Phi-4-mini) and dynamic scaling pick their inverse frequencies
    from ``torch.max(position_ids) + 1``, a branch on tensor data that a fake tensor cannot take.
    Every choice is a buffer of the same shape (``rotary_dim / 2`` frequencies, fp32) and the
    cos/sin it yields have the same shape and dtype, so what autograd saves does not depend on
    it."""
    for module in model.modules():
        own = _rotary_forward(type(module).forward)
        if own is not None:
            module.forward = torch.no_grad()(functools.partial(own, module))


def _rotary_forward(forward: Callable[..., Any]) -> Callable[..., Any] | None:
    """The function ``dynamic_rope_update`` wraps in ``forward``'s decorators, if any."""
    f: Any = forward
    while f is not None:
        code = getattr(f, "__code__", None)
        if code is not None and code.co_qualname.startswith("dynamic_rope_update."):
            return cast(Callable[..., Any], f.__wrapped__)
        f = getattr(f, "__wrapped__", None)
    return None


def _key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _is_weight_copy(t: torch.Tensor) -> bool:
    """A cast (and views) of a parameter: autograd's graph from it reaches AccumulateGrad only
    through view / copy nodes."""
    fn = t.grad_fn
    while fn is not None:
        name = type(fn).__name__
        if name == "AccumulateGrad":
            return True
        if name not in {"ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0"}:
            return False
        fn = fn.next_functions[0][0] if fn.next_functions else None
    return False


MODELS_KEPT = 4


@dataclass
class _Built:
    """A fake model as built, with the fake mode its tensors belong to; one trace at a time."""

    mode: FakeTensorMode
    model: PreTrainedModel
    layers: list[torch.nn.Module]
    param_keys: set[int]
    lock: threading.Lock = field(default_factory=threading.Lock)


@functools.lru_cache(maxsize=MODELS_KEPT)
def _built(body: str, dtype: torch.dtype) -> _Built:
    """The model transformers builds for the config ``body`` under a fake mode of its own."""
    mode = FakeTensorMode()
    with mode:
        model = build_model(json.loads(body), dtype)
        _static_rotary_frequencies(model)
    keys = {_key(p) for p in model.parameters()} | {_key(b) for b in model.buffers()}
    return _Built(mode, model, _decoder_layers(model), keys)


@contextlib.contextmanager
def _restored(built: _Built) -> Iterator[list[torch.utils.hooks.RemovableHandle]]:
    """Leave the model as built after a trace: the hooks it registered (the list yielded)
    removed, each layer's ``forward`` (wrapped to play repeats) and checkpointing undone."""
    forwards = [layer.__dict__.get("forward") for layer in built.layers]
    hooks: list[torch.utils.hooks.RemovableHandle] = []
    try:
        yield hooks
    finally:
        for handle in hooks:
            handle.remove()
        for layer, forward in zip(built.layers, forwards, strict=True):
            if forward is None:
                layer.__dict__.pop("forward", None)
            else:
                layer.forward = forward
        if built.model.is_gradient_checkpointing:
            built.model.gradient_checkpointing_disable()


def trace(
    hf_config: Mapping[str, Any],
    micro_batch_size: int,
    seq_len: int,
    regime: str,
    gradient_checkpointing: bool = False,
    play_repeats: bool = True,
    padded: bool = False,
    every_n_layers: int = 1,
) -> TraceResult:
    """Run one forward + loss from ``labels`` under fake tensors and collect what is saved;
    ``play_repeats``: layers that repeat an earlier one are played from its recipe
    (``measure/layer_repeats.py``), not run; ``padded``: the batch comes with an
    ``attention_mask`` that has padding (a mask of ones with the branches a zero takes);
    ``every_n_layers``: with ``gradient_checkpointing``, only layers 0, n, 2n, ... are
    checkpointed (every layer is then run: the others do not repeat a checkpointed one)."""
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, got {regime!r}")
    param_dtype = HALF if regime == "half" else torch.float32
    result = TraceResult()
    current_layer = [-1]
    # (tensor, layer, grad_fn name, kind) as packed: counted at the end of forward only if the
    # tensor is still alive. A graph branch that dies during forward (DeepSeek's group routing
    # ends in top-k indices, so the tensors its top-k and masked_fill saved die with it) frees
    # what it saved, and the allocator may reuse its storage for a tensor saved later.
    packed: Packed = []

    def record(t: torch.Tensor) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta" and t.numel() == 0:
            return
        packed.append((weakref.ref(t), current_layer[0], type(t.grad_fn).__name__, "", None))

    def pack(t: torch.Tensor) -> torch.Tensor:
        record(t)
        return t

    built = _built(json.dumps(dict(hf_config), sort_keys=True), param_dtype)
    with built.lock, built.mode, _gpu_behaviour(padded), _restored(built) as hooks:
        model, param_keys, layers = built.model, built.param_keys, built.layers
        for i, layer in enumerate(layers):
            hooks.append(
                layer.register_forward_pre_hook(functools.partial(_enter, current_layer, i))
            )
            hooks.append(layer.register_forward_hook(functools.partial(_leave, current_layer)))
        repeats = None
        if play_repeats and every_n_layers == 1:
            repeats = LayerRepeats(
                layers, model.config, packed, functools.partial(_kind, param_keys), own_hooks=2
            )
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(every_n_layers=every_n_layers)
            for layer in layers:
                checkpointed = cast(_CheckpointedLayer, layer)
                checkpointed._gradient_checkpointing_func = _recording_checkpoint(
                    checkpointed._gradient_checkpointing_func, record
                )
        ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
        autocast = torch.autocast("cpu", dtype=HALF, enabled=regime == "autocast")
        loss_inputs: list[torch.Tensor] = []
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            autocast,
            _LossSpy(loss_inputs),
        ):
            mask = torch.ones_like(ids) if padded else None
            out = model(input_ids=ids, attention_mask=mask, labels=ids)
        result.logits = out.logits.untyped_storage().nbytes()
        result.played_layers = repeats.played if repeats is not None else 0
        seen = _count_alive(packed, param_keys, result)
        cached: set[int] = set()
        for layer_cache in getattr(out.past_key_values, "layers", None) or []:
            for t in (layer_cache.keys, layer_cache.values):
                if isinstance(t, torch.Tensor) and _key(t) not in cached:
                    cached.add(_key(t))
                    result.cache += t.untyped_storage().nbytes()
                    if _key(t) not in seen:
                        result.cache_only += t.untyped_storage().nbytes()
        logits_key = _key(out.logits)
        for t in loss_inputs:
            if _key(t) != logits_key and _key(t) not in seen:
                result.loss_transient += t.untyped_storage().nbytes()
    return result


def trace_batch(hf_config: Mapping[str, Any], batch: Batch, regime: str) -> TraceResult:
    """:func:`trace` of a calculators ``Batch``: its sequences and their length, transformers'
    gradient checkpointing (and ``every_n_layers``) where it checkpoints, its padding."""
    return trace(
        hf_config,
        batch.micro_batch_size,
        batch.seq_len,
        regime,
        batch.activation_checkpointing is Checkpointing.FULL,
        padded=batch.padded,
        every_n_layers=batch.checkpoint_every_n_layers,
    )


def _kind(param_keys: set[int], t: torch.Tensor) -> str:
    """What a saved storage is: a parameter or buffer, an RNG state, an autocast weight copy or
    an activation."""
    if _key(t) in param_keys:
        return "param"
    if t.dtype == torch.uint64 or (t.dim() == 0 and t.dtype == torch.int64):
        return "rng"
    if _is_weight_copy(t):
        return "weight"
    return "activation"


def _count_alive(packed: Packed, param_keys: set[int], result: TraceResult) -> set[int]:
    """Add the saved storages still alive to ``result``, once each; their keys."""
    seen: set[int] = set()
    for ref, layer, grad_fn, kind, described in packed:
        t = ref()
        if t is None:
            continue
        if isinstance(t, PlayedStorage):
            # a played layer's storage that nothing else reads (its object's address is unique
            # among the live ones, as a storage's is); its kind comes with it
            key, nbytes = id(t), t.nbytes
        else:
            key, nbytes = _key(t), t.untyped_storage().nbytes()
            kind = kind or _kind(param_keys, t)
        if key in seen or kind == "param":
            continue
        seen.add(key)
        if kind == "rng":
            result.rng_state += nbytes
        elif kind == "weight":
            result.autocast_weights += nbytes
        else:
            result.activations += nbytes
            result.by_layer[layer] = result.by_layer.get(layer, 0) + nbytes
            shape, dtype = described or (tuple(t.shape), t.dtype)  # type: ignore[union-attr]
            result.tensors.append((layer, shape, str(dtype), nbytes, grad_fn))
    return seen


def figures(result: TraceResult) -> tuple[int, ...]:
    """The trace's figures that the analytical model predicts (``predicted_figures``): saved
    bytes, autocast weight copies, logits, the loss's transients, the cache, the cache alone."""
    r = result
    return (r.activations, r.autocast_weights, r.logits, r.loss_transient, r.cache, r.cache_only)


def predicted_figures(acts: ActivationBreakdown) -> tuple[int, ...]:
    """``figures`` as the analytical model has them (the logits are the caller's, not saved)."""
    saved = acts.layers + acts.embedding + acts.head + acts.loss
    return (
        saved,
        acts.autocast_weights,
        acts.logits,
        acts.loss_transient,
        acts.cache,
        acts.cache_only,
    )


TRACES_KEPT = 64
"""Regime traces kept across requests (a few hundred bytes each): a sweep over Nd or stages, or
the same model asked again, reuses them."""


def traced_regime(
    hf_config: Mapping[str, Any],
    micro_batch_size: int,
    seq_len: int,
    regime: str,
    checkpointing: bool,
    padded: bool = False,
) -> TracedActivations:
    """The trace in one regime, as the calculators' ``TracedActivations`` (kept, see
    ``TRACES_KEPT``)."""
    body = json.dumps(hf_config, sort_keys=True)
    return _kept_trace(body, micro_batch_size, seq_len, regime, checkpointing, padded)


@functools.lru_cache(maxsize=TRACES_KEPT)
def _kept_trace(
    body: str, micro_batch_size: int, seq_len: int, regime: str, checkpointing: bool, padded: bool
) -> TracedActivations:
    from calculators.architecture import TracedActivations

    r = trace(json.loads(body), micro_batch_size, seq_len, regime, checkpointing, padded=padded)
    return TracedActivations(
        regime=regime,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len,
        checkpointing=checkpointing,
        padded=padded,
        saved=r.activations,
        autocast_weights=r.autocast_weights,
        logits=r.logits,
        loss_transient=r.loss_transient,
        cache=r.cache,
        cache_only=r.cache_only,
    )


def compare_table(hf_config: Mapping[str, Any], micro_batch_size: int, seq_len: int) -> str:
    """Saved bytes at the end of forward: canonical GPT formula, transformers formula, trace."""
    from dataclasses import replace

    from calculators.activations import Regime, activations
    from calculators.batch import Batch, Checkpointing
    from calculators.hf_config import architecture_from_hf_config

    arch = architecture_from_hf_config(hf_config)
    mib = 2**20
    rows = [
        "| regime | checkpointing | canonical GPT (MiB) | analytical (MiB) | traced (MiB) "
        "| analytical − traced (B) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for regime in REGIMES:
        for full in (False, True):
            policy = Checkpointing.FULL if full else Checkpointing.NONE
            batch = Batch(micro_batch_size, seq_len, policy)
            hf = activations(arch, batch, Regime(regime))
            gpt = activations(replace(arch, modelling=None), batch, Regime(regime))
            r = trace(hf_config, micro_batch_size, seq_len, regime, full)
            # the same moment on both sides: saved tensors + autocast weight copies + the
            # cache no saved tensor shares + the logits
            predicted = hf.end_of_forward + hf.cache_only
            traced = r.activations + r.autocast_weights + r.cache_only + r.logits
            rows.append(
                f"| {regime} | {'full' if full else 'none'} | {gpt.end_of_forward / mib:,.1f} "
                f"| {predicted / mib:,.1f} | {traced / mib:,.1f} | {predicted - traced:,} |"
            )
    return "\n".join(rows) + "\n"


def gpu_check(
    hf_config: Mapping[str, Any],
    micro_batch_size: int,
    seq_len: int,
    regime: str,
    full: bool,
    device_type: str = "cuda",
) -> dict[str, int]:
    """On a CUDA device: the bytes a real forward + loss leaves allocated, against the formula.

    The model is built for real (random init) with transformers' code and trained one warm-up
    step (cuBLAS workspaces, lazy state); then ``torch.cuda.memory_allocated`` is read before
    and after ``out = model(input_ids=ids, labels=ids)``. The difference is everything the
    forward left alive: saved tensors, autocast's weight copies, the key/value cache, the
    logits and the loss (the caching allocator rounds each block up to 512 bytes).
    """
    from calculators.activations import Regime, activations
    from calculators.batch import Batch, Checkpointing
    from calculators.hf_config import architecture_from_hf_config

    device = torch.device(device_type)
    dtype = HALF if regime == "half" else torch.float32
    with device:
        model = build_model(hf_config, dtype)
    if full:
        model.gradient_checkpointing_enable()
    vocab = int(hf_config["vocab_size"])
    ids = torch.randint(0, vocab, (micro_batch_size, seq_len), device=device)

    def step() -> Any:
        with torch.autocast(device_type, dtype=HALF, enabled=regime == "autocast"):
            return model(input_ids=ids, labels=ids)

    out = step()
    out.loss.backward()
    del out
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = step()
    torch.cuda.synchronize()
    measured = torch.cuda.memory_allocated() - before
    policy = Checkpointing.FULL if full else Checkpointing.NONE
    arch = architecture_from_hf_config(hf_config)
    acts = activations(arch, Batch(micro_batch_size, seq_len, policy), Regime(regime))
    # ``out`` holds the logits (in ``end_of_forward``), the loss and the key/value cache
    predicted = acts.end_of_forward + acts.cache_only + FP32_LOSS_BYTES
    del out
    return {"measured": measured, "predicted": predicted}


FP32_LOSS_BYTES = 4  # the loss scalar the output holds


def _enter(current: list[int], i: int, *_: Any) -> None:
    current[0] = i


def _leave(current: list[int], *_: Any) -> None:
    current[0] = -1


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList):
            return list(layers)
    raise ValueError("no decoder layer list found in the model")


class _CheckpointedLayer(Protocol):
    """A decoder layer after ``gradient_checkpointing_enable()``: transformers' checkpoint
    function (GradientCheckpointingLayer) on the instance."""

    _gradient_checkpointing_func: Callable[..., Any]


def _recording_checkpoint(
    checkpoint: Callable[..., Any], record: Callable[[torch.Tensor], None]
) -> Callable[..., Any]:
    """Wrap transformers' checkpoint function: what it keeps are its tensor arguments."""

    def run(function: Any, *args: Any, **kwargs: Any) -> Any:
        for value in [*args, *kwargs.values(), *getattr(function, "keywords", {}).values()]:
            if isinstance(value, torch.Tensor):
                record(value)
            elif isinstance(value, tuple):
                for v in value:
                    if isinstance(v, torch.Tensor):
                        record(v)
        return checkpoint(function, *args, **kwargs)

    return run


class _LossSpy(torch.overrides.TorchFunctionMode):
    """Records the input and target of ``cross_entropy`` (the loss's transients)."""

    def __init__(self, sink: list[torch.Tensor]) -> None:
        super().__init__()
        self.sink = sink

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func is torch.nn.functional.cross_entropy:
            self.sink.extend(a for a in args[:2] if isinstance(a, torch.Tensor))
        return func(*args, **(kwargs or {}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="path to a config.json")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--regime", choices=REGIMES, default="half")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--tensors", action="store_true", help="list every saved storage")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="table of analytical vs traced (every regime, with and without checkpointing)",
    )
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="on CUDA: measured end-of-forward bytes vs the formula, every regime ± checkpointing",
    )
    ns = parser.parse_args(argv)
    with open(ns.config) as f:
        cfg = json.load(f)
    if ns.gpu:
        for regime in REGIMES:
            for full in (False, True):
                try:
                    r = gpu_check(cfg, ns.batch, ns.seq, regime, full)
                except RuntimeError as err:  # e.g. a kernel that refuses fp32 experts
                    sys.stdout.write(f"{regime:8} checkpointing={full}: {err}\n")
                    torch.cuda.empty_cache()
                    continue
                error = (r["predicted"] - r["measured"]) / r["measured"]
                sys.stdout.write(
                    f"{regime:8} checkpointing={'full' if full else 'none':4} "
                    f"measured {r['measured']:>15,} B predicted {r['predicted']:>15,} B "
                    f"({error:+.3%})\n"
                )
                torch.cuda.empty_cache()
        return 0
    if ns.compare:
        sys.stdout.write(compare_table(cfg, ns.batch, ns.seq))
        return 0
    result = trace(cfg, ns.batch, ns.seq, ns.regime, ns.checkpointing)
    out = sys.stdout
    names = ("activations", "autocast_weights", "rng_state", "logits", "loss_transient", "cache")
    for name in names:
        out.write(f"{name:18} {getattr(result, name):>16,} B\n")
    if ns.tensors:
        for row in result.tensors:
            out.write(f"{row}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
