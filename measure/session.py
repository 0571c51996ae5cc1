"""What every engine's stage run shares: runtime workspaces before the baseline, freeing what
the last stage left, and device synchronisation."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable

import torch

Progress = Callable[[float, str], None]


def runtime_warmup(
    device: torch.device, dtype: torch.dtype | None, biased_threads: int = 0
) -> None:
    """Run a tiny forward/backward so that per-thread runtime workspaces (cuBLAS handles on the
    main and the autograd thread) exist before the baseline is read, after dropping those an
    earlier run of this process made.

    ``biased_threads``: the threads whose biased linears make torch's cuBLASLt workspace in
    the measured model's step (``calculators.engines.torch.peak.biased_linear_threads``): 1,
    the caller's forward; 2, also autograd's thread, where checkpointed blocks run forward again.
    The warm-up makes those and no others, so the process holds what a training process of that
    model holds; results record it as ``environment["warmup_linear_bias"]`` (earlier ones, which
    lack the key, had a biased warm-up linear whatever the model)."""
    if device.type != "cuda":
        return
    drop_cublas_workspaces(device)
    lin = torch.nn.Linear(64, 64, bias=biased_threads > 0, device=device)
    x = torch.randn(8, 64, device=device, requires_grad=True)
    for dt in {dtype, None}:
        ctx = torch.autocast("cuda", dtype=dt) if dt is not None else contextlib.nullcontext()
        with ctx:
            if biased_threads > 1:  # forward again in backward, in autograd's thread
                h = torch.utils.checkpoint.checkpoint(lin, x, use_reentrant=False)
            else:
                h = lin(x)
            y = h @ lin.weight
        y.float().sum().backward()
    del lin, x, y, h
    torch.cuda.synchronize(device)


def drop_cublas_workspaces(device: torch.device) -> None:
    """Free the cuBLAS workspaces earlier runs of this process made (every handle's, main thread
    and autograd's: ``at::cuda::clearCublasWorkspaces``), so that a run whose convention counts
    the workspaces its first step makes allocates them again over its baseline, as the first run
    of a process does. They are made again at the next matmul."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if device.type == "cuda" and clear is not None:
        torch.cuda.synchronize(device)
        clear()


def release(device: torch.device, settle_s: float = 5.0) -> None:
    """Free what the last stage left and wait until the allocator stops shrinking.

    ProcessGroupNCCL keeps each asynchronous collective's tensors (DDP's buckets among them)
    until its watchdog thread sees the work complete, so they die a little after the engine
    that owned them; reading the next stage's baseline before that would charge it to them.
    Runs of one process group showed more: the last stage's DDP buckets stayed alive through
    the next stage's baseline until another collective ran on the default group (every stage
    after a DDP one started 170–470 MiB high). So a one-element all-reduce goes through the
    default group first, and the allocator is then watched until it stops shrinking.
    """
    gc.collect()
    if device.type != "cuda":
        return
    torch.cuda.synchronize(device)
    flush_default_group(device)
    last, stable, deadline = -1, 0, time.perf_counter() + settle_s
    while stable < 10 and time.perf_counter() < deadline:  # 1 s without change
        gc.collect()
        now = torch.cuda.memory_allocated(device)
        stable = stable + 1 if now == last else 0
        last = now
        time.sleep(0.1)
    torch.cuda.empty_cache()


def flush_default_group(device: torch.device) -> None:
    """One tiny all-reduce on the default process group, waited for (no-op without one)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    one = torch.ones(1, device=device)
    dist.all_reduce(one)
    torch.cuda.synchronize(device)
    del one
    gc.collect()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
