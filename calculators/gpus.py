"""GPU presets: memory, peak dense tensor FLOP/s, memory bandwidth and the host link.

Peak FLOP/s are the vendor datasheets' *dense* figures (datasheets print the 2:4-sparse figure
first, twice the dense one; training runs dense). ``peak_flops_16bit`` is the BF16/FP16 tensor
core rate; ``peak_flops_fp32`` the FP32 (non-tensor) rate that plain fp32 matmuls run at, since
PyTorch leaves TF32 off for matmuls by default (``torch.backends.cuda.matmul.allow_tf32``).

Memory is the datasheet capacity read as GiB (HBM and GDDR come in power-of-two devices); the
driver shows slightly less (an H100 SXM reports 81,559 MiB of its 81,920), and the CUDA context
takes more: the planner subtracts a stated reserve (``calculators.plan``).
"""

from __future__ import annotations

from dataclasses import dataclass

from calculators.errors import InputError

GIB = 2**30
TERA = 10**12
GB = 10**9  # vendors' GB/s are decimal


@dataclass(frozen=True)
class Gpu:
    """One accelerator model.

    Attributes:
        name: preset key (``"h100-sxm"``) or ``"custom"``.
        label: what the vendor calls it.
        memory: device memory, bytes.
        peak_flops_16bit: dense BF16/FP16 tensor-core FLOP/s.
        peak_flops_fp32: FP32 FLOP/s without tensor cores.
        memory_bandwidth: device memory bytes/s.
        host_link: interconnect preset name of the link to the host (offload traffic).
        intra_node_link: interconnect preset name between GPUs of one node.
        device_names: what ``torch.cuda.get_device_name`` reports for it (calibrations match on
            these).
        source: the datasheet the figures come from.
    """

    name: str
    label: str
    memory: int
    peak_flops_16bit: float
    peak_flops_fp32: float
    memory_bandwidth: int
    host_link: str
    intra_node_link: str
    device_names: tuple[str, ...] = ()
    source: str = ""


