"""The analytical model of transformers' modelling code against the traced ground truth.

For every supported family, a small config of the same shape: the saved-activation bytes the
analytical model predicts equal, byte for byte, what autograd saves when transformers' own code
runs forward + loss from ``labels`` (``measure/trace.py``, fake tensors on CPU), in each dtype
regime and with transformers' gradient checkpointing; the parameter count equals
``sum(p.numel())`` of the model transformers builds on the meta device.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bench import trace_fuzz
from calculators.activations import ActivationBreakdown, Regime, activations
from calculators.architecture import count_params
from calculators.batch import Batch, Checkpointing
from calculators.errors import InputError
from calculators.hf_config import architecture_from_hf_config

trace_module = pytest.importorskip(
    "measure.trace", reason="the traced ground truth needs torch", exc_type=ImportError
)
pytest.importorskip("transformers", reason="install the hf extra: pip install 'zerocalc[hf]'")

_BASE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "pad_token_id": None,
    "bos_token_id": None,
    "eos_token_id": None,
}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}

# one small config per family, shaped like the family's real ones (GQA, head_dim, experts)
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama"},
    "mistral": {"model_type": "mistral", "sliding_window": None},
    # sliding and full layers by layer_types
    "ministral": {
        "model_type": "ministral",
        "head_dim": 16,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "qwen2": {"model_type": "qwen2"},
    "qwen3": {"model_type": "qwen3", "head_dim": 16},
    "gemma": {"model_type": "gemma", "head_dim": 16, "num_key_value_heads": 1},
    "gemma2": {"model_type": "gemma2", "head_dim": 16, "sliding_window": 128},
    # one sliding and one full layer: both rotary embeddings in use
    "gemma3_text": {
        "model_type": "gemma3_text",
        "head_dim": 16,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "phi3": {"model_type": "phi3", "partial_rotary_factor": 0.5},
    # a NoPE layer after a rotary one
    "smollm3": {"model_type": "smollm3", "no_rope_layers": [1, 0]},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {"model_type": "qwen2_moe", **_MOE, "shared_expert_intermediate_size": 48},
    "qwen3_moe": {"model_type": "qwen3_moe", "head_dim": 16, "norm_topk_prob": True, **_MOE},
    # latent attention with q/k heads wider than v (cuDNN attention in 16-bit, the
    # memory-efficient kernel in fp32), a dense layer then an MoE layer, eight experts in four
    # groups, a shared expert
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        "num_key_value_heads": 4,
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "first_k_dense_replace": 1,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 4,
        "topk_group": 2,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
    },
}


def _config(family: str) -> dict[str, Any]:
    return {**_BASE, **CONFIGS[family]}


def _saved(acts: ActivationBreakdown) -> int:
    """What autograd holds at the end of forward (the logits are the caller's, not saved)."""
    saved: int = trace_module.predicted_figures(acts)[0]
    return saved


def _check(family: str | dict[str, Any], batch: Batch, regime: Regime) -> None:
    cfg = _config(family) if isinstance(family, str) else family
    acts = activations(architecture_from_hf_config(cfg), batch, regime)
    traced = trace_module.trace_batch(cfg, batch, regime.value)
    assert trace_module.predicted_figures(acts) == trace_module.figures(traced)


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_saved_activations_equal_the_trace(family: str, regime: Regime) -> None:
    _check(family, Batch(2, 24), regime)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_checkpointed_saved_activations_equal_the_trace(family: str) -> None:
    _check(family, Batch(2, 24, Checkpointing.FULL), Regime.AUTOCAST)


# the families whose layers all save alike
UNIFORM = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "mixtral", "qwen3_moe")


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("family", UNIFORM)
def test_every_n_layers_equals_the_trace(family: str, regime: Regime) -> None:
    # five layers, every second checkpointed (0, 2, 4) and every third (0, 3): the others save
    # what they save unchecked, autocast's weight copies with them
    cfg = {**_config(family), "num_hidden_layers": 5}
    for n in (2, 3):
        _check(cfg, Batch(2, 24, Checkpointing.FULL, checkpoint_every_n_layers=n), regime)
    padded = Batch(2, 24, Checkpointing.FULL, padded=True, checkpoint_every_n_layers=2)
    _check(cfg, padded, regime)


