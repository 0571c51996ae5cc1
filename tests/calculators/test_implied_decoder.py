"""A bare parameter count taken as the dense decoder it implies (calculators.parameters)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.communication import estimate_communication
from calculators.conventions import Engine, OffloadDevice, Stage
from calculators.engines.deepspeed.config import param_list
from calculators.memory import estimate
from calculators.model_states import Offload, TrainingSetup
from calculators.parameters import architecture_params, implied_decoder, implied_params
from calculators.presets import PRESETS
from calculators.topology import Op, make_topology
from calculators.traffic import CommunicationSetup, Phase

DENSE = [name for name, p in PRESETS.items() if p.architecture.num_experts == 1]


def test_llama2_7b_count_gives_back_its_tensors() -> None:
    # 6,738,415,616 = Llama 2 7B: 32 × 4096, 32 heads of 128, MLP 11008, vocabulary 32000
    preset = PRESETS["llama2-7b"]
    implied = implied_decoder(preset.params)
    assert implied is not None and implied.leftover == 0
    assert [(p.name, p.shape) for p in implied_params(preset.params) or ()] == [
        (p.name, p.shape) for p in architecture_params(preset.architecture)
    ]


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=8_258_304, max_value=10**13))
def test_tensors_add_up_to_psi(psi: int) -> None:
    params = implied_params(psi)
    assert params is not None and sum(p.numel for p in params) == psi
    arch = implied_decoder(psi).architecture  # type: ignore[union-attr]
    assert arch.hidden == 128 * arch.layers
    # the MLP width stays near Llama's 8/3 × hidden (it takes what the layer count leaves)
    if arch.layers > 1:  # one layer: whatever the 32,000-row embedding and head leave
        assert arch.ffn >= 2 * arch.hidden
    if arch.layers >= 16:
        assert arch.ffn <= 3.5 * arch.hidden


def test_below_the_smallest_shape_psi_stays_one_tensor() -> None:
    assert implied_decoder(8_258_303) is None  # one layer 128 wide with a 1-wide MLP: 8,258,304
    params, per_tensor = param_list(TrainingSetup(params=1_000_000, dp=8))
    assert [p.numel for p in params] == [1_000_000] and not per_tensor


def _stage3(psi: int, arch: object, dp: int, engine: Engine) -> tuple[float, int]:
    training = TrainingSetup(params=psi, dp=dp, engine=engine, architecture=arch)  # type: ignore[arg-type]
    setup = CommunicationSetup(training=training, topology=make_topology(dp, 1, 1, None, 8))
    (s3,) = estimate_communication(setup, [Stage.PARAMETERS]).stages
    return s3.sent_bytes_per_rank, sum(c.collective.calls for c in s3.collectives)


@pytest.mark.parametrize("name", DENSE)
@pytest.mark.parametrize("dp", [8, 64])
def test_deepspeed_stage3_bare_count_sends_what_the_architecture_sends(name: str, dp: int) -> None:
    # the parameters the coordinator releases in forward are gathered again in backward: a
    # bare count of a 70B model sends ~1.5 Ψ per rank like its architecture, not 1.0 Ψ
    preset = PRESETS[name]
    real, _ = _stage3(preset.params, preset.architecture, dp, Engine.DEEPSPEED)
    bare, _ = _stage3(preset.params, None, dp, Engine.DEEPSPEED)
    assert abs(bare - real) / real < 0.015, (bare, real)


def test_llama2_70b_bare_count_regathers_in_backward() -> None:
    psi = PRESETS["llama2-70b"].params
    training = TrainingSetup(params=psi, dp=64, engine=Engine.DEEPSPEED)
    setup = CommunicationSetup(training=training, topology=make_topology(64, 1, 1, None, 8))
    (s3,) = estimate_communication(setup, [Stage.PARAMETERS]).stages
    assert s3.ratio_to_ddp is not None and 1.45 < s3.ratio_to_ddp < 1.5
    backward = [
        c.collective
        for c in s3.collectives
        if c.collective.op is Op.ALL_GATHER and c.collective.phase is Phase.BACKWARD
    ]
    assert backward and backward[0].payload_bytes > 1.9 * psi  # 16-bit, most of Ψ again
    assert any("70 layers × hidden 8960" in n for n in s3.notes)


def test_torch_fsdp2_gathers_per_implied_block() -> None:
    # FSDP2 fully_shard per block and the root: one all-gather call per group and micro-step
    psi = PRESETS["llama2-13b"].params
    _, calls = _stage3(psi, None, 8, Engine.TORCH)
    _, real_calls = _stage3(psi, PRESETS["llama2-13b"].architecture, 8, Engine.TORCH)
    assert calls == real_calls == 3 * (40 + 1)


def test_deepspeed_offload_staging_is_the_largest_implied_tensor() -> None:
    psi = 21_474_836_480
    setup = TrainingSetup(
        params=psi,
        dp=8,
        engine=Engine.DEEPSPEED,
        offload=Offload(optimizer=OffloadDevice.CPU),
    )
    (s2,) = estimate(setup, [Stage.GRADIENTS]).stages
    largest = max(p.numel for p in implied_params(psi) or ())
    assert s2.components["offload_grad_staging"] == 2 * largest < 2 * psi // 50
