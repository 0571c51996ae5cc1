"""What each DeepSpeed allocation is handed by torch's CUDA caching allocator
(``calculators.caching_allocator``).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from functools import lru_cache
from itertools import groupby

from calculators.caching_allocator import (
    BLOCK,
    K_LARGE_BUFFER,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_SIZE,
    Block,
    CachingAllocator,
    block,
)
from calculators.collector import collector_paused
from calculators.conventions import FP32_BYTES, HALF_BYTES
from calculators.parameters import Numels, tally


def blocks(element_bytes: int, numels: Sequence[int]) -> int:
    """One allocation per tensor (summed once per distinct size)."""
    # an architecture's sizes carry their tally, read here without the copy ``tally`` makes
    counts = numels.sizes if isinstance(numels, Numels) else tally(numels)
    return sum(count * block(element_bytes * n) for n, count in counts.items())


# the most elements of a tensor whose fp32 copy the small pool serves: block(4 n) <= kSmallSize
# (kSmallSize is a multiple of BLOCK)
SMALL_POOL_FP32_ELEMENTS = K_SMALL_SIZE // FP32_BYTES


def stage0_unsplit_bytes(numels: Sequence[int], n_states: int, adam: bool) -> tuple[int, int]:
    """Bytes the allocator hands out beyond the rounded requests of stage 0's tensors.

    Replays DeepSpeed's allocation order on a fresh device: the module is cast on the host and
    moved tensor by tensor (engine.py ``_configure_distributed_model``); each fp32 master is
    ``p.clone().float()`` (the 16-bit clone freed, unfused_optimizer.py:72-77);
    ``initialize_optimizer_states`` (:413-433) makes zero 16-bit then fp32 gradients and runs one
    Adam step, whose ``_init_group`` creates each parameter's states in turn and whose foreach
    path allocates the ``_foreach_sqrt`` temporaries, then frees them and the gradients.

    Returns:
        (persistent, step): the excess on the 16-bit weights, masters and states, and on the
        step's gradients and temporaries at the init step (used for the training step, whose
        cache also holds activation blocks: an estimate).
    """
    # Only the large pool hands out blocks bigger than asked: sizes are multiples of BLOCK, so a
    # small-pool remainder is 0 or >= BLOCK and always split off. The pools share no block
    # (a segment serves one pool; merges stay inside it), so the small requests are skipped.
    # The 16-bit copies of a tensor go to the small pool whenever its fp32 copy does.
    if max(tally(numels), default=0) <= SMALL_POOL_FP32_ELEMENTS:
        return 0, 0
    large = tuple(filter(SMALL_POOL_FP32_ELEMENTS.__lt__, numels))
    return _replay(large, n_states, adam)


def replay_mallocs(large: Sequence[int], n_states: int, adam: bool) -> tuple[int, int]:
    """``stage0_unsplit_bytes`` on the large-pool tensors alone, in order, one malloc at a time
    on ``CachingAllocator`` (the reference ``_replay`` is held to)."""
    alloc = CachingAllocator()

    def get(nbytes: int) -> tuple[Block, int] | None:
        if max(block(nbytes), BLOCK) <= K_SMALL_SIZE:
            return None
        return alloc.malloc(nbytes), block(nbytes)

    def excess(blocks: list[tuple[Block, int] | None]) -> int:
        return sum(got[0].size - got[1] for got in blocks if got is not None)

    kept = [get(HALF_BYTES * n) for n in large]
    for n in large:
        clone = get(HALF_BYTES * n)
        kept.append(get(FP32_BYTES * n))
        if clone is not None:
            alloc.free(clone[0])
    g16 = [get(HALF_BYTES * n) for n in large]
    g32 = [get(FP32_BYTES * n) for n in large]
    for n in large:
        kept += [get(FP32_BYTES * n) for _ in range(n_states)]
    temps = [get(FP32_BYTES * n) for n in large] if adam else []
    return excess(kept), excess(g16 + g32 + temps)


# --- the same replay over runs of identical tensors ----------------------------------------------
# In this allocation order the excess depends on the sizes of the free blocks alone, not on
# where they lie. Blocks are only freed by the 16-bit clones, each right after its fp32 master is
# allocated, and no two free blocks are ever neighbours (a freed block merges with free ones), so
# a clone merges back with nothing but the rest split off its own block, if that is still free.
# The one place where an address could decide is a tie for the master between that rest R and
# another free block of R's size; but such a block would be at least the clone's size and
# smaller than the clone's block, so best fit would have handed it to the clone instead.


def _segment(size: int) -> int:
    """The segment cudaMalloc'd for a large-pool request of ``size`` bytes no cached block fits."""
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def _chain(free: int, size: int) -> tuple[int, int, int]:
    """A free block of ``free`` >= ``size`` bytes serving consecutive requests of ``size`` while
    it stays the best fit (each split-off rest is smaller than every other fitting block): the
    requests it serves, the excess of the last one, and what is left free (< ``size``)."""
    splits = max(0, -(-(free - size - K_SMALL_SIZE) // size))  # while the rest is > 1 MiB
    rest = free - splits * size
    if rest >= size:  # handed out whole
        return splits + 1, rest - size, 0
    return splits, 0, rest


class _SizePool:
    """The large pool's free blocks as a multiset of sizes."""

    def __init__(self) -> None:
        self.count: dict[int, int] = {}
        self.sizes: list[int] = []  # the distinct sizes, ascending
        self.journaling = False  # whether each change of a count is written to the journal
        self.journal: list[tuple[int, int]] = []

    def add(self, size: int, n: int = 1) -> None:
        if self.journaling:
            self.journal.append((size, n))
        if size in self.count:
            self.count[size] += n
        else:
            insort(self.sizes, size)
            self.count[size] = n

    def take(self, size: int, n: int = 1) -> None:
        if self.journaling:
            self.journal.append((size, -n))
        left = self.count[size] - n
        if left:
            self.count[size] = left
        else:
            del self.count[size]
            self.sizes.pop(bisect_left(self.sizes, size))

    def fit(self, size: int) -> int | None:
        """The best fit for ``size`` bytes: the smallest free block at least that big."""
        i = bisect_left(self.sizes, size)
        return self.sizes[i] if i < len(self.sizes) else None

    def malloc(self, size: int) -> tuple[int, int, int]:
        """One request: the bytes handed out, the rest split off (0 if none), the block taken."""
        got = self.fit(size)
        if got is None:
            got = _segment(size)
        else:
            self.take(got)
        rest = got - size
        if rest > K_SMALL_SIZE:
            self.add(rest)
            return size, rest, got
        return got, 0, got

    def run(self, size: int, k: int) -> int:
        """``k`` consecutive requests of ``size`` bytes (0: small pool, skipped): their excess.

        Best fit takes the smallest fitting block and splits its rest off, smaller than every
        other fitting block, so each block serves requests until what is left no longer fits
        (``_chain``); blocks of one size, and the new segments once none fits, serve alike."""
        excess = 0
        while size and k:
            got = self.fit(size)
            fresh = got is None
            if got is None:  # new segments, each carved alike
                got = _segment(size)
            served, last, left = _chain(got, size)
            copies = k if fresh else self.count[got]
            whole = min(copies, k // served)
            if whole:
                if not fresh:
                    self.take(got, whole)
                excess += whole * last
                k -= whole * served
                if left:
                    self.add(left, whole)
            if k and whole < copies:  # fewer requests left than the block serves: each splits it
                if not fresh:
                    self.take(got)
                self.add(got - k * size)
                k = 0
        return excess

    def clone_group(self, clone: int, master: int) -> int:
        """A 16-bit clone, its fp32 master, the clone freed: the master's excess."""
        _, rest, source = self.malloc(clone)
        got, _, taken = self.malloc(master)
        if not rest:  # the clone's block, handed out whole, is free again
            self.add(source)
        elif taken == rest:  # the master took the rest off the clone's block: the clone stays apart
            self.add(clone)
        else:  # the clone merges back with its rest
            self.take(rest)
            self.add(source)
        return got - master

    def clone_run(self, clone: int, master: int, k: int) -> int:
        """``k`` clone groups alike: the masters' excess.

        Each request is decided by which sizes are free: the master takes the smallest free
        size at least its own, the clone the smallest at least its own, below the master's only
        if one is there (and gives that block back whole: its rest is too small for the master).
        Blocks below the master's size only ever come back or accumulate. So once the smallest
        size between the two and the set of sizes at least the master's recur, the groups in
        between repeat, each changing the counts alike, for as long as every size they take
        from stays free throughout."""
        excess = 0
        self.journal, self.journaling = [], True
        # each state's last few times: (groups done, excess, journal length, counts above)
        seen: dict[tuple[int, tuple[int, ...]], list[tuple[int, int, int, tuple[int, ...]]]] = {}
        done = 0
        while done < k:
            i = bisect_left(self.sizes, master)
            if len(self.sizes) - i <= 64:
                lower = self.fit(clone)
                above = tuple(self.sizes[i:])
                key = (lower if lower is not None and lower < master else 0, above)  # 0: none
                counts = tuple(self.count[s] for s in above)
                times = seen.setdefault(key, [])
                for then in reversed(times):
                    start, excess_then = then[:2]
                    periods, change = self._repeats(then, above, master, k - done, done - start)
                    if periods:
                        for size, n in change.items():
                            if n > 0:
                                self.add(size, periods * n)
                            elif n < 0:
                                self.take(size, -periods * n)
                        excess += periods * (excess - excess_then)
                        done += periods * (done - start)
                        seen.clear()
                        break
                else:
                    times.append((done, excess, len(self.journal), counts))
                    del times[:-16]
                if not seen:
                    continue
            excess += self.clone_group(clone, master)
            done += 1
        self.journal, self.journaling = [], False
        return excess

    def _repeats(
        self,
        then: tuple[int, int, int, tuple[int, ...]],
        above: tuple[int, ...],
        master: int,
        groups_left: int,
        period: int,
    ) -> tuple[int, dict[int, int]]:
        """How many more times the last ``period`` groups, which began in state ``then`` with
        the same sizes free at least the master's (``above``), repeat alike within
        ``groups_left`` groups; and the change in each size's count one of them makes."""
        counts_then = dict(zip(above, then[3], strict=True))
        change: dict[int, int] = {}
        lowest: dict[int, int] = {}  # each count's lowest on the way, less its count then
        for size, n in self.journal[then[2] :]:
            change[size] = change.get(size, 0) + n
            lowest[size] = min(lowest.get(size, 0), change[size])
        periods = groups_left // period
        for size, n in change.items():
            if size < master:  # only accumulate (see clone_run)
                if n < 0:
                    return 0, change
            elif n:  # so free at both ends: kept free throughout every repeat (more than enough)
                first = counts_then[size] + lowest[size]  # its lowest in the groups seen
                if n > 0 and first <= 0:
                    return 0, change
                if n < 0:
                    periods = min(periods, (first - 1) // -n)
        return max(periods, 0), change


@lru_cache(maxsize=32)
@collector_paused
def _replay(large: tuple[int, ...], n_states: int, adam: bool) -> tuple[int, int]:
    """``replay_mallocs`` over runs of identical tensors, phase by phase as there: each run
    costs about as much as its first few tensors."""
    runs = [(n, len(tuple(same))) for n, same in groupby(large)]

    def size(nbytes: int) -> int:  # the request, 0 for the small pool's
        got = max(block(nbytes), BLOCK)
        return got if got > K_SMALL_SIZE else 0

    pool = _SizePool()
    kept = sum(pool.run(size(HALF_BYTES * n), k) for n, k in runs)
    for n, k in runs:
        clone, master = size(HALF_BYTES * n), size(FP32_BYTES * n)
        kept += pool.clone_run(clone, master, k) if clone else pool.run(master, k)
    step = sum(pool.run(size(HALF_BYTES * n), k) for n, k in runs)
    step += sum(pool.run(size(FP32_BYTES * n), k) for n, k in runs)
    kept += sum(pool.run(size(FP32_BYTES * n), k * n_states) for n, k in runs)
    if adam:
        step += sum(pool.run(size(FP32_BYTES * n), k) for n, k in runs)
    return kept, step
