"""The moments inside a layer's backward (``calculators/transformers_activations.py``) and the
peak moments the engines build on them (``calculators/engines/torch/peak.py``,
``calculators/engines/deepspeed/layouts.py``)."""

from __future__ import annotations

import dataclasses

import pytest

from calculators.activations import Regime
from calculators.architecture import count_params, tensor_counts
from calculators.batch import Batch, Checkpointing
from calculators.conventions import HALF_BYTES, Engine, Precision, Stage
from calculators.engines.deepspeed.layouts import forward_moments, later_micro_steps, step_shape
from calculators.engines.deepspeed.memory import Shared
from calculators.engines.torch.peak import _layer_inner
from calculators.hf_config import architecture_from_hf_config
from calculators.memory import estimate
from calculators.model_states import TrainingSetup
from calculators.reduction_scratch import reduction_scratch
from calculators.transformers_activations import (
    _norm_backward,
    dense_layer_backward,
    eager_attention_backward,
    efficient_attention_backward,
    efficient_backward_workspace,
    experts_backward,
    final_norm_backward,
    final_norm_held,
    layer_backward,
    norms_backward,
)
from measure.hf_families import FAMILIES, family_config

MLP_PARTS = {"mlp", "experts", "router", "shared_expert", "shared_expert_gate"}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_gradients_kept_are_the_mlp_weights(family: str) -> None:
    # what the pre-MLP norm's moment adds per byte of gradient is the MLP's parameter count as
    # the parameter list has it (router, experts, shared expert and its gate included)
    arch = architecture_from_hf_config(family_config(family))
    batch = Batch(2, 64)
    # the parameter list names one block of each kind (DeepSeek's dense first, then experts)
    blocks: dict[str, list[str]] = {}
    for t, _ in tensor_counts(arch):
        if t.name.startswith("blocks."):
            blocks.setdefault(".".join(t.name.split(".")[:2]), []).append(t.name)
    for block, names in blocks.items():
        dense = not any(n.split(".")[2] == "experts" for n in names)
        mlp = sum(
            t.numel
            for t, _ in tensor_counts(arch)
            if t.name in names and t.name.split(".")[2] in MLP_PARTS
        )
        # (bytes per element large enough that both lie above the moment's floor of 0)
        grown = norms_backward(arch, batch, "half", 102, dense) - norms_backward(
            arch, batch, "half", 100, dense
        )
        assert grown == 2 * mlp, (family, block)


def _setup(family: str, precision: Precision, micro: int, seq: int, dp: int = 1) -> TrainingSetup:
    arch = architecture_from_hf_config(family_config(family))
    return TrainingSetup(
        params=count_params(arch),
        dp=dp,
        precision=precision,
        engine=Engine.TORCH,
        architecture=arch,
        batch=Batch(micro, seq, Checkpointing.NONE),
    )


def _moments(setup: TrainingSetup, stage: Stage) -> dict[str, int]:
    est = estimate(setup, [stage]).stages[0]
    return {
        k.removeprefix("peak_candidate_"): v
        for k, v in est.components.items()
        if k.startswith("peak_candidate_")
    }


def test_the_final_norm_outlasts_the_loss_where_the_vocabulary_is_small() -> None:
    # a wide model with a small vocabulary in pure bf16 under DDP: the final norm's fp32
    # temporaries, every layer still saved, outweigh the loss's tokens x vocabulary gradients
    # (bench/results/step_fuzz: Mistral 2 x 512, vocabulary 100, read -3.83 % without them)
    config = {**family_config("mistral"), "vocab_size": 128, "hidden_size": 1024}
    arch = architecture_from_hf_config(config)
    setup = dataclasses.replace(
        _setup("mistral", Precision.BF16, 2, 512), params=count_params(arch), architecture=arch
    )
    moments = _moments(setup, Stage.OPTIMIZER)
    assert moments["final_norm_backward"] > moments["loss_backward"]
    # the same moment of a real vocabulary stays below the loss's
    real = _moments(_setup("llama", Precision.BF16, 2, 512), Stage.OPTIMIZER)
    assert real["final_norm_backward"] < real["loss_backward"]


