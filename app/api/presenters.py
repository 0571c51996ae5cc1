"""Domain results out, response schemas in: bytes stay integers, readable strings beside them."""

from __future__ import annotations

from app.core.units import readable
from app.schemas.memory import (
    Breakdown,
    Convention,
    HostMemory,
    MemoryResponse,
    PerDevice,
    StageMemory,
)
from calculators.conventions import OPTIMIZER_ASSUMPTIONS
from calculators.memory import MemoryEstimate, StageEstimate
from calculators.model_states import Placement, bytes_per_param


def _host(p: Placement, buffers: int = 0) -> HostMemory:
    return HostMemory(
        total=p.total + buffers,
        parameters=p.parameters,
        gradients=p.gradients,
        optimizer_states=p.optimizer_states,
        buffers=buffers,
    )


BREAKDOWN_NOTES = [
    "reserved is not predicted: PyTorch's caching allocator rounds requests (512 B; small "
    "tensors share 2 MiB segments) and keeps freed blocks for reuse, so reserved >= peak by an "
    "amount that depends on the order of allocations; /v1/measure reports it (10-25 % above "
    "the peak in bench/results/torch_peak.json)",
    "outside the allocator, nvidia-smi also counts the CUDA context and loaded kernels (about "
    "1.2-1.3 GiB with torch 2.11 on an H100: nvml_used - reserved in "
    "bench/results/torch_peak.json) and NCCL's buffers (NCCL_BUFFSIZE, 4 MiB by default, per "
    "channel and peer; NCCL environment-variable documentation)",
]


def breakdown(est: StageEstimate) -> Breakdown:
    return Breakdown(
        theory=est.theory,
        allocated_resident=est.resident,
        allocated_peak=est.peak,
        notes=BREAKDOWN_NOTES,
    )


def stage_memory(est: StageEstimate, device_memory: int | None) -> StageMemory:
    per = PerDevice(
        parameters=est.device.parameters,
        gradients=est.device.gradients,
        optimizer_states=est.device.optimizer_states,
        model_states=est.model_states,
        activations=est.activations,
        temporary_buffers=est.temporary_buffers,
        resident=est.resident,
        peak=est.peak,
    )
    return StageMemory(
        stage=int(est.stage),
        per_device=per,
        per_device_readable={
            k: readable(v) for k, v in per.model_dump().items() if isinstance(v, int)
        },
        cpu=_host(est.cpu, est.cpu_buffers),
        nvme=_host(est.nvme),
        fits=None if device_memory is None else est.fits(device_memory),
        components=dict(est.components),
        breakdown=breakdown(est),
        notes=list(est.notes),
    )


def memory_response(result: MemoryEstimate, device_memory: int | None) -> MemoryResponse:
    setup = result.setup
    per = bytes_per_param(setup)
    return MemoryResponse(
        params=setup.params,
        params_per_device=setup.params_per_device,
        dp=setup.dp,
        tp=setup.tp,
        pp=setup.pp,
        convention=Convention(
            engine=setup.engine,
            description=result.convention,
            precision=setup.precision,
            optimizer=setup.optimizer,
            k=float(setup.k_value),
            optimizer_assumption=(
                "k given by the request"
                if setup.k is not None
                else OPTIMIZER_ASSUMPTIONS[setup.optimizer]
            ),
            gradients=setup.gradients,
            bytes_per_param={
                "parameters": float(per.parameters),
                "gradients": float(per.gradients),
                "optimizer_states": float(per.optimizer_states),
            },
        ),
        stages=[stage_memory(s, device_memory) for s in result.stages],
    )
