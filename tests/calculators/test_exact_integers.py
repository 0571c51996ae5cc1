"""The integer shortcuts of the hot paths give the exact rational figures (hypothesis).

``ceil_div``, the model-state shares and the bytes a collective sends are computed with integer
numerators and denominators instead of ``Fraction`` products; each is checked here against the
rational formula it replaces, ⌈x⌉ of the exact number.
"""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from calculators.communication import estimate_communication, stage_communication
from calculators.conventions import (
    GradientConvention,
    OffloadDevice,
    Optimizer,
    Precision,
    Stage,
)
from calculators.cost import alpha_beta_seconds
from calculators.model_states import (
    Offload,
    TrainingSetup,
    bytes_per_param,
    ceil_div,
    model_state_memory,
    partitioned,
)
from calculators.topology import Group, Op, bus_factor, make_topology, sent_factor
from calculators.traffic import Collective, CommunicationSetup, Phase

fractions = st.fractions(min_value=0, max_value=1024, max_denominator=10**6)


@given(st.integers(min_value=-(10**30), max_value=10**30), st.integers(1, 10**9))
def test_ceil_div_of_integers(n: int, d: int) -> None:
    assert ceil_div(n, d) == math.ceil(Fraction(n, d))


@given(fractions, st.integers(1, 10**13), st.integers(1, 2**16))
def test_ceil_div_of_fractions(b: Fraction, psi: int, d: int) -> None:
    assert ceil_div(b * psi, d) == math.ceil(b * psi / d)


setups = st.builds(
    TrainingSetup,
    params=st.integers(min_value=1, max_value=10**13),
    dp=st.integers(min_value=1, max_value=2**16),
    precision=st.sampled_from(list(Precision)),
    optimizer=st.sampled_from(list(Optimizer)),
    k=st.none() | fractions,
    gradients=st.sampled_from(list(GradientConvention)),
    master_weights=st.booleans(),
    offload=st.builds(
        Offload,
        optimizer=st.sampled_from(list(OffloadDevice)),
        params=st.sampled_from(list(OffloadDevice)),
    ),
)


@given(setups, st.sampled_from(list(Stage)))
def test_model_states_are_the_rational_shares(setup: TrainingSetup, stage: Stage) -> None:
    """⌈b·Ψ / N⌉ per state (ZeRO §5), then offload moves whole shares: nothing is lost."""
    if (setup.offload.optimizer is not OffloadDevice.NONE and stage < Stage.OPTIMIZER) or (
        setup.offload.params is not OffloadDevice.NONE and stage < Stage.PARAMETERS
    ):
        return  # refused (check_offload), tested elsewhere
    per = bytes_per_param(setup)
    split = partitioned(stage)
    shares = [
        math.ceil(b * setup.params / (setup.dp if s else 1))
        for b, s in zip((per.parameters, per.gradients, per.optimizer_states), split, strict=True)
    ]
    m = model_state_memory(setup, stage)
    for i, name in enumerate(("parameters", "gradients", "optimizer_states")):
        places = [getattr(p, name) for p in (m.device, m.cpu, m.nvme)]
        assert sum(places) == shares[i]
        assert sorted(places)[:2] == [0, 0]  # each state lives in one place
    if setup.offload.optimizer is OffloadDevice.NONE:
        assert m.device.optimizer_states == shares[2]


@given(
    st.sampled_from(list(Op)),
    st.integers(1, 4096),
    st.integers(0, 10**13),
    st.integers(1, 64),
)
def test_sent_bytes_are_the_rounded_exact_bytes(op: Op, n: int, payload: int, calls: int) -> None:
    c = Collective(op, Phase.BACKWARD, calls, payload, "bf16", Group(n, 1, n), "gradients")
    assert c.exact_sent == payload * sent_factor(op, n)
    assert c.sent_bytes_per_rank == math.ceil(c.exact_sent)


@given(
    st.integers(1, 10**12),
    st.sampled_from([1, 8, 64, 96]),
    st.sampled_from(["paper", "deepspeed", "torch"]),
    st.sampled_from(list(Precision)),
)
def test_one_ddp_reference_for_all_stages(params: int, dp: int, engine: str, p: Precision) -> None:
    """estimate_communication builds the DDP reference once: each stage as if asked alone."""
    from calculators.conventions import Engine

    training = TrainingSetup(params=params, dp=dp, precision=p, engine=Engine(engine))
    setup = CommunicationSetup(training, make_topology(dp, 1, 1, None, None))
    together = estimate_communication(setup, list(Stage)).stages
    assert together == tuple(stage_communication(setup, s) for s in Stage)


@given(
    st.integers(1, 64),
    st.fractions(min_value=0, max_value=1, max_denominator=10**12),
    st.integers(0, 10**13),
    st.sampled_from(list(Op)),
    st.integers(2, 4096),
    st.integers(1, 10**12) | st.fractions(min_value=1, max_value=10**12, max_denominator=64),
)
def test_seconds_are_the_rounded_exact_time(
    calls: int, latency: Fraction, payload: int, op: Op, n: int, bandwidth: Fraction | int
) -> None:
    """α–β time over integers: the same float as the Fraction formula it replaces."""
    factor = bus_factor(op, n)
    exact = calls * (latency + Fraction(payload, calls) * factor / bandwidth)
    assert alpha_beta_seconds(calls, latency, payload, factor, bandwidth) == float(exact)
