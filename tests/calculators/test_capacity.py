"""Growing an architecture's shape and the searches over it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from calculators.architecture import count_params
from calculators.batch import Batch
from calculators.capacity import Shape, grown_params, largest_shape, min_dp, needed
from calculators.conventions import Engine, OffloadDevice, Precision, Stage
from calculators.memory import estimate
from calculators.model_states import Offload, TrainingSetup
from calculators.presets import PRESETS, get_preset

GIB = 2**30


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_shape_at_its_own_depth_is_itself(name: str) -> None:
    base = get_preset(name).architecture
    assert Shape(base).at(base.layers) == base


def test_llama2_7b_grown_to_40_layers_is_llama2_13b() -> None:
    # Llama 2 (arXiv 2307.09288): 7B is 32 × 4096, 13B is 40 × 5120 with ffn 13824 (the
    # reference code's multiple_of = 256 rounding of 11008 × 5120 / 4096)
    grown = Shape(get_preset("llama2-7b").architecture).at(40)
    assert grown == get_preset("llama2-13b").architecture


@pytest.mark.parametrize("name", ["gpt2", "bloom-176b", "llama3-8b", "mixtral-8x7b"])
@pytest.mark.parametrize("layers", [1, 3, 40])
def test_grown_params_counts_every_tensor(name: str, layers: int) -> None:
    arch = Shape(get_preset(name).architecture).at(layers)
    assert grown_params(arch) == count_params(arch)


def test_grown_parameters_never_shrink_with_depth() -> None:
    shape = Shape(get_preset("llama3-8b").architecture)
    counts = [count_params(shape.at(n)) for n in range(1, 200, 7)]
    assert counts == sorted(counts)
    assert shape.max_layers >= 200


SETUPS = [
    TrainingSetup(params=1, dp=8, engine=Engine.PAPER),
    TrainingSetup(
        params=1,
        dp=8,
        engine=Engine.DEEPSPEED,
        precision=Precision.MIXED_BF16,
        offload=Offload(optimizer=OffloadDevice.CPU),
        batch=Batch(micro_batch_size=1, seq_len=4096),
    ),
    TrainingSetup(
        params=1,
        dp=8,
        engine=Engine.TORCH,
        precision=Precision.MIXED_BF16,
        batch=Batch(micro_batch_size=2, seq_len=1024),
    ),
]


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.engine.value)
def test_the_largest_shape_fits_and_one_more_layer_does_not(setup: TrainingSetup) -> None:
    shape = Shape(get_preset("llama3-8b").architecture)
    device = 40 * GIB
    stage = Stage.GRADIENTS
    found = largest_shape(setup, shape, stage, device)
    assert found is not None

    def need(layers: int) -> int:
        arch = shape.at(layers)
        trial = replace(setup, params=count_params(arch), architecture=arch)
        return needed(estimate(trial, [stage]).stages[0])

    assert need(found.layers) <= device < need(found.layers + 1)


def test_no_block_fits_a_tiny_device() -> None:
    shape = Shape(get_preset("llama3-8b").architecture)
    setup = replace(SETUPS[1], dp=1)
    assert largest_shape(setup, shape, Stage.GRADIENTS, 10**9) is None


def test_min_dp_is_the_first_nd_that_fits() -> None:
    arch = get_preset("llama3-8b").architecture
    setup = replace(SETUPS[1], params=count_params(arch), architecture=arch, offload=Offload())
    n = min_dp(setup, Stage.PARAMETERS, 40 * GIB)
    assert n is not None and n > 1
    fits = [
        needed(estimate(replace(setup, dp=d), [Stage.PARAMETERS]).stages[0]) for d in (n - 1, n)
    ]
    assert fits[0] > 40 * GIB >= fits[1]


@pytest.mark.parametrize("max_dp", [1, 3, 13, 14, 64])
@pytest.mark.parametrize("stage", list(Stage))
def test_min_dp_equals_a_linear_scan(stage: Stage, max_dp: int) -> None:
    setup = TrainingSetup(params=70 * 10**9, dp=1)
    device = 80 * 10**9

    def fits(n: int) -> bool:
        return needed(estimate(replace(setup, dp=n), [stage]).stages[0]) <= device

    scan = next((n for n in range(1, max_dp + 1) if fits(n)), None)
    assert min_dp(setup, stage, device, max_dp) == scan
