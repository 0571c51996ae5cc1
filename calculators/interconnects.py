"""Interconnect presets: peak per-direction bandwidth per device (or per NIC) and hop latency.

Bandwidths are vendor peak rates in bytes per second, one direction (vendors quote NVLink and
PCIe as bidirectional totals; we halve them). Achieved bus bandwidth in nccl-tests is lower than
these peaks, so times computed from them are lower bounds for the transfer part.

Latencies come from NCCL's own cost model (src/graph/tuning.cc, NCCL 2.2x, Ring algorithm,
Simple protocol, the one NCCL picks for the large messages ZeRO sends): a fixed base latency of
8.4 µs per collective call plus a per-step hop latency of 3.4 µs over NVLink, 5.7 µs over PCIe and
14.0 µs over the network (``baseLat`` / ``hwLat`` tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from calculators.errors import InputError

GB = 10**9  # vendors' GB/s are decimal

# NCCL src/graph/tuning.cc: baseLat[Ring][Simple] = 8.4 µs per collective call.
NCCL_BASE_LATENCY = Fraction(84, 10) * Fraction(1, 10**6)
# NCCL src/graph/tuning.cc: hwLat[NVLINK|PCI|NET][Ring][Simple] = 3.4 / 5.7 / 14.0 µs per step.
NVLINK_HOP_LATENCY = Fraction(34, 10) * Fraction(1, 10**6)
PCIE_HOP_LATENCY = Fraction(57, 10) * Fraction(1, 10**6)
NET_HOP_LATENCY = Fraction(140, 10) * Fraction(1, 10**6)


class LinkKind(StrEnum):
    """What a preset is: a link inside a node, a NIC between nodes, or the host link."""

    NVLINK = "nvlink"
    PCIE = "pcie"
    NETWORK = "network"
    CUSTOM = "custom"


@dataclass(frozen=True)
class Interconnect:
    """One link class.

    Attributes:
        name: preset name, or ``"custom"``.
        bandwidth: bytes per second, one direction, per device (NVLink, PCIe) or per NIC.
        latency: seconds per ring step (hop).
        kind: link class.
        source: where the bandwidth figure comes from.
    """

    name: str
    bandwidth: int
    latency: Fraction
    kind: LinkKind
    source: str


def _half(total_gb_per_s: int) -> int:
    """Per-direction bytes/s from a vendor's bidirectional GB/s total."""
    return total_gb_per_s * GB // 2


PRESETS: dict[str, Interconnect] = {
    p.name: p
    for p in (
        # NVIDIA A100 Tensor Core GPU datasheet: "NVLink 600GB/s" (3rd gen, 12 links, both ways).
        Interconnect(
            "nvlink3",
            _half(600),
            NVLINK_HOP_LATENCY,
            LinkKind.NVLINK,
            "NVIDIA A100 datasheet: NVLink 600 GB/s bidirectional per GPU",
        ),
        # NVIDIA H100 Tensor Core GPU datasheet (SXM): "NVLink: 900GB/s" (4th gen, 18 links).
        Interconnect(
            "nvlink4",
            _half(900),
            NVLINK_HOP_LATENCY,
            LinkKind.NVLINK,
            "NVIDIA H100 datasheet (SXM): NVLink 900 GB/s bidirectional per GPU",
        ),
        # NVIDIA DGX B200 / Blackwell datasheet: 5th-gen NVLink 1.8 TB/s per GPU (bidirectional).
        Interconnect(
            "nvlink5",
            _half(1800),
            NVLINK_HOP_LATENCY,
            LinkKind.NVLINK,
            "NVIDIA Blackwell (B200) datasheet: NVLink 1.8 TB/s bidirectional per GPU",
        ),
        # PCI-SIG PCIe 4.0: 16 GT/s per lane, 128b/130b; x16 = 64 GB/s bidirectional (A100 PCIe
        # datasheet: "PCIe Gen4: 64GB/s").
        Interconnect(
            "pcie4",
            _half(64),
            PCIE_HOP_LATENCY,
            LinkKind.PCIE,
            "PCI-SIG PCIe 4.0 x16 / A100 PCIe datasheet: 64 GB/s bidirectional",
        ),
        # PCI-SIG PCIe 5.0: 32 GT/s per lane; x16 = 128 GB/s bidirectional (H100 datasheet:
        # "PCIe Gen5: 128GB/s").
        Interconnect(
            "pcie5",
            _half(128),
            PCIE_HOP_LATENCY,
            LinkKind.PCIE,
            "PCI-SIG PCIe 5.0 x16 / H100 datasheet: 128 GB/s bidirectional",
        ),
        # NVIDIA ConnectX-6 VPI product brief: InfiniBand HDR 200 Gb/s per port.
        Interconnect(
            "ib_hdr",
            200 * GB // 8,
            NET_HOP_LATENCY,
            LinkKind.NETWORK,
            "NVIDIA ConnectX-6: InfiniBand HDR 200 Gb/s per port",
        ),
        # NVIDIA ConnectX-7 product brief: InfiniBand NDR 400 Gb/s per port.
        Interconnect(
            "ib_ndr",
            400 * GB // 8,
            NET_HOP_LATENCY,
            LinkKind.NETWORK,
            "NVIDIA ConnectX-7: InfiniBand NDR 400 Gb/s per port",
        ),
        # NVIDIA ConnectX-8 SuperNIC product brief: InfiniBand XDR 800 Gb/s per port.
        Interconnect(
            "ib_xdr",
            800 * GB // 8,
            NET_HOP_LATENCY,
            LinkKind.NETWORK,
            "NVIDIA ConnectX-8 SuperNIC: InfiniBand XDR 800 Gb/s per port",
        ),
        # IEEE 802.3 Ethernet line rates, RoCE v2 over them (ConnectX-6 Dx: 100/200 GbE,
        # ConnectX-7: 400 GbE).
        Interconnect(
            "roce_100g",
            100 * GB // 8,
            NET_HOP_LATENCY,
            LinkKind.NETWORK,
            "IEEE 802.3 100 GbE (RoCE v2), e.g. ConnectX-6 Dx",
        ),
        Interconnect(
            "roce_200g",
            200 * GB // 8,
            NET_HOP_LATENCY,
            LinkKind.NETWORK,
            "IEEE 802.3 200 GbE (RoCE v2), e.g. ConnectX-6 Dx",
        ),
        Interconnect(
            "roce_400g",
            400 * GB // 8,
            NET_HOP_LATENCY,
            LinkKind.NETWORK,
            "IEEE 802.3 400 GbE (RoCE v2), e.g. ConnectX-7",
        ),
    )
}

DEFAULT_INTRA_NODE = "nvlink4"
DEFAULT_INTER_NODE = "ib_ndr"
DEFAULT_HOST_LINK = "pcie5"


def get_interconnect(name: str, field: str) -> Interconnect:
    """The preset called ``name``; :class:`InputError` on ``field`` otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise InputError(field, f"unknown interconnect {name!r}; known: {known}") from None


def custom_interconnect(bandwidth: float, latency: float, field: str) -> Interconnect:
    """A user-given link: ``bandwidth`` bytes/s per direction, ``latency`` seconds per hop."""
    if not bandwidth >= 1:  # held as whole bytes per second: below 1 it would round to 0
        raise InputError(f"{field}.bandwidth", "must be at least 1 (bytes per second)")
    if not latency >= 0:
        raise InputError(f"{field}.latency", "must not be negative (seconds)")
    return Interconnect(
        "custom",
        int(bandwidth),
        Fraction(latency).limit_denominator(10**12),
        LinkKind.CUSTOM,
        "given by the request",
    )
