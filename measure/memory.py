"""Real memory figures of a run: the CUDA allocator's counters, or live storages on the CPU.

On CUDA, ``torch.cuda.memory_allocated`` / ``max_memory_allocated`` / ``memory_reserved`` and,
where present, NVML's used memory. On the CPU there is no allocator counter, so
:class:`LiveStorages` watches every tensor the engine creates (a ``TorchDispatchMode`` sees each
op's outputs, including those that C++ code such as DDP's Reducer allocates through the
dispatcher) and sums the bytes of the storages still alive, each storage once. Both sides also
attribute storages to parameters, gradients and optimizer states, deduplicated by data pointer.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (FSDP2 shards), else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def storage_bytes(tensors: Iterable[torch.Tensor], device: torch.device) -> int:
    """Bytes of the distinct storages behind ``tensors`` on ``device``."""
    seen: dict[int, int] = {}
    for t in tensors:
        local = _local(t)
        if local.device.type != device.type:
            continue
        st = local.untyped_storage()
        if st.nbytes() and st.data_ptr() not in seen:
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def parameter_tensors(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach() for p in model.parameters()]


def gradient_tensors(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad for p in model.parameters() if p.grad is not None]


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    # ZeroRedundancyOptimizer keeps the states in its local optimizer ``optim``
    inner = getattr(optimizer, "optim", optimizer)
    out: list[torch.Tensor] = []
    for state in inner.state.values():
        out += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out


def attribution(
    model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> dict[str, int]:
    return {
        "parameters": storage_bytes(parameter_tensors(model), device),
        "gradients": storage_bytes(gradient_tensors(model), device),
        "optimizer_states": storage_bytes(optimizer_tensors(optimizer), device),
    }


class LiveStorages(TorchDispatchMode):
    """Every storage on ``device_type`` created by an op while active, held by weak reference."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        self.device_type = device_type
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        self._watch(out)
        return out

    def _watch(self, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            # wrapper subclasses (DTensor) hold no storage of their own: their local tensors
            # come out of the ops they dispatch, which this mode sees too
            if is_traceable_wrapper_subclass(out):
                return
            if out.device.type == self.device_type and not out.is_meta:
                st = out.untyped_storage()
                key = id(st)
                if key not in self._refs:
                    self._refs[key] = weakref.ref(st, functools.partial(self._forget, key))
        elif isinstance(out, (list, tuple)):
            for item in out:
                self._watch(item)

    def _forget(self, key: int, _ref: weakref.ref[torch.UntypedStorage]) -> None:
        self._refs.pop(key, None)

    def live_bytes(self, leave_out: frozenset[int] | set[int] = frozenset()) -> int:
        """Bytes of the storages alive now, each once (``leave_out``: data pointers not
        counted)."""
        seen: dict[int, int] = {}
        for ref in list(self._refs.values()):
            st = ref()
            if st is not None and st.nbytes() and st.data_ptr() not in leave_out:
                seen[st.data_ptr()] = st.nbytes()
        return sum(seen.values())


class DeviceMemory:
    """Phase probes for one device: CUDA allocator counters, or :class:`LiveStorages`."""

    def __init__(self, device: torch.device, tracker: LiveStorages | None = None) -> None:
        self.device = device
        self.tracker = tracker

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def allocated(self) -> int:
        if self.is_cuda:
            return int(torch.cuda.memory_allocated(self.device))
        assert self.tracker is not None
        return self.tracker.live_bytes()

    def requested(self) -> int:
        """Bytes the tensors asked for: the CUDA allocator's ``requested_bytes`` (its
        ``allocated`` counts whole blocks, which a cached block larger than the request by up
        to 1 MiB is not split for); on the CPU the same as :meth:`allocated`."""
        if self.is_cuda:
            stats = torch.cuda.memory_stats(self.device)
            fallback = stats["allocated_bytes.all.current"]
            return int(stats.get("requested_bytes.all.current", fallback))
        return self.allocated()

    def peak_requested(self) -> int | None:
        """The most bytes the tensors asked for at once since the last reset
        (``requested_bytes.all.peak``: :meth:`peak` less the allocator's whole-block hand-outs);
        ``None`` off CUDA."""
        if not self.is_cuda:
            return None
        stats = torch.cuda.memory_stats(self.device)
        return int(stats.get("requested_bytes.all.peak", stats["allocated_bytes.all.peak"]))

    def reset_peak(self) -> None:
        if self.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int | None:
        return int(torch.cuda.max_memory_allocated(self.device)) if self.is_cuda else None

    def reserved(self) -> int | None:
        return int(torch.cuda.memory_reserved(self.device)) if self.is_cuda else None

    def nvml_used(self) -> int | None:
        """Device-level used bytes (CUDA context and NCCL buffers included), if NVML or
        nvidia-smi is there: of the physical GPU behind this device, named by its UUID, since
        NVML numbers every GPU of the host while ``CUDA_VISIBLE_DEVICES`` renumbers the visible
        ones from 0."""
        if not self.is_cuda:
            return None
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        gpu = physical_gpu(index)
        if gpu is None:
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByUUID(gpu)
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:  # noqa: BLE001 - NVML is optional; fall back to nvidia-smi
            pass
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return None
        try:
            out = subprocess.run(
                [smi, f"--id={gpu}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
            return int(float(out.splitlines()[0]) * 2**20)  # nvidia-smi reports MiB
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None


def physical_gpu(index: int) -> str | None:
    """The UUID (``GPU-…``, as NVML and nvidia-smi name GPUs) of CUDA device ``index``; without
    one, the index itself only where ``CUDA_VISIBLE_DEVICES`` leaves the numbering as NVML's
    (unset), else ``None``: another GPU's figure would be read."""
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None and str(uuid):
        text = str(uuid)
        return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
    return str(index) if os.environ.get("CUDA_VISIBLE_DEVICES") is None else None


@contextlib.contextmanager
def device_memory(device: torch.device) -> Iterator[DeviceMemory]:
    """Memory readings for ``device``: the CUDA allocator's, or on the CPU the live storages
    this block allocates (attributed by :class:`LiveStorages`)."""
    if device.type == "cuda":
        yield DeviceMemory(device, None)
        return
    with LiveStorages(device.type) as tracker:
        yield DeviceMemory(device, tracker)
