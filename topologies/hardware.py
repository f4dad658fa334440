"""Hardware catalogue: GPUs, links and NVSwitch generations, every figure with its source.

Bandwidths are bytes per second *per direction*; ``nominal`` is the line rate from the vendor's
datasheet, ``effective`` is what NCCL budgets for (or what is measured) where the two differ.
HBM sizes are in bytes, with the datasheet's "GB" read as GiB because that is what the devices
report (``nvidia-smi``: 81,559 MiB on an H100 80GB, 143,771 MiB on an H200, 81,920 MiB on an
A100 80GB).

    >>> GPUS["h100-sxm"].peak_flops_per_s["bf16"] / 1e12
    989.4
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from fileio.strict import did_you_mean, shorten

T = TypeVar("T")

GIB = 1024**3
"""Bytes in a GiB."""
GBPS = 1e9
"""Bytes per second in one GB/s (nccl-tests' convention)."""

PRECISIONS = ("bf16", "fp16", "fp8", "tf32", "fp32")
"""Keys of ``GPUSpec.peak_flops_per_s`` (dense tensor-core math; fp32 is non-tensor)."""

_H100_DATASHEET = "https://www.nvidia.com/en-us/data-center/h100/ (H100 datasheet, dense figures)"
_H200_DATASHEET = "https://www.nvidia.com/en-us/data-center/h200/ (H200 datasheet, dense figures)"
_A100_DATASHEET = "https://www.nvidia.com/en-us/data-center/a100/ (A100 datasheet, dense figures)"
_NCCL_TOPO = "NCCL src/graph/topo.h + topo.cc (reference/nccl_and_benchmarks.md §3.3)"
_NCCL_LAT = "NCCL src/graph/tuning.cc hwLatencies, LL protocol (reference §3.2)"


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUSpec:
    """One accelerator model: memory, memory bandwidth, dense peak math rates."""

    name: str
    """Catalogue key, e.g. ``h100-sxm``."""
    hbm_bytes: float
    """Device memory in bytes."""
    hbm_bandwidth_bytes_per_s: float
    """Peak device-memory bandwidth."""
    peak_flops_per_s: Mapping[str, float] = field(hash=False)
    """Dense peak FLOP/s by precision (keys from ``PRECISIONS``; absent where unsupported)."""
    source: str
    """Where the figures come from."""
    family: str = ""
    """Architecture generation, one of ``GPU_FAMILIES``; empty: derived from ``name``."""

    def __post_init__(self) -> None:
        if not self.family:
            object.__setattr__(self, "family", gpu_family(self.name))
        elif self.family not in GPU_FAMILIES:
            raise ValueError(
                f"GPU {self.name!r}: family={self.family!r}; valid: {', '.join(GPU_FAMILIES)}"
            )


GPU_FAMILIES = ("hopper", "ampere", "volta", "blackwell", "cpu", "other")
"""GPU architecture generations: what default kernel efficiencies and NCCL's per-generation
tables are chosen by (``other``: none of the named ones)."""
_FAMILY_PREFIXES = (
    (("b1", "b2", "b3", "gb200", "gb300"), "blackwell"),
    (("h1", "h2", "h800", "gh200"), "hopper"),
    (("a1", "a800"), "ampere"),
    (("v1",), "volta"),
)


def gpu_family(name: str) -> str:
    """The family a GPU's name implies, for a spec built without one (``other`` if none).

    The one place names are read as generations: B100/B200/B300/GB200/GB300 (and ``b1``-``b3``
    names) are Blackwell, H100/H200/H800/GH200 (and ``h1``/``h2`` names) Hopper, A100/A800 (and
    ``a1`` names) Ampere, ``v1`` names Volta.

    >>> gpu_family("H100 SXM"), gpu_family("a800-80gb"), gpu_family("mi300x")
    ('hopper', 'ampere', 'other')
    """
    lowered = name.lower()
    for prefixes, family in _FAMILY_PREFIXES:
        if lowered.startswith(prefixes):
            return family
    return "other"


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """One kind of port: a GPU's whole NVLink port, a PCIe x16 slot, one NIC, ..."""

    name: str
    """Catalogue key, e.g. ``nvlink4``."""
    nominal_bandwidth_bytes_per_s: float
    """Line rate per direction."""
    effective_bandwidth_bytes_per_s: float
    """What NCCL budgets for (or what is measured) per direction."""
    latency_s: float
    """Latency added by one hop over this link."""
    source: str
    """Where the figures come from."""
    kind: str = "network"
    """Edge kind in a topology graph: nvlink, pcie, network, cpu_link or loopback."""
    num_lanes: int = 1
    """Physical sub-links aggregated in the bandwidth (NVLinks per GPU, 1 otherwise)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NVSwitchSpec:
    """One NVSwitch generation."""

    name: str
    """Catalogue key, e.g. ``nvswitch-gen3``."""
    generation: int
    """NVSwitch generation (2: A100 HGX, 3: H100/H200 HGX)."""
    supports_nvls: bool
    """Whether the switch can reduce in-switch (NVLink SHARP, used by NCCL's NVLS algorithms)."""
    num_chips_per_node: int
    """Physical switch chips on an 8-GPU baseboard (modelled as one logical switch)."""
    source: str
    """Where the figures come from."""


def _flops(**tflops: float) -> Mapping[str, float]:
    """A read-only precision -> FLOP/s table from TFLOP/s keyword arguments."""
    return MappingProxyType({key: value * 1e12 for key, value in tflops.items()})


GPUS: dict[str, GPUSpec] = {
    "h100-sxm": GPUSpec(
        name="h100-sxm",
        family="hopper",
        hbm_bytes=80 * GIB,
        hbm_bandwidth_bytes_per_s=3.35e12,
        peak_flops_per_s=_flops(bf16=989.4, fp16=989.4, fp8=1978.9, tf32=494.7, fp32=66.9),
        source=_H100_DATASHEET + ", H100 SXM column",
    ),
    "h100-96gb-500w": GPUSpec(
        name="h100-96gb-500w",
        family="hopper",
        hbm_bytes=96 * GIB,
        hbm_bandwidth_bytes_per_s=2.4e12,
        peak_flops_per_s=_flops(bf16=912.5, fp16=912.5, fp8=1825.0, tf32=456.2, fp32=61.7),
        source="torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Meta Grand Teton): H100 "
        "with 96 GB HBM2e at 2.4 TB/s under the default 500 W power limit, whose peak 'is between "
        "SXM and NVL': the midpoint of the datasheet's SXM (989.4) and NVL (835.5 TFLOP/s dense "
        "bf16) figures is taken, the other precisions scaled alike",
    ),
    "h100-pcie": GPUSpec(
        name="h100-pcie",
        family="hopper",
        hbm_bytes=80 * GIB,
        hbm_bandwidth_bytes_per_s=2.0e12,
        peak_flops_per_s=_flops(bf16=756.5, fp16=756.5, fp8=1513.0, tf32=378.0, fp32=51.2),
        source=_H100_DATASHEET + ", H100 PCIe column",
    ),
    "h200": GPUSpec(
        name="h200",
        family="hopper",
        hbm_bytes=141 * GIB,
        hbm_bandwidth_bytes_per_s=4.8e12,
        peak_flops_per_s=_flops(bf16=989.4, fp16=989.4, fp8=1978.9, tf32=494.7, fp32=66.9),
        source=_H200_DATASHEET + ", H200 SXM column",
    ),
    "b200": GPUSpec(
        name="b200",
        family="blackwell",
        hbm_bytes=179 * GIB,
        hbm_bandwidth_bytes_per_s=8.0e12,
        peak_flops_per_s=_flops(bf16=2250.0, fp16=2250.0, fp8=4500.0, tf32=1100.0, fp32=80.0),
        source="HGX B200 at 1,000 W, dense (glennklockwood.com/garden/processors/B200, from "
        "NVIDIA's Blackwell datasheet: 2.25 PFLOPS FP16/BF16, 4.5 FP8, 1.1 TF32, 80 TFLOPS "
        "FP32; 8 TB/s HBM3e); 179 GiB as nvidia-smi reports it on an HGX B200 "
        "(docs.vultr.com hardware overview), of 192 GB physical",
    ),
    "gb200": GPUSpec(
        name="gb200",
        family="blackwell",
        hbm_bytes=186_000_000_000,
        hbm_bandwidth_bytes_per_s=8.0e12,
        peak_flops_per_s=_flops(bf16=2500.0, fp16=2500.0, fp8=5000.0, tf32=1250.0, fp32=90.0),
        source="the B200 of a GB200 superchip at 1,200 W, dense (glennklockwood.com/garden/"
        "processors/B200, from NVIDIA's Blackwell datasheet: 2.5 PFLOPS FP16/BF16, 5 FP8, 1.25 "
        "TF32, 90 TFLOPS FP32; 8 TB/s); 186 GB: the GB200 NVL72's 13.4 TB of HBM3e over its 72 "
        "GPUs",
    ),
    "a100-sxm-80gb": GPUSpec(
        name="a100-sxm-80gb",
        family="ampere",
        hbm_bytes=80 * GIB,
        hbm_bandwidth_bytes_per_s=2.039e12,
        peak_flops_per_s=_flops(bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5),
        source=_A100_DATASHEET + ", A100 80GB SXM column (no FP8 tensor cores)",
    ),
    "a100-sxm-40gb": GPUSpec(
        name="a100-sxm-40gb",
        family="ampere",
        hbm_bytes=40 * GIB,
        hbm_bandwidth_bytes_per_s=1.555e12,
        peak_flops_per_s=_flops(bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5),
        source=_A100_DATASHEET + ", A100 40GB SXM column (no FP8 tensor cores)",
    ),
    "v100-sxm3-32gb": GPUSpec(
        name="v100-sxm3-32gb",
        family="volta",
        hbm_bytes=32 * GIB,
        hbm_bandwidth_bytes_per_s=0.9e12,
        peak_flops_per_s=_flops(fp16=125.0, fp32=15.7),
        source="https://www.nvidia.com/en-us/data-center/v100/ (V100 datasheet, SXM column: "
        "125 TFLOPS fp16 tensor, 15.7 fp32, 900 GB/s HBM2; the DGX-2's 32 GB SXM3 boards have "
        "the same figures; no bf16)",
    ),
    # A pseudo-GPU so that `localhost` (N gloo processes on one CPU host) is a cluster like any
    # other. Nominal one-core figures (AVX2 FMA, 2 x 8 fp32 lanes x 2 FLOP at ~3 GHz ~ 100
    # GFLOP/s; one DDR4 channel ~ 20 GB/s): they are placeholders for a compute calibration.
    "cpu": GPUSpec(
        name="cpu",
        family="cpu",
        hbm_bytes=16 * GIB,
        hbm_bandwidth_bytes_per_s=20e9,
        peak_flops_per_s=_flops(bf16=0.1, fp16=0.1, tf32=0.1, fp32=0.1),
        source="nominal single x86 core (AVX2 FMA at ~3 GHz, one DDR4 channel); calibrate",
    ),
}
"""Accelerators by catalogue key."""


def _link(
    name: str,
    nominal_gbps: float,
    effective_gbps: float,
    latency_us: float,
    *,
    kind: str,
    source: str,
    num_lanes: int = 1,
) -> LinkSpec:
    """A ``LinkSpec`` from datasheet units (GB/s per direction, microseconds)."""
    return LinkSpec(
        name=name,
        nominal_bandwidth_bytes_per_s=nominal_gbps * GBPS,
        effective_bandwidth_bytes_per_s=effective_gbps * GBPS,
        latency_s=latency_us * 1e-6,
        kind=kind,
        source=source,
        num_lanes=num_lanes,
    )


# Per-hop latencies split NCCL's per-step LL hardware latencies over the hops of one step:
# NVLink 0.6 us per GPU->NVSwitch->GPU step (2 hops), PCI 1.0 us per GPU->switch->GPU step
# (2 hops), NET 2.7 us per GPU->PCIe->NIC->leaf->NIC->PCIe->GPU step (4 PCIe + 2 network hops).
LINKS: dict[str, LinkSpec] = {
    "nvlink3": _link(
        "nvlink3",
        300.0,
        240.0,
        0.3,
        kind="nvlink",
        num_lanes=12,
        source="A100: 12 NVLink3 x 25 GB/s/dir (600 GB/s bidir); NCCL SM80_NVLINK_BW 20.0/link "
        "-> 240 (sjeaugey NVIDIA/nccl-tests#149); " + _NCCL_LAT,
    ),
    "nvlink4": _link(
        "nvlink4",
        450.0,
        370.8,
        0.3,
        kind="nvlink",
        num_lanes=18,
        source="H100/H200 SXM: 18 NVLink4 x 25 GB/s/dir (900 GB/s bidir, "
        "nvidia.com/en-sg/technologies/hopper-architecture); NCCL SM90_NVLINK_BW 20.6/link "
        "-> 370.8 (NVIDIA/nccl-tests#212); " + _NCCL_LAT,
    ),
    "nvlink5": _link(
        "nvlink5",
        900.0,
        721.8,
        0.3,
        kind="nvlink",
        num_lanes=18,
        source="B200: 18 NVLink5 x 50 GB/s/dir (1.8 TB/s bidir per GPU, NVIDIA Blackwell "
        "datasheet; NV18 in nvidia-smi topo on an HGX B200); NCCL SM100_NVLINK_BW 40.1/link "
        "(src/graph/topo.h) -> 721.8; per-hop latency taken as NVLink4's; " + _NCCL_LAT,
    ),
    "nvlink4-bridge": _link(
        "nvlink4-bridge",
        300.0,
        247.2,
        0.3,
        kind="nvlink",
        num_lanes=12,
        source="H100 PCIe NVLink bridge: 600 GB/s bidir between 2 cards = 12 NVLink4 lanes; "
        "NCCL 20.6/link -> 247.2; " + _NCCL_LAT,
    ),
    "pcie-gen3": _link(
        "pcie-gen3",
        16.0,
        12.0,
        0.5,
        kind="pcie",
        source="PCIe Gen3 x16: 8 GT/s x 16 lanes (128b/130b) ~ 16 GB/s/dir; NCCL kvDictPciGen "
        "width*speed/80 -> 12; ZeRO-Infinity's SC21 slides budget 12 GB/s per V100 link; "
        + _NCCL_LAT,
    ),
    "pcie-gen4": _link(
        "pcie-gen4",
        32.0,
        24.0,
        0.5,
        kind="pcie",
        source="PCIe Gen4 x16: 16 GT/s x 16 lanes ~ 32 GB/s/dir; NCCL kvDictPciGen "
        "width*speed/80 -> 24; " + _NCCL_LAT,
    ),
    "pcie-gen5": _link(
        "pcie-gen5",
        64.0,
        48.0,
        0.5,
        kind="pcie",
        source="PCIe Gen5 x16: 64 GB/s/dir (alpha-one-index.github.io networking-interconnects); "
        "NCCL kvDictPciGen -> 48; " + _NCCL_LAT,
    ),
    "ib-hdr": _link(
        "ib-hdr",
        25.0,
        23.5,
        0.35,
        kind="network",
        source="InfiniBand HDR 200 Gb/s (ConnectX-6, Quantum QM8700); NCCL mbps/8000 -> 25; "
        "effective scaled by NDR's measured 47/50; " + _NCCL_LAT,
    ),
    "ib-ndr": _link(
        "ib-ndr",
        50.0,
        47.0,
        0.35,
        kind="network",
        source="InfiniBand NDR 400 Gb/s (ConnectX-7, Quantum-2 QM9700); NCCL mbps/8000 -> 50; "
        "measured 46-49 GB/s per NIC (NVIDIA/nccl-tests#290, #267); " + _NCCL_LAT,
    ),
    "ib-xdr": _link(
        "ib-xdr",
        100.0,
        94.0,
        0.35,
        kind="network",
        source="InfiniBand XDR 800 Gb/s (ConnectX-8, Quantum-X800); effective scaled by NDR's "
        "measured 47/50; " + _NCCL_LAT,
    ),
    "roce-400g": _link(
        "roce-400g",
        50.0,
        47.0,
        0.35,
        kind="network",
        source="RoCEv2 400 GbE (ConnectX-7 / Spectrum-4 SN5600 at 128 x 400G); effective as "
        "NDR's measured 47/50; " + _NCCL_LAT,
    ),
    "gcp-roce-400g": _link(
        "gcp-roce-400g",
        50.0,
        41.3,
        0.35,
        kind="network",
        source="GCP A3 Ultra GPU NIC: 8 ConnectX-7 of 400 Gb/s per VM, RoCE with GPUDirect-RDMA "
        "through the gIB NCCL plugin (cloud.google.com/compute/docs/gpus/gpu-network-bandwidth); "
        "effective 41.3 GB/s: what the NIC-bound case of Google's public A3 Ultra table, 2-node "
        "ring all_gather at 1-8 GiB (refdata/collectives/gcp-a3-ultra-h200, 324-329 GB/s busbw), "
        "gives through this model (roce-400g's 47 of 50 gave it 366-375); " + _NCCL_LAT,
    ),
    "efa-p5": _link(
        "efa-p5",
        50.0,
        42.6,
        0.35,
        kind="network",
        num_lanes=4,
        source="AWS p5/p5e: 32 EFA network cards, 3,200 Gbps per instance (docs.aws.amazon.com "
        "AWSEC2/latest/UserGuide/efa-acc-inst-types.html), i.e. 4 x 100 Gb/s per GPU, one port "
        "here as aws-ofi-nccl's RDMA protocol stripes a GPU's 4 rails (its p5 model tuner: "
        "num_rails 4, src/tuner/nccl_ofi_model.cpp); effective 42.6 GB/s per GPU: what the "
        "NIC-bound case of the public p5 tables, 2-node ring all_gather at 1 and 2 GiB "
        "(refdata/collectives/aws-p5-h100, 322 and 329 GB/s busbw), gives through this model "
        "(NDR's 47 of 50 gave it 353 and 364); " + _NCCL_LAT,
    ),
    "efa-p4d": _link(
        "efa-p4d",
        12.5,
        11.75,
        0.35,
        kind="network",
        source="AWS p4d/p4de: 4 EFA network cards, 400 Gbps per instance (docs.aws.amazon.com "
        "AWSEC2/latest/UserGuide/efa-acc-inst-types.html), i.e. 100 Gb/s per card, one card per "
        "PCIe switch shared by 2 GPUs; effective as NDR's measured 47/50; " + _NCCL_LAT,
    ),
    "gcp-200g": _link(
        "gcp-200g",
        25.0,
        23.5,
        0.35,
        kind="network",
        source="GCP A3 Mega GPU NIC: 8+1 NICs, up to 1,800 Gbps per VM = 200 Gbps each "
        "(cloud.google.com/compute/docs/gpus/gpu-network-bandwidth), GPUDirect-TCPXO; "
        "effective as NDR's measured 47/50; " + _NCCL_LAT,
    ),
    "upi": _link(
        "upi",
        32.0,
        22.0,
        0.5,
        kind="cpu_link",
        source="Intel UPI 2.0 16 GT/s (Sapphire Rapids) ~ 32 GB/s/dir; NCCL SRP_QPI_BW 22",
    ),
    "xgmi": _link(
        "xgmi",
        64.0,
        16.0,
        0.5,
        kind="cpu_link",
        source="AMD xGMI3 x16 at 32 Gb/s ~ 64 GB/s/dir; NCCL AMD_BW 16",
    ),
    "loopback": _link(
        "loopback",
        10.0,
        1.3,
        50.0,
        kind="loopback",
        source="TCP over the loopback device between gloo processes on one host. Nominal: a "
        "memcpy-bound rate. Effective and latency measured on a 2-core VM with `commbench --ops "
        "send_recv,all_reduce --nprocs 2 -b 8 -e 64M -f 8`: send_recv of 16 MiB at 1.32 GB/s, "
        "8 B all_reduce 200-1,100 us (two loopback hops per rank pair); calibrate per host",
    ),
}
"""Links by catalogue key (bandwidth per direction)."""

NVSWITCHES: dict[str, NVSwitchSpec] = {
    "nvswitch-gen2": NVSwitchSpec(
        name="nvswitch-gen2",
        generation=2,
        supports_nvls=False,
        num_chips_per_node=6,
        source="HGX A100: 6 NVSwitch gen2 chips, no NVLink SHARP (NCCL NVLS needs sm90)",
    ),
    "nvswitch-gen4": NVSwitchSpec(
        name="nvswitch-gen4",
        generation=4,
        supports_nvls=True,
        num_chips_per_node=2,
        source="HGX B200: 2 NVLink 5 switch chips with NVLink SHARP (NCCL NVLS algorithms; "
        "NVLS_NCHANNELS_SM100_NVL 24 channels in one server, src/transport/nvls.cc)",
    ),
    "nvswitch-gen3": NVSwitchSpec(
        name="nvswitch-gen3",
        generation=3,
        supports_nvls=True,
        num_chips_per_node=4,
        source="HGX H100/H200: 4 NVSwitch gen3 chips with NVLink SHARP (in-switch reduction, "
        "NCCL NVLS algorithms)",
    ),
}
"""NVSwitch generations by catalogue key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CPUSpec:
    """One CPU socket model and its memory system (what CPU Adam and offload copies run on)."""

    name: str
    """Catalogue key, e.g. ``xeon-8480c``."""
    num_cores: int
    """Physical cores per socket."""
    memory_bandwidth_bytes_per_s: float
    """Nominal memory bandwidth of one socket: channels x transfer rate x 8 bytes."""
    sustained_fraction: float
    """Share of the nominal bandwidth a streaming kernel sustains (STREAM-like)."""
    source: str
    """Where the figures come from."""

    @property
    def sustained_bandwidth_bytes_per_s(self) -> float:
        """What a memory-bound kernel such as CPU Adam can stream from one socket."""
        return self.memory_bandwidth_bytes_per_s * self.sustained_fraction


@dataclass(frozen=True, slots=True, kw_only=True)
class NVMeSpec:
    """One NVMe drive (ZeRO-Infinity swaps optimizer states and parameters through them)."""

    name: str
    """Catalogue key, e.g. ``pm1733-3.84tb``."""
    capacity_bytes: float
    """Usable capacity."""
    read_bytes_per_s: float
    """Sequential read bandwidth (128 KiB blocks, the datasheet figure)."""
    write_bytes_per_s: float
    """Sequential write bandwidth."""
    source: str
    """Where the figures come from."""


_STREAM = (
    "sustained 0.75 of nominal: STREAM Triad on DDR4/DDR5 server sockets typically reaches "
    "70-80% of the channel peak; commbench --compute --device cpu measures the real Adam rate"
)
CPUS: dict[str, CPUSpec] = {
    "xeon-8480c": CPUSpec(
        name="xeon-8480c",
        num_cores=56,
        memory_bandwidth_bytes_per_s=8 * 4.8e9 * 8,
        sustained_fraction=0.75,
        source="Intel Xeon Platinum 8480C/8480+ (Sapphire Rapids, DGX H100/H200): 56 cores, 8 "
        "channels DDR5-4800 = 307.2 GB/s per socket (Intel ARK); " + _STREAM,
    ),
    "epyc-7742": CPUSpec(
        name="epyc-7742",
        num_cores=64,
        memory_bandwidth_bytes_per_s=8 * 3.2e9 * 8,
        sustained_fraction=0.75,
        source="AMD EPYC 7742 (Rome, DGX A100): 64 cores, 8 channels DDR4-3200 = 204.8 GB/s "
        "per socket (AMD product page); " + _STREAM,
    ),
    "xeon-8168": CPUSpec(
        name="xeon-8168",
        num_cores=24,
        memory_bandwidth_bytes_per_s=6 * 2.666e9 * 8,
        sustained_fraction=0.75,
        source="Intel Xeon Platinum 8168 (Skylake-SP, DGX-2): 24 cores, 6 channels DDR4-2666 = "
        "128 GB/s per socket (Intel ARK); " + _STREAM,
    ),
}
"""CPU socket models by catalogue key."""

NVMES: dict[str, NVMeSpec] = {
    "pm1733-3.84tb": NVMeSpec(
        name="pm1733-3.84tb",
        capacity_bytes=3.84e12,
        read_bytes_per_s=7.0e9,
        write_bytes_per_s=3.8e9,
        source="Samsung PM1733 U.2 PCIe Gen4 3.84 TB datasheet: 7,000 MB/s sequential read, "
        "3,800 MB/s sequential write. DGX H100/H200 and DGX A100 ship 8 x 3.84 TB U.2 NVMe "
        "data drives (DGX user guides); the drive model varies by build",
    ),
    "dgx2-3.84tb": NVMeSpec(
        name="dgx2-3.84tb",
        capacity_bytes=3.84e12,
        read_bytes_per_s=3.5e9,
        write_bytes_per_s=1.75e9,
        source="DGX-2: 8 x 3.84 TB NVMe data drives (DGX-2 datasheet, 30 TB); read per drive = "
        "the 28 GB/s per node NVMe->GPU that ZeRO-Infinity's SC21 slides measure, / 8; write "
        "taken as half the read (typical of Gen3 U.2 drives of 2018)",
    ),
}
"""NVMe drive models by catalogue key."""


def peak_flops_per_s(gpu: GPUSpec, precision: str) -> float:
    """Dense peak FLOP/s of ``gpu`` in ``precision``; ValueError naming what it supports."""
    if precision not in gpu.peak_flops_per_s:
        valid = ", ".join(gpu.peak_flops_per_s)
        raise ValueError(f"GPU {gpu.name!r} has no {precision!r} peak; it supports: {valid}")
    return gpu.peak_flops_per_s[precision]


def lookup(table: Mapping[str, T], key: str, what: str) -> T:
    """``table[key]``, or ValueError naming ``what`` and the valid keys."""
    if not isinstance(key, str) or key not in table:
        shown = shorten(key)
        hint = did_you_mean(key, table) if isinstance(key, str) else ""
        raise ValueError(
            f"unknown {what} {shown}{hint}; valid: {', '.join(sorted(table))} (commsim presets)"
        )
    return table[key]
