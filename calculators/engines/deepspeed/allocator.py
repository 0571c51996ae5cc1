"""Enough of torch's CUDA caching allocator to tell what each DeepSpeed allocation is handed.

c10/cuda/CUDACachingAllocator.cpp: every request is rounded up to 512-byte blocks
(``round_size``, ``kMinBlockSize``).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from functools import lru_cache

from calculators.conventions import FP32_BYTES, HALF_BYTES
from calculators.parameters import tally

BLOCK = 512  # CUDACachingAllocator kMinBlockSize: every allocation is a multiple of it


def block(nbytes: int) -> int:
    """Bytes the caching allocator hands out for a request of ``nbytes`` (0 stays 0)."""
    return -(-nbytes // BLOCK) * BLOCK if nbytes > 0 else 0


def blocks(element_bytes: int, numels: Sequence[int]) -> int:
    """One allocation per tensor (summed once per distinct size)."""
    return sum(count * block(element_bytes * n) for n, count in tally(numels).items())


# --- the caching allocator, for stage 0's per-tensor state ------------------------------------
# c10/cuda/CUDACachingAllocator.cpp: requests up to kSmallSize go to the small pool (2 MiB
# segments), larger ones to the large pool (20 MiB segments below kMinLargeAlloc, else rounded
# to kRoundLarge); the smallest cached block that fits is taken (best fit) and split only if
# the rest is >= kMinBlockSize (small pool) or > kSmallSize (large pool), so a cached block
# up to 1 MiB too big is handed out whole; freed blocks merge with free neighbours.
K_SMALL_SIZE = 1024 * 1024
K_SMALL_BUFFER = 2 * 1024 * 1024
K_LARGE_BUFFER = 20 * 1024 * 1024
K_MIN_LARGE_ALLOC = 10 * 1024 * 1024
K_ROUND_LARGE = 2 * 1024 * 1024


class _Block:
    __slots__ = ("free", "key", "next", "prev", "size", "small")

    def __init__(self, key: tuple[int, int], size: int, small: bool) -> None:
        self.key = key  # (segment, offset): the allocator's address order
        self.size = size
        self.small = small
        self.free = True
        self.prev: _Block | None = None
        self.next: _Block | None = None


class CachingAllocator:
    """Enough of the caching allocator to tell the block each request is handed."""

    def __init__(self) -> None:
        self.pools: dict[bool, list[tuple[int, int, int, _Block]]] = {True: [], False: []}
        self.segments = 0

    def _insert(self, b: _Block) -> None:
        insort(self.pools[b.small], (b.size, *b.key, b), key=lambda e: e[:3])

    def _remove(self, b: _Block) -> None:
        pool = self.pools[b.small]
        i = bisect_left(pool, (b.size, *b.key), key=lambda e: e[:3])
        pool.pop(i)

    def malloc(self, nbytes: int) -> _Block:
        size = max(block(nbytes), BLOCK)
        small = size <= K_SMALL_SIZE
        pool = self.pools[small]
        i = bisect_left(pool, (size, -1, -1), key=lambda e: e[:3])
        if i < len(pool):
            b = pool.pop(i)[3]
        else:
            if small:
                segment = K_SMALL_BUFFER
            elif size < K_MIN_LARGE_ALLOC:
                segment = K_LARGE_BUFFER
            else:
                segment = -(-size // K_ROUND_LARGE) * K_ROUND_LARGE
            self.segments += 1
            b = _Block((self.segments, 0), segment, small)
        rest = b.size - size
        if rest >= BLOCK if small else rest > K_SMALL_SIZE:
            r = _Block((b.key[0], b.key[1] + size), rest, small)
            r.prev, r.next = b, b.next
            if b.next is not None:
                b.next.prev = r
            b.next, b.size = r, size
            self._insert(r)
        b.free = False
        return b

    def free(self, b: _Block) -> None:
        b.free = True
        prev, nxt = b.prev, b.next
        if prev is not None and prev.free:
            self._remove(prev)
            prev.size += b.size
            prev.next = nxt
            if nxt is not None:
                nxt.prev = prev
            b = prev
        nxt = b.next
        if nxt is not None and nxt.free:
            self._remove(nxt)
            b.size += nxt.size
            b.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = b
        self._insert(b)


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


@lru_cache(maxsize=32)
def _replay(large: tuple[int, ...], n_states: int, adam: bool) -> tuple[int, int]:
    """``stage0_unsplit_bytes`` on the large-pool tensors alone, in order."""
    alloc = CachingAllocator()

    def get(nbytes: int) -> tuple[_Block, int] | None:
        if max(block(nbytes), BLOCK) <= K_SMALL_SIZE:
            return None
        return alloc.malloc(nbytes), block(nbytes)

    def excess(blocks: list[tuple[_Block, int] | None]) -> int:
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