# five layers whose kinds differ: which of them every_n_layers checkpoints changes the figures
_SLIDING, _FULL = "sliding_attention", "full_attention"
MIXED: dict[str, dict[str, Any]] = {
    # sliding layers 0, 1, 3, 4 and a full layer 2, the window reached at 24 tokens
    "gemma3_text": {"sliding_window": 16, "sliding_window_pattern": 3, "layer_types": None},
    # sliding at the even layers, full at the odd ones
    "gemma2": {"sliding_window": 16},
    "ministral": {"sliding_window": 16, "layer_types": [_FULL, _SLIDING, _SLIDING, _FULL, _FULL]},
    # full layers 0 and 1, sliding from layer 2 on
    "qwen2": {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2},
    # layer 3 without rotary embeddings; with a window, that NoPE layer slides
    "smollm3": {"no_rope_layers": None},
    "smollm3 sliding": {"no_rope_layers": None, "use_sliding_window": True, "sliding_window": 16},
    # two dense layers, then three MoE layers
    "deepseek_v3": {"first_k_dense_replace": 2},
}


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("variant", sorted(MIXED))
def test_every_n_layers_of_unlike_layers_equals_the_trace(variant: str, regime: Regime) -> None:
    overrides = {k: v for k, v in MIXED[variant].items() if v is not None}
    base = {k: v for k, v in _config(variant.split()[0]).items() if k not in MIXED[variant]}
    cfg = {**base, **overrides, "num_hidden_layers": 5}
    for n in (2, 3):
        _check(cfg, Batch(2, 24, Checkpointing.FULL, checkpoint_every_n_layers=n), regime)
    _check(cfg, Batch(1, 12, Checkpointing.FULL, checkpoint_every_n_layers=2), regime)
    padded = Batch(2, 24, Checkpointing.FULL, padded=True, checkpoint_every_n_layers=2)
    _check(cfg, padded, regime)


@pytest.mark.parametrize("regime", [Regime.HALF, Regime.FP32])
def test_checkpointed_deepseek_in_every_regime_equals_the_trace(regime: Regime) -> None:
    # with 16-bit parameters the router's fp32 weight copies go with the checkpointed layers
    _check("deepseek_v3", Batch(2, 24, Checkpointing.FULL), regime)


@pytest.mark.parametrize("regime", [Regime.HALF, Regime.FP32])
def test_single_sequence_and_checkpointing_equal_the_trace(regime: Regime) -> None:
    # b = 1: the shifted labels stay a view of the padded (1, s + 1) tensor
    _check("qwen3", Batch(1, 40), regime)
    _check("phi3", Batch(1, 40, Checkpointing.FULL), regime)


# DeepSeek's variants: a full-rank q_proj; q/k as wide as v (flash attention, whose output
# follows torch.cat's layout and is copied for o_proj); biased down projections and o_proj;
# every layer MoE; un-normalised routing weights; rotate_half rotary; no cache; tied head
DEEPSEEK_VARIANTS: list[dict[str, Any]] = [
    {"q_lora_rank": None},
    {"v_head_dim": 24},
    {"attention_bias": True, "first_k_dense_replace": 0},
    {"norm_topk_prob": False, "rope_interleave": False},
    {"use_cache": False, "tie_word_embeddings": True, "n_shared_experts": 2},
]


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("variant", range(len(DEEPSEEK_VARIANTS)))
def test_deepseek_variants_equal_the_trace(variant: int, regime: Regime) -> None:
    cfg = {**_config("deepseek_v3"), **DEEPSEEK_VARIANTS[variant]}
    assert count_params(architecture_from_hf_config(cfg)) == trace_module.count_parameters(cfg)
    _check(cfg, Batch(2, 24), regime)
    # 40: the memory-efficient kernel (fp32) pads logsumexp rows to 64
    _check(cfg, Batch(1, 40, Checkpointing.FULL), regime)
    _check(cfg, Batch(2, 24, padded=True), regime)  # a mask: the memory-efficient kernel


# sliding-window layers whose window the sequence reaches: masked SDPA (memory-efficient kernel)
WINDOWED: dict[str, dict[str, Any]] = {
    "mistral": {"sliding_window": 16},
    "ministral": {"sliding_window": 16},
    "mixtral": {"sliding_window": 16},
    "phi3": {"sliding_window": 16},
    "gemma2": {"sliding_window": 16},
    "gemma3_text": {"sliding_window": 16},
    "qwen2": {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1},
    # the NoPE layer slides
    "smollm3": {"use_sliding_window": True, "sliding_window": 16},
}


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_sliding_window_layers_equal_the_trace(family: str, regime: Regime) -> None:
    cfg = {**_config(family), **WINDOWED[family]}
    _check(cfg, Batch(2, 40), regime)  # 40 ≥ 16 and not a multiple of 16 (padded bias)
    _check(cfg, Batch(1, 12), regime)  # under the window: no mask


