"""How DeepSpeed cuts gradients into reduction buckets (one walk each, used by memory and
traffic alike)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate, repeat
from typing import overload

# runtime/engine.py MEMORY_OPT_ALLREDUCE_SIZE = 500000000: stage 0 (allreduce_gradients ->
# buffered_allreduce_fallback -> allreduce_no_retain) all-reduces buckets of this many elements.
MEMORY_OPT_ALLREDUCE_SIZE = 500_000_000


def ipg_ranges(numels: Sequence[int], prefix: Sequence[int], bucket: int) -> list[tuple[int, int]]:
    """``(first, end)`` of each IPG bucket: its gradients are the non-empty ones of
    ``numels[first:end]`` (``numels[first]`` is one), in the order given; ``prefix`` is
    ``[0, *accumulate(numels)]``.

    stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads and stage3.py
    __add_grad_to_ipg_bucket: the bucket is reduced before a gradient that would overflow it
    (``elements + numel > reduce_bucket_size``); a gradient larger than the bucket goes alone.
    Empty gradients join no bucket. So each bucket is the longest run that fits, found on the
    prefix sums (one search per bucket, not one step per gradient: identical gradients in one
    bucket cost nothing each).
    """
    out: list[tuple[int, int]] = []
    i, n = 0, len(numels)
    while i < n:
        size = numels[i]
        if size == 0:
            i += 1
            continue
        if size > bucket:  # an oversized gradient, reduced on its own
            out.append((i, i + 1))
            i += 1
            continue
        # the run i..end-1 holds at most ``bucket`` elements; the gradient at ``end`` overflows
        end = bisect_right(prefix, prefix[i] + bucket, i + 1) - 1
        out.append((i, end))
        i = end
    return out


def ipg_walk(numels: Sequence[int], bucket: int) -> list[list[int]]:
    """Indices (into ``numels``, in the order given) of each IPG bucket (``ipg_ranges``)."""
    prefix = [0, *accumulate(numels)]
    return [
        list(run) if all(map(numels.__getitem__, run)) else [k for k in run if numels[k]]
        for run in (range(first, end) for first, end in ipg_ranges(numels, prefix, bucket))
    ]


class FullBuckets(Sequence[int]):
    """Ψ cut into ``full`` buckets of ``size`` elements and a last one of ``rest`` (if any),
    without a list entry per bucket (Ψ runs to 1e15, a bucket down to one element)."""

    def __init__(self, full: int, size: int, rest: int) -> None:
        self.full, self.size, self.rest = full, size, rest

    def __len__(self) -> int:
        return self.full + (1 if self.rest else 0)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError(index)
        return self.size if i < self.full else self.rest

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FullBuckets):
            return (self.full, self.size, self.rest) == (other.full, other.size, other.rest)
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which do not hash

    def __iter__(self) -> Iterator[int]:
        yield from repeat(self.size, self.full)
        if self.rest:
            yield self.rest


def ipg_buckets(numels: Sequence[int], bucket: int, *, whole_run: bool) -> Sequence[int]:
    """Elements of each IPG bucket (``ipg_walk``).

    ``whole_run``: the single entry is Ψ of unknown tensors, cut into full buckets.
    """
    if whole_run:
        (psi,) = numels
        full, rest = divmod(psi, bucket)
        return FullBuckets(full, bucket, rest)
    prefix = [0, *accumulate(numels)]
    return [prefix[end] - prefix[first] for first, end in ipg_ranges(numels, prefix, bucket)]


def fallback_buckets(numels: Sequence[int], bucket: int, *, whole_run: bool) -> Sequence[int]:
    """Engine stage-0 buckets (engine.py allreduce_no_retain): closed once they exceed the size."""
    if whole_run:
        return ipg_buckets(numels, bucket + 1, whole_run=True)
    # a bucket closes at the first gradient that takes it past ``bucket``: found on the prefix
    # sums, one search per bucket
    prefix = [0, *accumulate(numels)]
    out: list[int] = []
    start, total = 0, prefix[-1]
    while True:
        end = bisect_right(prefix, prefix[start] + bucket, start)
        if end == len(prefix):
            break
        out.append(prefix[end] - prefix[start])
        start = end
    if total - prefix[start]:
        out.append(total - prefix[start])
    return out


def partition_share(numels: Sequence[int], offsets: Sequence[int], part: int) -> tuple[int, int]:
    """Elements of the whole parameters that start inside rank 0's partition ``[0, part)``
    (stage_1_and_2.py params_in_partition), and the largest slice of one of them inside it.

    ``offsets`` are the prefix sums ``[0, *accumulate(numels)]``. The parameters starting
    before ``part`` are a prefix of the list, found by one search; all but the last of them
    end inside the partition, so their slices are whole.
    """
    inside = bisect_left(offsets, part, 0, len(numels))  # parameters with offset < part
    if not inside:
        return 0, 0
    last = inside - 1
    whole = max(numels[:last], default=0)
    return offsets[inside], max(whole, min(numels[last], part - offsets[last]))
