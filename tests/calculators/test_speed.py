"""The speed model: FLOPs per token against published counts, overlap arithmetic, calibration."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calculators.activations import Regime
from calculators.architecture import Architecture, count_params, tensors
from calculators.batch import Batch, Checkpointing
from calculators.conventions import Engine, Optimizer, Precision, Stage
from calculators.speed import (
    ACTIVATION_PASSES_BACKWARD,
    ACTIVATION_PASSES_FORWARD,
    ATTENTION_BACKWARD_FACTOR,
    ATTENTION_EFFICIENCY,
    CAUSAL_FRACTION,
    MEMORY_EFFICIENCY,
    PARAMETER_BYTES_BACKWARD,
    PARAMETER_BYTES_FORWARD,
    TORCH_FOREACH_ADAM_BYTES,
    EngineKernels,
    GpuFigures,
    HostFigures,
    MicroStep,
    PhaseComm,
    activation_bytes,
    engine_kernels,
    exposed_seconds,
    micro_step,
    optimizer_bytes_per_param,
    split_phase,
    token_flops,
)


def gpt(layers: int, hidden: int, heads: int, vocab: int) -> Architecture:
    return Architecture(
        layers=layers, hidden=hidden, heads=heads, vocab_size=vocab, max_seq_len=2048
    )


# Narayanan et al. 2021 (arXiv 2104.04473) §5.1: FLOPs per iteration of a GPT with l layers,
# hidden h, vocabulary V, sequence s and batch B: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) without
# recomputation, 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) with full recomputation. Their
# attention term counts the full (non-causal) s × s products with a 2× backward; ours halves
# them for causality and uses FlashAttention-2's 2.5× backward, so the attention part is
# compared separately.
@pytest.mark.parametrize(
    ("layers", "hidden", "heads", "vocab", "seq"),
    [
        (96, 12288, 96, 51200, 2048),  # GPT-3 175B as in their Table 1
        (24, 2048, 16, 51200, 2048),  # a 1.3B GPT
        (2, 64, 4, 128, 32),
    ],
)
@pytest.mark.parametrize("recompute", [False, True])
def test_linear_and_head_flops_match_narayanan(
    layers: int, hidden: int, heads: int, vocab: int, seq: int, recompute: bool
) -> None:
    arch = gpt(layers, hidden, heads, vocab)
    ckpt = Checkpointing.FULL if recompute else Checkpointing.NONE
    f = token_flops(arch, seq, ckpt)
    n, h, v = layers, hidden, vocab
    # attention: fwd 4·l·s·h full, 2·l·s·h causal; recomputed once more under full checkpointing
    attention_fwd = 4 * n * seq * h * CAUSAL_FRACTION
    assert f.attention_forward == attention_fwd
    attention = attention_fwd * (1 + ATTENTION_BACKWARD_FACTOR + (1 if recompute else 0))
    if recompute:
        narayanan = 96 * n * h**2 + 6 * h * v  # per token, without the attention term
    else:
        narayanan = 72 * n * h**2 + 6 * h * v
    # their count leaves out biases-free details: the same linears, so it matches exactly
    assert f.total - attention == pytest.approx(narayanan, rel=1e-12)


def test_selective_recomputes_only_the_attention_core() -> None:
    arch = gpt(4, 256, 8, 1000)
    none = token_flops(arch, 512, Checkpointing.NONE)
    sel = token_flops(arch, 512, Checkpointing.SELECTIVE)
    full = token_flops(arch, 512, Checkpointing.FULL)
    assert none.recompute == 0
    assert sel.recompute == none.attention_forward
    assert none.total < sel.total < full.total
    assert full.recompute == pytest.approx(none.forward - 2 * 256 * 1000)  # forward minus head


def test_every_n_layers_recomputes_the_checkpointed_blocks_only() -> None:
    # layers 0, n, 2n, ...: 5 layers at n = 2 recompute three, at n = 3 two; a DeepSeek shape
    # (a dense first layer, MoE layers after it) recomputes each block as its kind
    import json
    from pathlib import Path

    from calculators.hf_config import architecture_from_hf_config

    arch = gpt(5, 256, 8, 1000)
    full = token_flops(arch, 512, Checkpointing.FULL)
    for n, blocks in ((1, 5), (2, 3), (3, 2), (5, 1), (7, 1)):
        f = token_flops(arch, 512, Checkpointing.FULL, every_n_layers=n)
        assert f.recompute == pytest.approx(full.recompute * blocks / 5, rel=1e-12)
        assert (f.forward, f.backward) == (full.forward, full.backward)
    cfg = json.loads(
        (Path(__file__).parents[2] / "bench/hf_configs/deepseek_v3-small.json").read_text()
    )
    one = architecture_from_hf_config({**cfg, "num_hidden_layers": 1, "first_k_dense_replace": 1})
    moe = architecture_from_hf_config({**cfg, "num_hidden_layers": 1, "first_k_dense_replace": 0})
    arch = architecture_from_hf_config({**cfg, "num_hidden_layers": 5, "first_k_dense_replace": 1})
    dense_block = token_flops(one, 512, Checkpointing.FULL).recompute
    moe_block = token_flops(moe, 512, Checkpointing.FULL).recompute
    assert token_flops(arch, 512, Checkpointing.FULL, every_n_layers=2).recompute == (
        pytest.approx(dense_block + 2 * moe_block, rel=1e-12)  # blocks 0 (dense), 2 and 4
    )


def test_gated_mlp_and_gqa_counted_from_their_shapes() -> None:
    # Llama-style: q 4096, kv 1024 (8 kv heads of 128), ffn 14336 gated, untied head 128256
    arch = Architecture(
        layers=1,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn_hidden=14336,
        vocab_size=128256,
        bias=False,
        gated_mlp=True,
        position_embedding="rope",  # type: ignore[arg-type]
    )
    f = token_flops(arch, 1, Checkpointing.NONE)
    linears = 2 * 4096 * (4096 + 2 * 1024) + 2 * 4096 * 4096 + 3 * 2 * 4096 * 14336
    assert f.forward - f.attention_forward == linears + 2 * 4096 * 128256


def test_moe_counts_active_experts_and_router() -> None:
    dense = gpt(2, 128, 4, 100)
    moe = Architecture(
        layers=2,
        hidden=128,
        heads=4,
        vocab_size=100,
        max_seq_len=2048,
        num_experts=8,
        experts_per_token=2,
    )
    d, m = token_flops(dense, 16, Checkpointing.NONE), token_flops(moe, 16, Checkpointing.NONE)
    mlp = 2 * 2 * 128 * 512  # fc1 + fc2 per token per expert
    assert m.forward - d.forward == 2 * (mlp + 2 * 128 * 8)  # one more expert, the router


@pytest.mark.parametrize(
    ("precision", "k", "engine", "optimizer", "expected"),
    [
        # a fused optimizer: 12 B of states read and written, fp32 gradient read, 16-bit copy
        (Precision.MIXED_BF16, 12, Engine.DEEPSPEED, Optimizer.ADAM, 30),
        # fp32 fused Adam: 8 B states r/w, gradient read, parameter read and written
        (Precision.FP32, 8, Engine.DEEPSPEED, Optimizer.ADAM, 16 + 4 + 4 + 4),
        # torch/optim/adam.py _multi_tensor_adam over fp32 parameters: one pass per foreach op
        (Precision.MIXED_BF16, 12, Engine.TORCH, Optimizer.ADAM, 72),
        (Precision.FP32, 8, Engine.TORCH, Optimizer.ADAM, 72),
        (Precision.MIXED_BF16, 12, Engine.TORCH, Optimizer.ADAMW, 80),
        # SGD has no multi-tensor count here: the fused formula, 2·4 + 4 + 2
        (Precision.MIXED_BF16, 4, Engine.TORCH, Optimizer.SGD_MOMENTUM, 14),
    ],
)
def test_optimizer_bytes(
    precision: Precision, k: float, engine: Engine, optimizer: Optimizer, expected: float
) -> None:
    assert optimizer_bytes_per_param(precision, k, engine, optimizer) == expected


def test_foreach_adam_at_the_memory_efficiency_matches_the_profile() -> None:
    # bench/results/plan_profile: multi-tensor Adam over 1.01 G fp32 parameters took 19.3-19.4 ms
    # of kernels on an H200 (4.8 TB/s)
    seconds = 1_013_878_784 * TORCH_FOREACH_ADAM_BYTES / (4.8e12 * MEMORY_EFFICIENCY)
    assert seconds == pytest.approx(19.35e-3, rel=0.05)


GPT_1B = Architecture(
    layers=16, hidden=2048, heads=16, vocab_size=50304, ffn_hidden=8192, max_seq_len=1024
)
H200_PEAK, H200_BANDWIDTH = 989.5e12, 4.8e12


def one_micro_step(
    micro: int = 8,
    ckpt: Checkpointing = Checkpointing.NONE,
    kernels: EngineKernels | None = None,
    ranks: int = 1,
    host: HostFigures | None = None,
    regime: Regime = Regime.AUTOCAST,
) -> MicroStep:
    return micro_step(
        GPT_1B,
        count_params(GPT_1B),
        len(tensors(GPT_1B)),
        Batch(micro, 1024, ckpt),
        regime,
        H200_PEAK,
        H200_BANDWIDTH,
        kernels or engine_kernels(Engine.TORCH, Stage.NONE),
        ranks,
        GpuFigures(),
        host or HostFigures(),
    )


def test_gpu_terms_are_flops_over_rates_and_bytes_over_bandwidth() -> None:
    m = one_micro_step()
    f = token_flops(GPT_1B, 1024, Checkpointing.NONE)
    tokens = 8 * 1024
    gemm = (f.forward + f.backward - (1 + ATTENTION_BACKWARD_FACTOR) * f.attention_forward) * tokens
    assert m.gemm_forward + m.gemm_backward == pytest.approx(gemm / (H200_PEAK * 0.75))
    attention = (1 + ATTENTION_BACKWARD_FACTOR) * f.attention_forward * tokens
    assert m.attention_forward + m.attention_backward == pytest.approx(
        attention / (H200_PEAK * ATTENTION_EFFICIENCY)
    )
    act = activation_bytes(GPT_1B, Batch(8, 1024), Regime.AUTOCAST)
    passes = ACTIVATION_PASSES_FORWARD + ACTIVATION_PASSES_BACKWARD
    per_param = PARAMETER_BYTES_FORWARD + PARAMETER_BYTES_BACKWARD
    moved = act * passes + count_params(GPT_1B) * per_param
    assert m.memory_bound == pytest.approx(moved / (H200_BANDWIDTH * MEMORY_EFFICIENCY))
    assert m.gpu == pytest.approx(m.matmul + m.memory_bound)


# bench/results/plan_profile/plan_profile_nd1.json, stage 0, 8 × 1024 tokens per micro-step:
# kernel ms by category (GEMM, attention, element-wise + copy/cast) on an H200.
@pytest.mark.parametrize(
    ("term", "measured_ms", "rel"),
    [("gemm", 56.5, 0.10), ("attention", 5.1, 0.05), ("memory_bound", 19.7 + 15.3, 0.10)],
)
def test_gpu_terms_against_the_profiled_kernels(term: str, measured_ms: float, rel: float) -> None:
    m = one_micro_step()
    predicted = {
        "gemm": m.gemm_forward + m.gemm_backward,
        "attention": m.attention_forward + m.attention_backward,
        "memory_bound": m.memory_bound,
    }[term]
    assert predicted * 1e3 == pytest.approx(measured_ms, rel=rel)


def test_host_terms_are_dispatches_times_the_host_cost() -> None:
    n = len(tensors(GPT_1B))
    ddp = one_micro_step(host=HostFigures(10e-6, "test"))
    assert ddp.kernels == n * (2 + 6) and ddp.hook_steps == 0
    assert ddp.host == pytest.approx(n * 8 * 10e-6)
    fsdp = engine_kernels(Engine.TORCH, Stage.PARAMETERS)
    alone = one_micro_step(kernels=fsdp, host=HostFigures(10e-6, "test"))
    assert alone.hook_steps == n * fsdp.hooks
    # real collectives add their copy-in/copy-out bookkeeping per tensor
    shared = one_micro_step(kernels=fsdp, ranks=4, host=HostFigures(10e-6, "test"))
    extra = n * fsdp.per_collective * fsdp.collectives
    assert shared.hook_steps == alone.hook_steps + extra
    assert shared.host - alone.host == pytest.approx(extra * 10e-6)
    assert shared.gpu == alone.gpu


@pytest.mark.parametrize(
    ("engine", "stage", "collectives"),
    [
        (Engine.TORCH, Stage.NONE, 0),  # DDP: buckets, no per-tensor collectives
        (Engine.TORCH, Stage.OPTIMIZER, 0),  # DDP + ZeroRedundancyOptimizer
        (Engine.TORCH, Stage.GRADIENTS, 2),  # FSDP2 without reshard: all-gather, reduce-scatter
        (Engine.TORCH, Stage.PARAMETERS, 3),  # FSDP2 reshard: all-gather twice
        (Engine.DEEPSPEED, Stage.GRADIENTS, 0),
        (Engine.DEEPSPEED, Stage.PARAMETERS, 3),
    ],
)
def test_engine_kernels(engine: Engine, stage: Stage, collectives: int) -> None:
    k = engine_kernels(engine, stage)
    assert k.collectives == collectives and k.reason
    assert k.forward > 0 and k.backward >= k.forward


def test_full_checkpointing_reruns_forward_on_both_queues() -> None:
    plain, full = one_micro_step(), one_micro_step(ckpt=Checkpointing.FULL)
    assert full.gemm_forward == plain.gemm_forward
    assert full.gemm_backward > plain.gemm_backward
    assert full.memory_backward > plain.memory_backward
    assert full.host_backward > plain.host_backward and full.host_forward == plain.host_forward


@given(st.integers(1, 32), st.integers(1, 32))
def test_gpu_grows_with_the_micro_batch_and_the_host_does_not(a: int, b: int) -> None:
    small, big = one_micro_step(min(a, b)), one_micro_step(max(a, b))
    assert small.gpu <= big.gpu
    assert small.host == big.host
    assert small.seconds == max(small.gpu, small.host)
    assert small.host_bound == (small.host > small.gpu)


def test_not_overlapped_is_all_exposed() -> None:
    p = PhaseComm(repeated_seconds=0.1, repeated_calls=4, once_seconds=0.3, once_calls=2)
    assert exposed_seconds(p, 4, window=100.0, overlapped=False) == pytest.approx(0.7)


def test_overlapped_behind_a_long_window_leaves_one_call_per_micro_step() -> None:
    p = PhaseComm(repeated_seconds=0.4, repeated_calls=4, once_seconds=0.0, once_calls=0)
    assert exposed_seconds(p, 3, window=10.0, overlapped=True) == pytest.approx(3 * 0.1)


def test_overlapped_beyond_the_window_is_exposed() -> None:
    p = PhaseComm(once_seconds=1.0, once_calls=10)
    # 0.1 s (one call) never hides; 0.9 s against a 0.5 s window leaves 0.4 s
    assert exposed_seconds(p, 1, window=0.5, overlapped=True) == pytest.approx(0.5)


@given(
    st.floats(0, 10),
    st.integers(1, 100),
    st.floats(0, 10),
    st.integers(0, 100),
    st.integers(1, 64),
    st.floats(0, 10),
    st.floats(0, 10),
)
def test_exposed_is_bounded_and_monotone_in_window(
    rs: float, rc: int, os_: float, oc: int, ga: int, w1: float, w2: float
) -> None:
    p = PhaseComm(rs, rc, os_, oc)
    total = p.total(ga)
    lo, hi = sorted((w1, w2))
    e_lo = exposed_seconds(p, ga, lo, True)
    e_hi = exposed_seconds(p, ga, hi, True)
    assert 0 <= e_hi <= e_lo + 1e-9
    assert e_lo <= total + 1e-9


@given(st.floats(0, 5), st.floats(0, 5), st.integers(0, 50), st.integers(0, 50), st.integers(2, 64))
def test_split_phase_recovers_a_linear_phase(r: float, o: float, rc: int, oc: int, ga: int) -> None:
    split = split_phase(r * ga + o, rc * ga + oc, r + o, rc + oc, ga)
    assert split.repeated_seconds == pytest.approx(r, abs=1e-9)
    assert split.once_seconds == pytest.approx(o, abs=1e-9)
    assert split.repeated_calls == pytest.approx(rc)
    assert split.total(ga) == pytest.approx(r * ga + o, abs=1e-9)


def test_deepseek_linear_flops_are_twice_its_active_block_weights() -> None:
    # every 2-D weight in the blocks (latent attention's five projections, dense MLPs, router,
    # shared expert) once per token, of the routed experts only the chosen 8 of 256
    from calculators.architecture import count_active_params, count_params, tensor_counts
    from calculators.hf_config import architecture_from_hf_config
    from tests.calculators.test_architecture import HF_CONFIGS

    arch = architecture_from_hf_config(HF_CONFIGS["deepseek-v3"])
    in_blocks = sum(
        c * t.numel for t, c in tensor_counts(arch) if len(t.shape) >= 2 and t.layer is not None
    )
    active = in_blocks - (count_params(arch) - count_active_params(arch))
    flops = token_flops(arch, 4096, Checkpointing.NONE)
    head = 2 * arch.hidden * arch.vocab_size
    assert flops.forward - flops.attention_forward - head == 2 * active
    # QKᵀ over 128 heads × 192, AV over 128 heads × 128, causal half
    assert flops.attention_forward == 61 * 2 * 4096 * 128 * (192 + 128) * 0.5
