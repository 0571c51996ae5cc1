"""The measured decoder is the calculator's canonical module, tensor by tensor."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from calculators.architecture import (  # noqa: E402
    Activation,
    Architecture,
    Norm,
    PositionEmbedding,
    count_params,
    tensors,
)
from calculators.presets import PRESETS  # noqa: E402
from measure.mlp_presets import MLPSpec, mlp_preset  # noqa: E402
from measure.workloads import ReferenceMLP, gpt_workload, mlp_tensors  # noqa: E402

ARCHS = {
    "gpt2-style": Architecture(layers=2, hidden=64, heads=4, vocab_size=100, max_seq_len=32),
    "tied": Architecture(
        layers=2, hidden=64, heads=4, vocab_size=100, max_seq_len=32, tied_embeddings=True
    ),
    "llama-style": Architecture(
        layers=2,
        hidden=64,
        heads=8,
        kv_heads=2,
        ffn_hidden=96,
        vocab_size=100,
        bias=False,
        norm=Norm.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        gated_mlp=True,
        activation=Activation.SILU,
    ),
    "mixtral-style": Architecture(
        layers=2,
        hidden=64,
        heads=4,
        kv_heads=2,
        ffn_hidden=32,
        vocab_size=100,
        bias=False,
        norm=Norm.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        gated_mlp=True,
        num_experts=4,
        experts_per_token=2,
    ),
    "qwen2-style": Architecture(
        layers=1,
        hidden=64,
        heads=4,
        vocab_size=100,
        bias=False,
        qkv_bias=True,
        norm=Norm.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        gated_mlp=True,
    ),
    "opt-style": Architecture(
        layers=2,
        hidden=64,
        heads=4,
        vocab_size=100,
        max_seq_len=32,
        position_offset=2,
        embed_proj_dim=32,
        activation=Activation.RELU,
        tied_embeddings=True,
    ),
    "bloom-style": Architecture(
        layers=2,
        hidden=64,
        heads=4,
        vocab_size=100,
        position_embedding=PositionEmbedding.ALIBI,
        embedding_norm=True,
        tied_embeddings=True,
    ),
    "head-bias": Architecture(
        layers=1, hidden=64, heads=4, vocab_size=100, max_seq_len=8, lm_head_bias=True
    ),
}


@pytest.mark.parametrize("arch", ARCHS.values(), ids=ARCHS.keys())
def test_named_parameters_match_calculator_tensors(arch: Architecture) -> None:
    module = gpt_workload(arch, 1, 8).build(torch.device("meta"))
    got = [(name, tuple(p.shape)) for name, p in module.named_parameters()]
    assert got == [(t.name, t.shape) for t in tensors(arch)]
    assert sum(p.numel() for p in module.parameters()) == count_params(arch)


@pytest.mark.parametrize("name", ["gpt2", "llama3-8b", "mixtral-8x7b", "bloom-176b"])
def test_presets_build_with_their_published_layout(name: str) -> None:
    # the canonical decoder of the preset's shape (a preset that names a transformers family
    # is measured with transformers' modelling code, whose list splits the qkv projection)
    arch = replace(PRESETS[name].architecture, modelling=None)
    module = gpt_workload(arch, 1, 8).build(torch.device("meta"))
    got = [(n, tuple(p.shape)) for n, p in module.named_parameters()]
    assert got == [(t.name, t.shape) for t in tensors(arch)]


@pytest.mark.parametrize("arch", ARCHS.values(), ids=ARCHS.keys())
def test_decoder_trains_one_step(arch: Architecture) -> None:
    work = gpt_workload(arch, 2, 8)
    module = work.build(torch.device("cpu"))
    x, y = work.make_batch(torch.device("cpu"), torch.Generator().manual_seed(0))
    _, loss = work.forward(module, x, y)
    loss.backward()
    assert all(p.grad is not None for p in module.parameters())


def test_reference_mlp_preset() -> None:
    assert mlp_preset("mlp") == MLPSpec(12, 2048, 32)
    assert mlp_preset("mlp-12x2048") == MLPSpec(12, 2048, 32)
    assert mlp_preset("mlp-12x2048") == MLPSpec(12, 2048, 32)
    assert mlp_preset("mlp-3x64") == MLPSpec(3, 64, 32)
    assert mlp_preset("gpt2") is None
    module = ReferenceMLP(MLPSpec(3, 64))
    got = [(n, tuple(p.shape)) for n, p in module.named_parameters()]
    assert got == [(n, s) for n, s, _ in mlp_tensors(MLPSpec(3, 64))]


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("position", [PositionEmbedding.ROPE, PositionEmbedding.LEARNED])
@pytest.mark.parametrize("gated", [True, False])
def test_one_block_saves_what_the_formula_counts(
    kv_heads: int, position: PositionEmbedding, gated: bool
) -> None:
    """What autograd saves in one bf16 block of the canonical module, storage by storage,
    against ``layer_activations`` (RoPE's rotated copies, grouped heads' expanded k and v)."""
    from calculators.activations import Regime, layer_activations
    from calculators.batch import Batch
    from measure.workloads import Block

    arch = Architecture(
        layers=1,
        hidden=256,
        heads=4,
        kv_heads=kv_heads,
        vocab_size=512,
        max_seq_len=512,
        ffn_hidden=1024,
        activation=Activation.SILU if gated else Activation.GELU,
        gated_mlp=gated,
        bias=not gated,
        position_embedding=position,
    )
    block = Block(arch).to(torch.bfloat16)
    x = torch.randn(2, 512, 256, dtype=torch.bfloat16, requires_grad=True)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    counted = sum(n for ptr, n in saved.items() if ptr not in params)
    layer = layer_activations(arch, Batch(2, 512), Regime.HALF)
    formula = layer.norms + layer.linear_inputs + layer.attention + layer.mlp
    # on the CPU LayerNorm keeps its mean and rstd in bf16 (2 B each per token), on the GPU
    # in fp32 as the formula counts: two norms
    tokens = 2 * 512
    assert counted == formula - 2 * 2 * tokens * (4 - 2)