def test_final_norm_held_counts_the_norms_fp32_temporaries() -> None:
    # in pure bf16 the norm's backward holds up to five fp32 tensors of its input's size beside
    # what it saved: its held bytes grow with the hidden size at 4 bytes x 5 per element at least
    arch = architecture_from_hf_config(family_config("llama"))
    wide = architecture_from_hf_config({**family_config("llama"), "hidden_size": 2 * arch.hidden})
    batch = Batch(2, 64)
    per_element = (final_norm_held(wide, batch, "half") - final_norm_held(arch, batch, "half")) / (
        batch.tokens * arch.hidden
    )
    assert per_element >= 5 * 4


# a narrow-MLP model on long sequences (bench/results/step_fuzz/h200_ds_seed21.jsonl: Gemma,
# hidden 768, ffn 160): its norms' fp32 temporaries outweigh its MLP's backward
NARROW_MLP = {
    **family_config("gemma"),
    "hidden_size": 768,
    "intermediate_size": 160,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "vocab_size": 100,
}


def test_deepspeed_layers_hold_their_norms_backward() -> None:
    # under DeepSpeed the module is 16-bit; stages 0 and 1 without overlap_comm keep the MLP's
    # gradients in param.grad by the pre-MLP norm's backward, stages 2 and 3 move each away
    arch = architecture_from_hf_config(NARROW_MLP)
    batch = Batch(16, 128)
    kept = norms_backward(arch, batch, "half", HALF_BYTES, True)
    assert layer_backward(arch, batch, True) == kept
    assert layer_backward(arch, batch, True, moved=True) == norms_backward(
        arch, batch, "half", 0, True
    )
    assert kept > norms_backward(arch, batch, "half", 0, True)


def test_a_sandwich_norm_keeps_the_gradient_entering_the_layer() -> None:
    # Gemma-2/3's post-feedforward norm runs backward first, on the gradient entering the layer,
    # which the residual stream still holds: the norm's backward does not free it
    arch = architecture_from_hf_config(family_config("gemma2"))
    batch = Batch(8, 192)
    t, h = batch.tokens, arch.hidden
    floor = HALF_BYTES * t * h + _norm_backward(arch, t, h, HALF_BYTES)
    assert layer_backward(arch, batch, True) >= floor
    assert layer_backward(arch, batch, True, moved=True) >= floor


def _deepspeed(config: dict[str, object], batch: Batch) -> TrainingSetup:
    arch = architecture_from_hf_config(config)
    return TrainingSetup(
        params=count_params(arch),
        dp=1,
        precision=Precision.MIXED_BF16,
        engine=Engine.DEEPSPEED,
        architecture=arch,
        batch=batch,
    )


def test_later_micro_steps_add_a_layers_gradients_in_place() -> None:
    # where no hook moves a gradient, the first micro-step's last layer keeps its own weight
    # gradients in param.grad; on later micro-steps AccumulateGrad adds each into the one
    # accumulated before and frees it: the moment is the moved one's, beside the accumulated
    setup = _deepspeed(NARROW_MLP, Batch(16, 128, grad_accumulation_steps=2))
    shared = Shared(setup)
    shape = step_shape(setup, shared.knobs)
    assert shape.last_layer_backward is not None and shape.last_layer_backward_moved is not None
    regrown = shape.regrown_gradients(False)
    assert regrown == shape.last_layer_backward - shape.last_layer_backward_moved > 0
    assert shape.regrown_gradients(True) == 0
    moments = forward_moments(shape, shape.first_gradient([1]))
    later_micro_steps(moments, 2, {"accumulated_gradients": 1}, ("last_layer_backward",), regrown)
    first = moments["last_layer_backward"]
    later = moments["last_layer_backward_later_micro_step"]
    assert first.activations - later.activations == regrown
    assert later.buffers["accumulated_gradients"] == 1


def test_a_gated_shared_experts_output_gradient_waits_for_the_routed_experts() -> None:
    # Qwen2-MoE computes its shared expert before the routed ones and gates it after them: the
    # gate's product runs backward first and its gradient for the shared expert's output waits
    # through the routed experts' backward
    arch = architecture_from_hf_config(family_config("qwen2_moe"))
    assert arch.modelling is not None
    ungated = dataclasses.replace(
        arch, modelling=dataclasses.replace(arch.modelling, shared_expert_gate=False)
    )
    batch = Batch(2, 1024)
    waiting = HALF_BYTES * batch.tokens * arch.hidden
    assert layer_backward(arch, batch, False) - layer_backward(ungated, batch, False) == waiting


