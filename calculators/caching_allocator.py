"""Enough of torch's CUDA caching allocator to tell the block each request is handed.

c10/cuda/CUDACachingAllocator.cpp: every request is rounded up to 512-byte blocks
(``round_size``, ``kMinBlockSize``); requests up to kSmallSize go to the small pool (2 MiB
segments), larger ones to the large pool (20 MiB segments below kMinLargeAlloc, else rounded
to kRoundLarge); the smallest cached block that fits is taken (best fit) and split only if
the rest is >= kMinBlockSize (small pool) or > kSmallSize (large pool), so a cached block
up to 1 MiB too big is handed out whole, and ``memory_allocated`` counts the whole block;
freed blocks merge with free neighbours. Each engine replays its own allocation order on it.
"""

from __future__ import annotations

from bisect import bisect_left, insort

BLOCK = 512  # CUDACachingAllocator kMinBlockSize: every allocation is a multiple of it

ACTIVATION_BLOCKS_NOTE = (
    "peak counts activations at what they ask for (512-byte rounded), not at the cached blocks "
    "the allocator hands them whole (up to 1 MiB beyond a request over 1 MiB), which "
    "max_memory_allocated counts: a few percent more on steps of a few hundred MiB"
)
"""Said beside every peak that has a step: the blocks the replay of a step's allocation order
would give are not modelled (a run's whole history replayed gives them to the byte)."""


def block(nbytes: int) -> int:
    """Bytes the caching allocator hands out for a request of ``nbytes`` (0 stays 0)."""
    return -(-nbytes // BLOCK) * BLOCK if nbytes > 0 else 0


K_SMALL_SIZE = 1024 * 1024
K_SMALL_BUFFER = 2 * 1024 * 1024
K_LARGE_BUFFER = 20 * 1024 * 1024
K_MIN_LARGE_ALLOC = 10 * 1024 * 1024
K_ROUND_LARGE = 2 * 1024 * 1024


class Block:
    """A block of one segment: its address (segment, offset), its size and pool, whether it is
    free, and its neighbours in the segment (free neighbours merge)."""

    __slots__ = ("free", "key", "next", "prev", "size", "small")

    def __init__(self, key: tuple[int, int], size: int, small: bool) -> None:
        self.key = key  # (segment, offset): the allocator's address order
        self.size = size
        self.small = small
        self.free = True
        self.prev: Block | None = None
        self.next: Block | None = None


class CachingAllocator:
    """Enough of the caching allocator to tell the block each request is handed."""

    def __init__(self) -> None:
        self.pools: dict[bool, list[tuple[int, int, int, Block]]] = {True: [], False: []}
        self.segments = 0

    def _insert(self, b: Block) -> None:
        insort(self.pools[b.small], (b.size, *b.key, b), key=lambda e: e[:3])

    def _remove(self, b: Block) -> None:
        pool = self.pools[b.small]
        i = bisect_left(pool, (b.size, *b.key), key=lambda e: e[:3])
        pool.pop(i)

    def malloc(self, nbytes: int) -> Block:
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
            b = Block((self.segments, 0), segment, small)
        rest = b.size - size
        if rest >= BLOCK if small else rest > K_SMALL_SIZE:
            r = Block((b.key[0], b.key[1] + size), rest, small)
            r.prev, r.next = b, b.next
            if b.next is not None:
                b.next.prev = r
            b.next, b.size = r, size
            self._insert(r)
        b.free = False
        return b

    def free(self, b: Block) -> None:
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