# rotary scalings that choose their frequencies from the positions at run time (Phi-3.5-mini and
# Phi-4-mini ship LongRoPE): the same saved tensors, traced without that data-dependent choice
ROPE_SCALINGS: dict[str, dict[str, Any]] = {
    "phi3 longrope": {
        **CONFIGS["phi3"],
        "original_max_position_embeddings": 64,
        "rope_scaling": {"type": "longrope", "long_factor": [1.5] * 4, "short_factor": [1.0] * 4},
    },
    "llama dynamic": {
        "model_type": "llama",
        "rope_scaling": {"rope_type": "dynamic", "factor": 2.0},
    },
}


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("variant", sorted(ROPE_SCALINGS))
def test_position_dependent_rotary_scalings_equal_the_trace(variant: str, regime: Regime) -> None:
    cfg = {**_BASE, **ROPE_SCALINGS[variant]}
    assert count_params(architecture_from_hf_config(cfg)) == trace_module.count_parameters(cfg)
    _check(cfg, Batch(2, 96), regime)  # beyond the original 64 positions: the long factors
    _check(cfg, Batch(1, 40, Checkpointing.FULL), regime)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_parameter_count_equals_transformers(family: str) -> None:
    cfg = _config(family)
    assert count_params(architecture_from_hf_config(cfg)) == trace_module.count_parameters(cfg)
    # attention_bias where the family's code reads it (Mistral's, Ministral's, Mixtral's and
    # Phi-3's projections have none whatever the config says)
    cfg = {**cfg, "attention_bias": True}
    assert count_params(architecture_from_hf_config(cfg)) == trace_module.count_parameters(cfg)


def test_untied_gemma_and_biased_llama_counts() -> None:
    for cfg in (
        {**_config("gemma"), "tie_word_embeddings": False},
        {**_config("qwen3"), "attention_bias": True},
        {**_config("qwen2_moe"), "qkv_bias": False},
    ):
        assert count_params(architecture_from_hf_config(cfg)) == trace_module.count_parameters(cfg)


def test_canonical_architecture_keeps_its_figures() -> None:
    """A model given as ``architecture`` (no transformers modelling) is the canonical GPT."""
    arch = architecture_from_hf_config(_config("llama"))
    from dataclasses import replace

    canonical = replace(arch, modelling=None)
    batch = Batch(2, 24)
    assert _saved(activations(canonical, batch, Regime.HALF)) != _saved(
        activations(arch, batch, Regime.HALF)
    )


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_checkpointed_windows_keep_their_mask(family: str, regime: Regime) -> None:
    # every checkpointed call keeps the boolean window mask it was given, until backward
    cfg = {**_config(family), **WINDOWED[family]}
    _check(cfg, Batch(2, 40, Checkpointing.FULL), regime)


@pytest.mark.parametrize("checkpointing", [Checkpointing.NONE, Checkpointing.FULL])
@pytest.mark.parametrize("regime", list(Regime))
def test_windows_over_one_key_value_head_equal_the_trace(
    regime: Regime, checkpointing: Checkpointing
) -> None:
    # repeat_kv of one key/value head is a view: SDPA saves the cache's own k and v (Gemma 3 1B)
    cfg = {**_config("gemma3_text"), **WINDOWED["gemma3_text"], "num_key_value_heads": 1}
    _check(cfg, Batch(2, 40, checkpointing), regime)


# SmolLM3 layers that rotate nothing: under autocast their k and v stay bf16, so the cache holds
# them in bf16 and attention saves them (or, with one key/value head, views of them) uncast
NOPE_VARIANTS: dict[str, dict[str, Any]] = {
    "every layer": {"no_rope_layers": [0, 0]},
    "one key/value head, sliding": {
        "num_key_value_heads": 1,
        "use_sliding_window": True,
        "sliding_window": 16,
    },
    "one key/value head, eager": {"num_key_value_heads": 1, "attn_implementation": "eager"},
    "the default interval": {"num_hidden_layers": 4, "no_rope_layers": None},
}


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("variant", sorted(NOPE_VARIANTS))
def test_layers_without_rotary_equal_the_trace(variant: str, regime: Regime) -> None:
    cfg = {**_config("smollm3"), **NOPE_VARIANTS[variant]}
    for checkpointing in Checkpointing.NONE, Checkpointing.FULL:
        _check(cfg, Batch(2, 40, checkpointing), regime)
        _check(cfg, Batch(1, 12, checkpointing), regime)
        _check(cfg, Batch(2, 24, checkpointing, padded=True), regime)


