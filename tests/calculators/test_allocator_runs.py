"""Stage 0's allocator replay over runs of identical tensors gives, byte for byte, what the replay
one malloc at a time on the caching allocator gives (``replay_mallocs``, the oracle here), and
costs as much for a run of a hundred thousand tensors as for one of a few."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calculators.caching_allocator import K_MIN_LARGE_ALLOC, K_SMALL_SIZE
from calculators.engines.deepspeed import allocator
from calculators.engines.deepspeed.allocator import (
    _replay,
    _SizePool,
    replay_mallocs,
    stage0_unsplit_bytes,
)

MIB = 1024 * 1024
# element counts whose 16-bit or fp32 copies sit at the allocator's thresholds: the small pool's
# 1 MiB, the 10 MiB below which a 20 MiB segment is cut, the 20 MiB segment itself, a request
# more than 1 MiB smaller than a block (split) or not; 128 elements are one 512-byte fp32 block
EDGES = [
    nbytes // width + offset
    for nbytes in (K_SMALL_SIZE, 2 * MIB, K_MIN_LARGE_ALLOC, 19 * MIB, 20 * MIB, 21 * MIB)
    for width in (2, 4)
    for offset in (-128, -1, 0, 1, 128)
]
numel = st.one_of(
    st.sampled_from(EDGES),
    st.integers(K_SMALL_SIZE // 4 - 1000, 3 * MIB),  # 16-bit copy in the small pool or not
    st.integers(3 * MIB, 12 * MIB),  # up to 48 MiB fp32 copies
).filter(lambda n: n > 0)
runs = st.lists(
    st.tuples(numel, st.one_of(st.just(1), st.integers(2, 40), st.integers(41, 160))),
    min_size=1,
    max_size=6,
)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(runs=runs, n_states=st.integers(0, 2), adam=st.booleans())
def test_replay_over_runs_is_the_replay_malloc_by_malloc(
    runs: list[tuple[int, int]], n_states: int, adam: bool
) -> None:
    large = tuple(n for n, count in runs for _ in range(count))
    assert _replay.__wrapped__(large, n_states, adam) == replay_mallocs(large, n_states, adam)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(
    numels=st.lists(numel, min_size=1, max_size=40),
    n_states=st.integers(0, 2),
    adam=st.booleans(),
)
def test_replay_of_mixed_tensors_is_the_replay_malloc_by_malloc(
    numels: list[int], n_states: int, adam: bool
) -> None:
    large = tuple(n for n in numels if 4 * n > K_SMALL_SIZE)
    assert stage0_unsplit_bytes(tuple(numels), n_states, adam) == replay_mallocs(
        large, n_states, adam
    )


@pytest.mark.parametrize(
    "expert",
    [
        1_048_576,  # the widest MoE's experts at hidden 2048: ten 2 MiB or five 4 MiB a segment
        786_432,  # 1.5 MiB and 3 MiB blocks: a 2 MiB rest per segment, left free
        2_000_000,  # 7.6 MiB fp32 copies: a 4.7 MiB rest split off, then too small
        3_145_728,  # 12 MiB fp32 copies, a segment each; 6 MiB clones, 2 MiB left of 20
        3_000_000,  # 11.4 MiB fp32 copies: a 12 MiB segment each, handed out whole
        5_500_000,  # 16-bit copies over 10 MiB too: segments rounded to 2 MiB
    ],
)
def test_a_run_costs_no_more_than_its_first_few_tensors(
    expert: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the experts between other tensors, as in a block; the groups of clone, master and freed
    # clone walked one by one are counted
    walked = 0
    group = _SizePool.clone_group

    def counted(pool: _SizePool, clone: int, master: int) -> int:
        nonlocal walked
        walked += 1
        return group(pool, clone, master)

    monkeypatch.setattr(allocator._SizePool, "clone_group", counted)

    def model(experts: int) -> tuple[int, ...]:
        block = (6_291_456, 2_097_152, 4_194_304) + (expert,) * experts
        return (1_024_000,) + block * 4 + (1_024_000,)

    assert _replay.__wrapped__(model(500), 2, True) == replay_mallocs(model(500), 2, True)
    walked = 0
    _replay.__wrapped__(model(100_000), 2, True)
    assert walked < 4 * 50