# bench/results/step_fuzz/h200_ds_seed26.jsonl: a one-layer Gemma, 8 x 192 tokens, whose peak
# is its final norm's backward
ONE_LAYER_GEMMA = {
    **NARROW_MLP,
    "intermediate_size": 384,
    "num_hidden_layers": 1,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "vocab_size": 500,
}


def test_a_norms_weight_gradient_is_summed_with_both_products_alive() -> None:
    # Gemma's norm in 16-bit: type_as's backward casts the gradient to fp32 (the 16-bit one
    # freed), x_normed * (1 + weight) writes both factors' fp32 gradients, and the weight's is
    # summed over the tokens through the reduction kernel's staging buffer while they are alive
    arch = architecture_from_hf_config(ONE_LAYER_GEMMA)
    batch = Batch(8, 192)
    t, h = batch.tokens, arch.hidden
    weight = (4 - 2) * t * h + 2 * 4 * t * h + reduction_scratch(h, t)
    assert final_norm_backward(arch, batch) == weight
    # after the weight's gradient is accumulated: x * rsqrt's and the statistics' backward
    assert final_norm_backward(arch, batch, weight_done=True) < weight
    # in a recomputed block checkpointing's unpack hook held the only reference to the
    # normalised tensor (fp32 in Gemma's norm): freed as the node returns, before the sum
    recomputed = _norm_backward(arch, t, h, HALF_BYTES, recomputed=True)
    assert recomputed == max(weight - 4 * t * h, final_norm_backward(arch, batch, True))


def test_the_final_norm_after_a_bucket_flush_holds_grads_in_partition() -> None:
    # bench/results/step_fuzz/h200_ds_seed27.jsonl: the head's gradient fills the Trainer's
    # hidden^2 bucket and the final norm's overflows it, so DeepSpeed's stage 2 copies the
    # bucket into grads_in_partition before the norm's statistics run backward
    config = {
        **family_config("mistral"),
        "hidden_size": 256,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 48,
        "vocab_size": 257,
    }
    arch = architecture_from_hf_config(config)

    def peak(bucket: int) -> tuple[str, dict[str, int]]:
        setup = dataclasses.replace(
            _deepspeed(config, Batch(16, 192)),
            engine_config={
                "bf16": {"enabled": True},
                "zero_optimization": {"reduce_bucket_size": bucket, "overlap_comm": False},
            },
        )
        est = estimate(setup, [Stage.GRADIENTS]).stages[0]
        moment = next(n for n in est.notes if n.startswith("peak moment:"))
        return moment, {k: v for k, v in est.components.items() if k.startswith("peak.")}

    moment, small = peak(arch.hidden**2)
    assert moment == "peak moment: final_norm_backward"
    assert small["peak.grads_in_partition"] > 0
    # a bucket that takes every gradient flushes only at the end of backward
    _, large = peak(10**8)
    assert "peak.grads_in_partition" not in large
    assert small["peak.activations"] <= large["peak.activations"]


def test_an_mlp_bias_gradient_is_summed_beside_ups_gradients() -> None:
    # bench/results/step_fuzz/h200_seed17.jsonl: SmolLM3 with mlp_bias; up's backward (run
    # before the activation's) sums its bias's gradient over the tokens while both factors'
    # gradients, its input's and its weight's are alive
    config = {
        **family_config("smollm3"),
        "hidden_size": 256,
        "intermediate_size": 800,
        "num_hidden_layers": 1,
        "mlp_bias": True,
    }
    arch = architecture_from_hf_config(config)
    plain = architecture_from_hf_config({**config, "mlp_bias": False})
    batch = Batch(2, 512)
    t, h, f = batch.tokens, arch.hidden, arch.ffn
    up = 2 * t * h - 2 * t * f + 2 * 2 * f * h + reduction_scratch(f, t)
    assert dense_layer_backward(arch, batch, "half") == max(
        dense_layer_backward(plain, batch, "half"), up
    )
    assert dense_layer_backward(arch, batch, "half") > dense_layer_backward(plain, batch, "half")


