"""A bare parameter count taken as the dense decoder it implies (calculators.parameters)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.communication import estimate_communication
from calculators.conventions import Engine, OffloadDevice, Stage
from calculators.engines.deepspeed.config import Knobs, param_list
from calculators.engines.deepspeed.stage3 import stage3_plan, stage3_trace
from calculators.memory import estimate
from calculators.model_states import Offload, TrainingSetup
from calculators.parameters import (
    ParamList,
    architecture_params,
    first_block_span,
    implied_decoder,
    implied_params,
    param_numels,
    shape_counts,
    tally,
)
from calculators.presets import PRESETS
from calculators.topology import Op, make_topology
from calculators.traffic import CommunicationSetup, Phase

DENSE = [name for name, p in PRESETS.items() if p.architecture.num_experts == 1]


def test_llama2_7b_count_gives_back_its_tensors() -> None:
    # 6,738,415,616 = Llama 2 7B: 32 × 4096, 32 heads of 128, MLP 11008, vocabulary 32000
    preset = PRESETS["llama2-7b"]
    implied = implied_decoder(preset.params)
    assert implied is not None and implied.leftover == 0
    # the canonical decoder's tensors (one fused qkv projection where transformers has three)
    canonical = replace(preset.architecture, modelling=None)
    assert [(p.name, p.shape) for p in implied_params(preset.params) or ()] == [
        (p.name, p.shape) for p in architecture_params(canonical)
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


@settings(max_examples=25, deadline=None)
@given(
    st.integers(min_value=8_258_304, max_value=10**15),
    st.sampled_from([0, 100_000, 10**9]),
    st.sampled_from([0, 10**6, 2**63 - 1]),
    st.sampled_from([0, 300_000, 10**9]),
    st.sampled_from([0, 50_000_000, 10**12]),
    st.sampled_from([0, 10**9]),
)
def test_grown_first_block_walks_as_its_named_tensors(
    psi: int, persistence: int, model_persistence: int, live: int, prefetch: int, reuse: int
) -> None:
    # the leftover makes the first block a kind of its own: the list read from its template
    # (each block's copies at once) is the same list, and the stage-3 coordinator walks it
    # exactly as it walks the named tensors one by one
    params = implied_params(psi)
    assert params is not None
    named = tuple(params.tensors) if isinstance(params, ParamList) else tuple(params)
    assert tuple(params) == named and list(param_numels(params)) == [p.numel for p in named]
    assert tally(param_numels(params)) == Counter(p.numel for p in named)
    assert shape_counts(params) == Counter(p.shape for p in named)
    assert first_block_span(params) == first_block_span(named)
    if isinstance(params, ParamList):  # each template tensor is the list's tensor it stands for
        template, t = params.template, params.template.first
        assert template.tensors[:t] == named[:t]
        for k, kind in enumerate(template.kinds):
            for p in template.tensors[t : t + kind.pre + kind.expert + kind.post]:
                assert named[template.index(t, k)] == p
                t += 1
        assert template.tensors[t:] == named[template.index(t, None) :]
    knobs = Knobs(
        param_persistence_threshold=persistence,
        model_persistence_threshold=model_persistence,
        max_live_parameters=live,
        prefetch_bucket_size=prefetch,
        max_reuse_distance=reuse,
    )
    assert stage3_trace(params, knobs) == stage3_trace(named, knobs)
    assert stage3_plan(params, 8, knobs) == stage3_plan(named, 8, knobs)