@pytest.mark.parametrize("checkpointing", [Checkpointing.NONE, Checkpointing.FULL])
@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_padded_batches_equal_the_trace(
    family: str, regime: Regime, checkpointing: Checkpointing
) -> None:
    # a padding mask in every layer: masked SDPA (memory-efficient kernel, k/v expanded), and
    # under checkpointing the (b, 1, s, s) mask each checkpointed call keeps
    _check(family, Batch(2, 40, checkpointing, padded=True), regime)


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_padded_batches_over_sliding_windows_equal_the_trace(family: str, regime: Regime) -> None:
    cfg = {**_config(family), **WINDOWED[family]}
    for checkpointing in Checkpointing.NONE, Checkpointing.FULL:
        _check(cfg, Batch(2, 40, checkpointing, padded=True), regime)  # the window reached
        _check(cfg, Batch(2, 12, checkpointing, padded=True), regime)  # under the window


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_eager_attention_equals_the_trace(family: str, regime: Regime) -> None:
    # attn_implementation "eager": bmm's copies of q/k/v, the fp32 probabilities and their
    # 16-bit cast (Gemma-2 also tanh's soft-capped scores); one sequence takes the views a
    # single key/value head allows; checkpointed calls keep (b, 1, s, s) float masks
    cfg = {**_config(family), "attn_implementation": "eager"}
    _check(cfg, Batch(2, 24), regime)
    _check(cfg, Batch(1, 12), regime)
    _check(cfg, Batch(2, 24, Checkpointing.FULL, padded=True), regime)


@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_eager_attention_over_sliding_windows_equals_the_trace(family: str) -> None:
    cfg = {**_config(family), **WINDOWED[family], "attn_implementation": "eager"}
    for checkpointing in Checkpointing.NONE, Checkpointing.FULL:
        _check(cfg, Batch(2, 40, checkpointing), Regime.AUTOCAST)


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("family", ["llama", "phi3", "smollm3"])
def test_attention_without_the_cache_equals_the_trace(
    family: str, kv_heads: int, regime: Regime
) -> None:
    # with no key/value cache (use_cache false, or any layer once gradient checkpointing is on)
    # v is the projection's own output: autocast casts it for nothing, so one key/value head
    # and one sequence give views of it, and Phi-3's v is a view of its fused qkv output, which
    # the attention then keeps whole; with a cache both are copies
    cfg = {**_config(family), "num_key_value_heads": kv_heads, "use_cache": False}
    for attention in "sdpa", "eager":
        body = {**cfg, "attn_implementation": attention}
        _check(body, Batch(1, 16), regime)
        _check(body, Batch(1, 16, padded=True), regime)
        _check(body, Batch(1, 16, Checkpointing.FULL, checkpoint_every_n_layers=2), regime)
        _check(body, Batch(2, 16), regime)


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_eager_attention_dropout_equals_the_trace(family: str, regime: Regime) -> None:
    # CUDA's fused dropout keeps a boolean mask (the trace runs native_dropout as CUDA does)
    cfg = {**_config(family), "attn_implementation": "eager", "attention_dropout": 0.1}
    _check(cfg, Batch(2, 20), regime)


KNOBS: dict[str, dict[str, Any]] = {
    # Gemma-3 soft-caps its logits only where its config says so (tanh's output saved)
    "gemma3_text softcap": {**CONFIGS["gemma3_text"], "final_logit_softcapping": 30.0},
    # ReLU saves its output, which the product saves too: no gate projection output
    "llama relu": {**CONFIGS["llama"], "hidden_act": "relu"},
    "qwen2_moe relu": {**CONFIGS["qwen2_moe"], "hidden_act": "relu"},  # the shared expert
    "phi3 relu": {**CONFIGS["phi3"], "hidden_act": "relu"},  # gate_up_proj kept whole
}


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("variant", sorted(KNOBS))
def test_config_knobs_equal_the_trace(variant: str, regime: Regime) -> None:
    cfg = {**_BASE, **KNOBS[variant]}
    _check(cfg, Batch(2, 20), regime)
    _check(cfg, Batch(1, 20, Checkpointing.FULL, checkpoint_every_n_layers=2), regime)


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("family", ["llama", "gemma", "phi3", "qwen2_moe", "deepseek_v3"])
def test_sdpa_attention_dropout_equals_the_trace(family: str, regime: Regime) -> None:
    # SDPA's kernels keep only an RNG state for their dropout; its math path (fp32 over grouped
    # key/value heads, no mask) runs CUDA's native_dropout: a boolean mask and the dropped
    # probabilities
    cfg = {**_config(family), "attention_dropout": 0.1}
    _check(cfg, Batch(2, 20), regime)
    _check(cfg, Batch(1, 20, Checkpointing.FULL, checkpoint_every_n_layers=2), regime)
    _check(cfg, Batch(2, 20, padded=True), regime)