def test_attention_dropouts_mask_is_freed_before_softmaxs_backward() -> None:
    # in fp32 dropout's output is a tensor of its own, saved by the second bmm and freed by its
    # backward; the boolean mask goes with dropout's backward
    config = {**family_config("llama"), "attn_implementation": "eager"}
    batch = Batch(1, 296)
    arch = architecture_from_hf_config(config)
    dropped = architecture_from_hf_config({**config, "attention_dropout": 0.1})
    scores = batch.micro_batch_size * arch.heads * batch.seq_len**2
    plain = eager_attention_backward(arch, batch, "fp32")
    assert eager_attention_backward(dropped, batch, "fp32") == max(plain - 5 * scores, 0)


@pytest.mark.parametrize(
    ("batch", "heads", "allocated"),
    # the workspace's allocation in _efficient_attention_backward, from the CUDA allocator's
    # history of two fp32 runs on an H200 (h200_seed30.jsonl:13, h200_seed24.jsonl:14): heads
    # 96 wide, so 128 × 64 tiles, two per 128 queries
    [(Batch(1, 296), 8, 1_573_632), (Batch(3, 192), 4, 1_573_632)],
)
def test_the_memory_efficient_backward_workspace(batch: Batch, heads: int, allocated: int) -> None:
    assert efficient_backward_workspace(batch, heads, 96, 96) == allocated