PRESETS: dict[str, Gpu] = {
    g.name: g
    for g in (
        # NVIDIA H100 Tensor Core GPU datasheet (SXM column): BF16 1,979 TFLOPS with sparsity,
        # FP32 67 TFLOPS, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s.
        Gpu(
            "h100-sxm",
            "NVIDIA H100 80GB SXM",
            80 * GIB,
            1979 * TERA / 2,
            67 * TERA,
            3350 * GB,
            "pcie5",
            "nvlink4",
            ("NVIDIA H100 80GB HBM3", "NVIDIA H100"),
            "NVIDIA H100 datasheet (SXM): BF16 1,979 TFLOPS sparse = 989.5 dense; 3.35 TB/s",
        ),
        # Same datasheet, PCIe column: BF16 1,513 TFLOPS sparse, FP32 51 TFLOPS, 2 TB/s,
        # NVLink bridge 600 GB/s.
        Gpu(
            "h100-pcie",
            "NVIDIA H100 80GB PCIe",
            80 * GIB,
            1513 * TERA / 2,
            51 * TERA,
            2000 * GB,
            "pcie5",
            "pcie5",
            ("NVIDIA H100 PCIe",),
            "NVIDIA H100 datasheet (PCIe): BF16 1,513 TFLOPS sparse = 756.5 dense; 2 TB/s",
        ),
        # Same datasheet, H100 NVL column: BF16 1,671 TFLOPS sparse, FP32 60 TFLOPS, 94 GB,
        # 3.9 TB/s.
        Gpu(
            "h100-nvl",
            "NVIDIA H100 NVL 94GB",
            94 * GIB,
            1671 * TERA / 2,
            60 * TERA,
            3900 * GB,
            "pcie5",
            "pcie5",
            ("NVIDIA H100 NVL",),
            "NVIDIA H100 datasheet (NVL): BF16 1,671 TFLOPS sparse = 835.5 dense; 3.9 TB/s",
        ),
        # NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS sparse, FP32 67 TFLOPS,
        # 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s.
        Gpu(
            "h200",
            "NVIDIA H200 141GB SXM",
            141 * GIB,
            1979 * TERA / 2,
            67 * TERA,
            4800 * GB,
            "pcie5",
            "nvlink4",
            ("NVIDIA H200",),
            "NVIDIA H200 datasheet (SXM): BF16 1,979 TFLOPS sparse = 989.5 dense; 4.8 TB/s",
        ),
        # NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS dense (624 sparse), FP32 19.5
        # TFLOPS; 40 GB HBM2 1,555 GB/s; 80 GB HBM2e 2,039 GB/s (SXM); NVLink 600 GB/s;
        # PCIe Gen4 64 GB/s.
        Gpu(
            "a100-40gb",
            "NVIDIA A100 40GB SXM",
            40 * GIB,
            312 * TERA,
            19.5 * TERA,
            1555 * GB,
            "pcie4",
            "nvlink3",
            ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
            "NVIDIA A100 datasheet: BF16 312 TFLOPS dense; 40 GB HBM2 at 1,555 GB/s",
        ),
        Gpu(
            "a100-80gb",
            "NVIDIA A100 80GB SXM",
            80 * GIB,
            312 * TERA,
            19.5 * TERA,
            2039 * GB,
            "pcie4",
            "nvlink3",
            ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
            "NVIDIA A100 datasheet: BF16 312 TFLOPS dense; 80 GB HBM2e at 2,039 GB/s (SXM)",
        ),
        # NVIDIA L40S datasheet: BF16 tensor 362.05 TFLOPS dense (733 sparse), FP32 91.6 TFLOPS,
        # 48 GB GDDR6 at 864 GB/s, PCIe Gen4 x16 64 GB/s, no NVLink.
        Gpu(
            "l40s",
            "NVIDIA L40S 48GB",
            48 * GIB,
            362.05 * TERA,
            91.6 * TERA,
            864 * GB,
            "pcie4",
            "pcie4",
            ("NVIDIA L40S",),
            "NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense; 48 GB GDDR6 at 864 GB/s",
        ),
        # NVIDIA L4 datasheet: BF16 242 TFLOPS sparse (121 dense), FP32 30.3 TFLOPS, 24 GB GDDR6
        # at 300 GB/s, PCIe Gen4 x16.
        Gpu(
            "l4",
            "NVIDIA L4 24GB",
            24 * GIB,
            242 * TERA / 2,
            30.3 * TERA,
            300 * GB,
            "pcie4",
            "pcie4",
            ("NVIDIA L4",),
            "NVIDIA L4 datasheet: BF16 242 TFLOPS sparse = 121 dense; 24 GB at 300 GB/s",
        ),
        # NVIDIA A10 datasheet: BF16 250 TFLOPS sparse (125 dense), FP32 31.2 TFLOPS, 24 GB
        # GDDR6 at 600 GB/s, PCIe Gen4.
        Gpu(
            "a10",
            "NVIDIA A10 24GB",
            24 * GIB,
            250 * TERA / 2,
            31.2 * TERA,
            600 * GB,
            "pcie4",
            "pcie4",
            ("NVIDIA A10",),
            "NVIDIA A10 datasheet: BF16 250 TFLOPS sparse = 125 dense; 24 GB at 600 GB/s",
        ),
    )
}


def get_gpu(name: str, field: str = "gpu") -> Gpu:
    """The preset called ``name``; :class:`InputError` on ``field`` otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise InputError(field, f"unknown GPU {name!r}; known: {known}") from None


def custom_gpu(
    memory: int,
    peak_flops: float,
    *,
    memory_bandwidth: int | None = None,
    host_link: str = "pcie5",
    intra_node_link: str = "nvlink4",
    field: str = "gpu",
) -> Gpu:
    """A GPU given by its figures; ``peak_flops`` is the dense rate training runs at."""
    if memory < 1:
        raise InputError(f"{field}.memory", "must be at least 1 byte")
    if not peak_flops > 0:
        raise InputError(f"{field}.peak_flops", "must be above 0 FLOP/s")
    return Gpu(
        name="custom",
        label="given by the request",
        memory=memory,
        peak_flops_16bit=peak_flops,
        peak_flops_fp32=peak_flops,
        memory_bandwidth=memory_bandwidth or 0,
        host_link=host_link,
        intra_node_link=intra_node_link,
        source="given by the request",
    )


def gpu_for_device_name(device_name: str) -> Gpu | None:
    """The preset whose ``torch.cuda.get_device_name`` string this is (exact match first)."""
    for gpu in PRESETS.values():
        if device_name in gpu.device_names:
            return gpu
    return None