@pytest.mark.parametrize("regime", list(Regime))
@pytest.mark.parametrize("family", ["llama", "gemma3_text", "phi3", "mixtral", "deepseek_v3"])
def test_the_final_hidden_state_outlives_the_head_until_the_loss(
    family: str, regime: Regime
) -> None:
    # XForCausalLM.forward holds outputs.last_hidden_state (the final norm's output) while it
    # computes the loss from labels: under autocast an fp32 tensor nothing saved (the head
    # saves its bf16 cast), otherwise the head's own saved input
    import weakref

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from calculators.transformers_activations import final_hidden_state

    cfg = _config(family)
    config = AutoConfig.for_model(**cfg)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    if regime is Regime.HALF:
        model = model.to(torch.bfloat16)
    final: list[weakref.ref[torch.Tensor]] = []
    saved: set[int] = set()
    seen: list[tuple[bool, int]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.add(t.untyped_storage().data_ptr())
        return t

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func is torch.nn.functional.cross_entropy and not seen:
                t = final[0]()
                assert t is not None, "the final norm's output is freed before the loss"
                seen.append((t.untyped_storage().data_ptr() in saved, t.untyped_storage().nbytes()))
            return func(*args, **(kwargs or {}))

    model.get_decoder().norm.register_forward_hook(lambda _m, _i, o: final.append(weakref.ref(o)))
    batch = Batch(2, 24)
    ids = torch.randint(3, cfg["vocab_size"], (batch.micro_batch_size, batch.seq_len))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=regime is Regime.AUTOCAST)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast, Spy():
        model(input_ids=ids, labels=ids)
    [(is_saved, nbytes)] = seen
    arch = architecture_from_hf_config(cfg)
    assert final_hidden_state(arch, batch, regime.value) == (0 if is_saved else nbytes)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_generated_configs_equal_the_trace(seed: int) -> None:
    # configs drawn across every modelled family's knobs and batches
    # (bench/trace_fuzz.py runs more of them)
    cfg, batch, regime = trace_fuzz.random_case(random.Random(seed))
    try:
        differ = trace_fuzz.check(cfg, batch, regime)
    except (InputError, trace_fuzz.Refused):
        assume(False)
    assert differ is None, (cfg, batch, regime, differ)


@pytest.mark.parametrize(
    ("change", "padded", "regime", "refused"),
    [
        # 20-wide heads: flash takes them without a mask in 16-bit; with one nothing fused does
        ({"head_dim": 20}, False, Regime.HALF, False),
        ({"head_dim": 20}, True, Regime.HALF, True),
        ({"head_dim": 20}, True, Regime.AUTOCAST, True),
        # fp32: the memory-efficient kernel takes multiples of 4; over grouped heads without a
        # mask SDPA runs its math path whatever the width, and that is modelled
        ({"head_dim": 20}, True, Regime.FP32, False),
        ({"head_dim": 18}, False, Regime.FP32, False),
        ({"head_dim": 18, "num_key_value_heads": 4}, False, Regime.FP32, True),
        ({"head_dim": 18, "attn_implementation": "eager"}, True, Regime.HALF, False),
    ],
)
def test_heads_sdpas_fused_kernels_refuse_get_an_input_error(
    change: dict[str, Any], padded: bool, regime: Regime, refused: bool
) -> None:
    config = {**_config("llama"), **change}
    assert config["num_attention_heads"] == 4
    arch = architecture_from_hf_config(config)
    batch = Batch(1, 128, padded=padded)
    if not refused:
        activations(arch, batch, regime)
        return
    with pytest.raises(InputError) as refusal:
        activations(arch, batch, regime)
    assert refusal.value.field == "model.hf_config.head_dim"
    assert "math path" in refusal.value.message
