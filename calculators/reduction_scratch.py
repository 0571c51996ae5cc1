"""The global scratch torch's CUDA reduction kernel takes when it sums a gradient over the tokens.

Autograd reduces the gradient of a broadcast operand to the operand's shape
(``validate_outputs`` → ``InputMetadata::reduce_grad``, an ``at::sum_to``): a linear's bias
(``addmm``'s ``self``, tokens × out features summed over the tokens), and the weight of a norm
written as ``weight * hidden`` (transformers' RMSNorm). The sum runs ATen's reduction kernel
(``aten/src/ATen/native/cuda/Reduce.cuh``). Its launch configuration (``setReduceConfig``) splits
a long reduction across thread blocks, and then ``gpu_reduce_kernel`` allocates a staging buffer
for the blocks' partial sums from the caching allocator (``global_memory_size``), freed as soon
as the kernel is queued. The buffer is sized by the launch configuration, not by the tensor:
on a Hopper GPU a 4,096-token sum over 4,096 features stages 128 MiB, 32 KiB per feature, while
the gradient it reads is 32 MiB. This module is that configuration, for the one case autograd
makes: a contiguous (tokens × features) gradient summed over its leading dimension, the reduced
dimension not the fastest-moving one ("vectorize along output").
"""

from __future__ import annotations

from dataclasses import dataclass

from calculators.caching_allocator import block

WARP = 32
MAX_NUM_THREADS = 512  # mnt_wrapper<T>::MAX_NUM_THREADS for every real dtype
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
ACCUMULATOR_BYTES = 4  # arg_t of sum over bf16, fp16 and fp32: float (opmath)


@dataclass(frozen=True)
class ReductionDevice:
    """The two device properties ``setReduceConfig`` reads."""

    multiprocessors: int
    max_threads_per_multiprocessor: int


HOPPER = ReductionDevice(multiprocessors=132, max_threads_per_multiprocessor=2048)
"""H100 SXM and H200: 132 SMs of 2,048 threads (``cudaDeviceProp``)."""


def _last_pow2(n: int) -> int:
    return max(1, 1 << (n.bit_length() - 1)) if n > 0 else 1


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _output_vec_size(features: int) -> int:
    """``get_output_vec_size``: 4 outputs a thread, halved until the output count and the row
    stride divide it (a fresh tensor's base address is 512-byte aligned)."""
    vec = 4
    while features % vec:
        vec //= 2
    return vec


def reduction_scratch(features: int, tokens: int, device: ReductionDevice = HOPPER) -> int:
    """Bytes the caching allocator hands out for the staging buffer and semaphores of one
    ``grad.sum(0)`` over a contiguous (``tokens`` × ``features``) gradient (0 when the kernel
    reduces within its blocks)."""
    if features <= 0 or tokens <= 1:
        return 0
    vec = _output_vec_size(features)
    dim0, dim1 = features // vec, tokens
    max_threads = MAX_NUM_THREADS // vec
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(dim0_pow2, WARP)
    height = min(dim1_pow2, max_threads // width)
    width = min(dim0_pow2, max_threads // height)
    threads = width * height
    step_output = width  # the block's lanes split the outputs
    if tokens < min(height * MIN_VALUES_PER_THREAD, MAX_VALUES_PER_THREAD):
        return 0  # each warp sums its own outputs: no global reduction
    values = _div_up(tokens, height)  # the block's warps split the tokens
    target_grid = device.multiprocessors * (device.max_threads_per_multiprocessor // threads)
    grid = _div_up(features // vec, step_output)
    if values < MAX_VALUES_PER_THREAD or grid > target_grid:
        return 0
    ctas = max(
        min(_div_up(target_grid, grid), _div_up(values, MIN_VALUES_PER_THREAD)),
        _div_up(values, MAX_VALUES_PER_THREAD),
    )
    if ctas <= 1:
        return 0
    staging = ACCUMULATOR_BYTES * features * ctas * width * vec
    semaphores = 4 * grid
    return block(staging) + block(semaphores)