def test_the_memory_efficient_backward_is_counted_where_that_kernel_runs() -> None:
    # fp32 with a mask, or with a key/value head per query head: the memory-efficient kernel;
    # 16-bit runs flash or cuDNN, fp32 over grouped heads without a mask the math path (an
    # eager attention's count), and eager attention none of them. Heads 96 wide over a narrow
    # MLP (the shape of h200_seed24.jsonl:14), key/value heads grouped:
    grouped = {
        **family_config("llama"),
        "hidden_size": 384,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    arch = architecture_from_hf_config(grouped)
    per_head = architecture_from_hf_config({**grouped, "num_key_value_heads": 4})
    eager = architecture_from_hf_config({**grouped, "attn_implementation": "eager"})
    padded, plain = Batch(3, 192, padded=True), Batch(3, 192)
    assert efficient_attention_backward(arch, padded, "fp32") > 0
    assert efficient_attention_backward(per_head, plain, "fp32") > 0
    assert efficient_attention_backward(arch, plain, "fp32") == 0
    for regime in ("half", "autocast"):
        assert efficient_attention_backward(arch, padded, regime) == 0
    assert efficient_attention_backward(eager, padded, "fp32") == 0


def test_the_torch_engines_count_the_experts_gated_products_backward() -> None:
    # bench/results/step_fuzz/h200_seed20.jsonl: a Mixtral layer in bf16 whose experts' gated
    # product runs backward with down's input and weight gradients alive (read -2.33 % without)
    config = {
        **family_config("mixtral"),
        "hidden_size": 96,
        "intermediate_size": 800,
        "num_local_experts": 2,
        "num_experts_per_tok": 2,
    }
    arch = architecture_from_hf_config(config)
    batch = Batch(2, 296)
    n, f, h = batch.tokens * arch.experts_per_token, arch.ffn, arch.hidden
    gated = 2 * 2 * n * f + 2 * arch.num_experts * f * h - 2 * n * h
    assert gated > experts_backward(arch, batch, "half")
    assert _layer_inner(arch, batch, Regime.HALF, HALF_BYTES) >= gated


def test_fsdp2_holds_a_blocks_gradients_made_before_its_attention_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # FSDP2 keeps a block's unsharded gradients until its post-backward: by a recomputed eager
    # attention's backward its MLP's, output projection's and post-attention norm's exist
    # (bench/results/step_fuzz/h200_seed18.jsonl: Phi-3, read -2.65 % without them)
    from calculators.engines.torch import memory

    config = {**family_config("llama"), "attn_implementation": "eager", "vocab_size": 128}
    arch = architecture_from_hf_config(config)
    setup = dataclasses.replace(
        _setup("llama", Precision.MIXED_BF16, 2, 256),
        params=count_params(arch),
        architecture=arch,
        batch=Batch(2, 256, Checkpointing.FULL),
    )
    with_grads = _moments(setup, Stage.GRADIENTS)["recompute"]
    made = {"proj", "gate", "up", "down", "ln2"}  # the output projection, the MLP, its norm
    block = memory.root_and_last_block(memory.param_tensors(setup) or [])[1]
    grads = HALF_BYTES * sum(t.numel for t in block if t.name.split(".")[-2] in made)
    monkeypatch.setattr(memory, "_before_attention", lambda _: 0)
    assert with_grads - _moments(setup, Stage.GRADIENTS)["recompute"] == grads


def test_fsdp2_holds_each_kind_of_block_at_its_own_size() -> None:
    # DeepSeek's dense blocks come before its experts blocks: at N = 64 the four-expert weights
    # pad 16-fold, so an experts block gathers far more than a dense one. Each block's moments
    # read its own size and its neighbours' (bench/results/step_fuzz/h200_seed19.jsonl: a
    # three-layer DeepSeek-V3 read +17.5 % with every block sized as the last)
    from calculators.engines.torch import memory
    from calculators.parameters import fsdp_shard_total

    config = {**family_config("deepseek_v3"), "num_hidden_layers": 5, "first_k_dense_replace": 2}
    arch = architecture_from_hf_config(config)
    setup = dataclasses.replace(
        _setup("deepseek_v3", Precision.BF16, 2, 64, dp=64),
        params=count_params(arch),
        architecture=arch,
    )
    ts = memory.param_tensors(setup) or []
    runs = memory.block_runs(ts)
    assert [count for count, _ in runs] == [2, 3]
    fsdp = memory._fsdp_backward(setup, Stage.PARAMETERS, memory.dtypes(setup.precision), ts)
    dense, experts = (b for _, b in fsdp.blocks)
    for (_, tensors), block in zip(runs, (dense, experts), strict=True):
        assert block.gathered == 64 * fsdp_shard_total(tensors, 64) * HALF_BYTES
    assert experts.gathered > 2 * dense.gathered
    # the first experts block finds the last dense block prefetched, not one of its own kind
    assert fsdp.at_block_start(2, 0) - fsdp.at_block_start(3, 0) < experts.gathered - dense.gathered
    assert {1, 2} <= fsdp.candidates()


def test_one_rank_makes_no_flat_all_gather_output() -> None:
    # FSDP2 on one rank copies each shard into its unsharded storage when a block's
    # pre-forward or pre-backward waits for it (_fsdp_param_group.py wait_for_unshard,
    # world_size == 1): no flat all-gather output beside the parameters, and a prefetch that
    # allocates nothing. At N = 2 (dimensions that divide evenly: the same padded bytes) block
    # 0's all-gather in forward holds both copies of the root and of block 0
    from calculators.engines.torch import memory

    one = _setup("llama", Precision.BF16, 2, 64, dp=1)
    two = dataclasses.replace(one, dp=2)
    root, _ = memory._root_and_last_block(one, HALF_BYTES)
    first = HALF_BYTES * sum(t.numel for t in memory.first_block(memory.param_tensors(one) or []))
    gap = _moments(two, Stage.PARAMETERS)["first_block_gather"]
    gap -= _moments(one, Stage.PARAMETERS)["first_block_gather"]
    assert gap == root + first
    fsdp = memory._fsdp_backward(one, Stage.PARAMETERS, memory.dtypes(one.precision), [])
    assert not fsdp.across_ranks


def test_the_last_blocks_eager_softmax_holds_an_fp32_copy_of_the_scores() -> None:
    # softmax(dtype=float32) on bf16 scores converts them first, then writes its fp32 output,
    # the 16-bit scores still bound: under FSDP2 the last block's eager attention does so beside
    # its flat all-gather output (bench/results/step_fuzz/h200_seed19.jsonl: the measured peak,
    # in forward, reached by softmax's output)
    from calculators.transformers_activations import eager_softmax_forward

    config = {**family_config("llama"), "attn_implementation": "eager", "vocab_size": 128}
    arch = architecture_from_hf_config(config)
    batch = Batch(2, 256)
    scores = 2 * arch.heads * 256**2
    sdpa = architecture_from_hf_config(family_config("llama"))
    assert eager_softmax_forward(sdpa, batch, "half") == 0
    held = eager_softmax_forward(arch, batch, "half")
    # the fp32 copy and output, the 16-bit scores, q, k and v: more than both fp32 tensors
    assert held > 2 * 4 * scores + HALF_BYTES * scores
    setup = dataclasses.replace(
        _setup("llama", Precision.BF16, 2, 256, dp=4),
        params=count_params(arch),
        architecture=arch,
    )
    moments = _moments(setup, Stage.PARAMETERS)
    assert moments["last_block_forward"] > moments["last_block_gather"]
