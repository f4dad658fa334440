"""Servers as graphs: HGX/DGX NVSwitch boxes, PCIe servers (optional NVLink bridges), localhost.

A ``NodeSpec`` describes one server; ``server_graph(spec)`` builds its DiGraph with local node
ids (``gpu0``, ``nvswitch``, ``pcie0``, ``nic0``, ``cpu0``) that ``build_cluster`` prefixes with
``n<i>/``. Modelling choices:

- The NVSwitch chips of an HGX baseboard (4 on H100, 6 on A100) are one logical switch: each GPU
  has one edge of its full NVLink port (18 x 25 GB/s/dir on H100) to it. That is exact for
  bandwidth, and every GPU pair is two NVLink hops apart through the switch.
- PCIe: switches hang under the CPU sockets' root complexes (split evenly), GPUs and NICs are
  spread evenly over the switches; each GPU uses a NIC on its own switch (the "affine" NIC).
- ``localhost``: N processes on one host; each is a "gpu" with the ``cpu`` pseudo-spec, joined
  to the host (a ``cpu`` node) by a loopback link, so rank to rank is two loopback hops.

    >>> server_graph(NODE_PRESETS["dgx-h100"]).number_of_nodes()  # 8 GPU, 1 NVSwitch, 4 PCIe...
    23
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import networkx as nx

from fileio.strict import shorten
from topologies.hardware import CPUS, GPUS, LINKS, NVMES, NVSWITCHES, LinkSpec, lookup
from topologies.links import add_link

INTRA_KINDS = ("nvswitch", "pcie", "nvlink-bridge", "loopback")
"""How GPUs inside a server talk to each other."""
MAX_GPUS_PER_NODE = 1024
"""Most GPUs (or local processes) one server may have."""
NODE_COUNT_LIMITS = {
    "num_gpus": (1, MAX_GPUS_PER_NODE),
    "num_pcie_switches": (1, 64),
    "nics_per_node": (0, 128),
    "num_cpus": (1, 64),
    "num_nvme": (0, 64),
}
"""Bounds of a server's counts. The upper ones are past any real server (a DGX H100 has 8 GPUs,
8 compute NICs and 2 sockets; a GB200 NVL72 rack, one NVLink domain modelled as one server, 72
GPUs, 72 compute NICs and 36 Grace CPUs), so that a typo is an error instead of a graph of 2**63
nodes."""
_TEXT_FIELDS = ("name", "source")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """One server type: its GPUs, how they are joined, its PCIe tree, NICs and CPUs."""

    name: str
    """Preset key or a user's label."""
    gpu: str
    """GPU catalogue key (``topologies.hardware.GPUS``)."""
    num_gpus: int
    """GPUs (or, for ``loopback``, processes) per server."""
    intra: str
    """GPU-to-GPU fabric: nvswitch, pcie, nvlink-bridge (pairs) or loopback."""
    nvlink: str | None = None
    """Link key of a GPU's NVLink port (nvswitch) or of one bridge (nvlink-bridge)."""
    nvswitch: str | None = None
    """NVSwitch generation key, for ``intra: nvswitch``."""
    pcie: str = "pcie-gen5"
    """Link key of every PCIe x16 link (GPU, NIC, switch uplink)."""
    num_pcie_switches: int = 4
    """PCIe switches, split evenly over the CPU sockets."""
    nic: str | None = None
    """Link key of one NIC's network port (None: no NICs)."""
    nics_per_node: int = 0
    """NICs per server, spread evenly over the PCIe switches."""
    num_cpus: int = 2
    """CPU sockets."""
    cpu_link: str = "upi"
    """Link key between CPU sockets."""
    default_fabric: str | None = None
    """Fabric preset used when a multi-server cluster names none."""
    cpu_model: str | None = None
    """CPU socket catalogue key (``topologies.hardware.CPUS``); None: unknown."""
    host_memory_bytes: float = 0.0
    """Host RAM of the server (all sockets); 0: unknown (offloaded memory is then not judged)."""
    nvme: str | None = None
    """NVMe drive catalogue key (``topologies.hardware.NVMES``) of the local data drives."""
    num_nvme: int = 0
    """Local NVMe data drives (striped: their bandwidths add up)."""
    source: str = ""
    """Where the layout comes from."""

    def __post_init__(self) -> None:
        _check_node_spec(self)


def _check_link(field_name: str, key: str | None, kind: str) -> LinkSpec | None:
    if key is None:
        return None
    link = lookup(LINKS, key, f"link for node.{field_name}")
    if link.kind != kind:
        valid = ", ".join(sorted(k for k, v in LINKS.items() if v.kind == kind))
        raise ValueError(f"node.{field_name}={key!r} is a {link.kind} link; valid: {valid}")
    return link


def _check_node_spec(spec: NodeSpec) -> None:
    for name in _TEXT_FIELDS:
        if not isinstance(getattr(spec, name), str):
            raise ValueError(f"node.{name}={shorten(getattr(spec, name))}; must be text")
    lookup(GPUS, spec.gpu, "node.gpu")
    if spec.intra not in INTRA_KINDS:
        raise ValueError(f"node.intra={shorten(spec.intra)}; valid: {', '.join(INTRA_KINDS)}")
    for name, (low, high) in NODE_COUNT_LIMITS.items():
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ValueError(
                f"node.{name}={shorten(value)}; must be an integer >= {low} "
                f"(at most {high:,}: more than any real server has)"
            )
    _check_link("pcie", spec.pcie, "pcie")
    _check_link("cpu_link", spec.cpu_link, "cpu_link")
    _check_link("nvlink", spec.nvlink, "nvlink")
    if (spec.nic is None) != (spec.nics_per_node == 0):
        raise ValueError(f"node.nic={spec.nic!r} needs node.nics_per_node >= 1 (and vice versa)")
    _check_link("nic", spec.nic, "network")
    if spec.intra == "nvswitch":
        if spec.nvswitch is None or spec.nvlink is None:
            raise ValueError("node.intra='nvswitch' needs node.nvswitch and node.nvlink")
        lookup(NVSWITCHES, spec.nvswitch, "node.nvswitch")
    elif spec.nvswitch is not None:
        raise ValueError(f"node.nvswitch={spec.nvswitch!r} needs node.intra='nvswitch'")
    if spec.intra == "nvlink-bridge" and (spec.nvlink is None or spec.num_gpus % 2):
        raise ValueError(
            f"node.intra='nvlink-bridge' needs node.nvlink and an even node.num_gpus "
            f"(got nvlink={spec.nvlink!r}, num_gpus={spec.num_gpus})"
        )
    _check_host(spec)
    if spec.intra == "loopback" and spec.nics_per_node:
        raise ValueError("node.intra='loopback' (one host) takes no NICs")


MAX_HOST_MEMORY_BYTES = 2.0**50
"""Most host RAM one server may declare (1 PiB, 30x the largest 32-socket servers' 48 TB)."""


def _check_host(spec: NodeSpec) -> None:
    """Host RAM a finite number of bytes; CPU and NVMe keys from the catalogue, drives with a
    drive model."""
    memory = spec.host_memory_bytes
    number = isinstance(memory, int | float) and not isinstance(memory, bool)
    if not number or not 0 <= memory <= MAX_HOST_MEMORY_BYTES:
        raise ValueError(
            f"node.host_memory_bytes={shorten(memory)}; must be a number of bytes in 0..2**50 "
            "(0: unknown)"
        )
    if spec.cpu_model is not None:
        lookup(CPUS, spec.cpu_model, "node.cpu_model")
    if spec.nvme is not None:
        lookup(NVMES, spec.nvme, "node.nvme")
    if (spec.nvme is None) != (spec.num_nvme == 0):
        raise ValueError(f"node.nvme={spec.nvme!r} needs node.num_nvme >= 1 (and vice versa)")


_DGX_HOST = (
    "; host: 2 TB RAM (read as 2 TiB: 32 x 64 GB DIMMs), 8 x 3.84 TB U.2 NVMe data drives "
    "(DGX datasheet / user guide)"
)

_P4D = NodeSpec(
    name="p4d-a100",
    gpu="a100-sxm-40gb",
    num_gpus=8,
    intra="nvswitch",
    nvlink="nvlink3",
    nvswitch="nvswitch-gen2",
    pcie="pcie-gen4",
    nic="efa-p4d",
    nics_per_node=4,
    cpu_link="upi",
    default_fabric="efa-p4d",
    source="AWS p4d.24xlarge: 8 A100 SXM4 40 GB with NVSwitch (NVLink 3), 4 EFA cards at "
    "400 Gbps in all (docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html), "
    "2nd Gen Intel Xeon hosts (docs.aws.amazon.com/ec2/latest/instancetypes/ac.html)",
)
"""AWS p4d.24xlarge (p4de differs only in its GPUs' memory)."""

NODE_PRESETS: dict[str, NodeSpec] = {
    "dgx-h100": NodeSpec(
        name="dgx-h100",
        gpu="h100-sxm",
        num_gpus=8,
        intra="nvswitch",
        nvlink="nvlink4",
        nvswitch="nvswitch-gen3",
        pcie="pcie-gen5",
        nic="ib-ndr",
        nics_per_node=8,
        cpu_link="upi",
        default_fabric="ib-ndr",
        cpu_model="xeon-8480c",
        host_memory_bytes=2 * 2**40,
        nvme="pm1733-3.84tb",
        num_nvme=8,
        source="NVIDIA DGX H100 user guide: 8 H100 SXM, 4 NVSwitch gen3, 8 ConnectX-7 NDR "
        "for compute, 2 Xeon 8480C" + _DGX_HOST,
    ),
    "dgx-b200": NodeSpec(
        name="dgx-b200",
        gpu="b200",
        num_gpus=8,
        intra="nvswitch",
        nvlink="nvlink5",
        nvswitch="nvswitch-gen4",
        pcie="pcie-gen5",
        nic="ib-ndr",
        nics_per_node=8,
        cpu_link="upi",
        default_fabric="ib-ndr",
        host_memory_bytes=2 * 2**40,
        source="NVIDIA DGX B200 datasheet: 8 B200 (1,440 GB of GPU memory), 2 NVLink 5 switch "
        "chips (14.4 TB/s aggregate), 8 single-port ConnectX-7 VPI at 400 Gb/s for compute, "
        "2 Xeon Platinum 8570, 2 TB RAM (read as 2 TiB; CPU model and data drives not in the "
        "catalogue)",
    ),
    "gb200-nvl72": NodeSpec(
        name="gb200-nvl72",
        gpu="gb200",
        num_gpus=72,
        intra="nvswitch",
        nvlink="nvlink5",
        nvswitch="nvswitch-gen4",
        pcie="pcie-gen5",
        num_pcie_switches=36,
        nic="ib-ndr",
        nics_per_node=72,
        num_cpus=36,
        cpu_link="upi",
        default_fabric="ib-ndr",
        source="NVIDIA GB200 NVL72: one NVLink domain of 72 Blackwell GPUs (18 compute trays of "
        "2 Grace + 4 GPUs, 9 NVLink switch trays: 130 TB/s of NVLink bandwidth), one "
        "ConnectX-7 400 Gb/s NIC per GPU for the scale-out network; modelled as one server of "
        "36 Grace sockets with 2 GPUs and 2 NICs each (the Grace-GPU NVLink-C2C host link, "
        "900 GB/s, is taken as PCIe Gen5 x16: host offload is priced low)",
    ),
    "hgx-h200": NodeSpec(
        name="hgx-h200",
        gpu="h200",
        num_gpus=8,
        intra="nvswitch",
        nvlink="nvlink4",
        nvswitch="nvswitch-gen3",
        pcie="pcie-gen5",
        nic="ib-ndr",
        nics_per_node=8,
        cpu_link="upi",
        default_fabric="ib-ndr",
        cpu_model="xeon-8480c",
        host_memory_bytes=2 * 2**40,
        nvme="pm1733-3.84tb",
        num_nvme=8,
        source="NVIDIA HGX H200 8-GPU baseboard with one ConnectX-7 NDR per GPU; host as the "
        "DGX H200's: 2 Xeon 8480C" + _DGX_HOST,
    ),
    "dgx-a100": NodeSpec(
        name="dgx-a100",
        gpu="a100-sxm-80gb",
        num_gpus=8,
        intra="nvswitch",
        nvlink="nvlink3",
        nvswitch="nvswitch-gen2",
        pcie="pcie-gen4",
        nic="ib-hdr",
        nics_per_node=8,
        cpu_link="xgmi",
        default_fabric="ib-hdr",
        cpu_model="epyc-7742",
        host_memory_bytes=2 * 2**40,
        nvme="pm1733-3.84tb",
        num_nvme=8,
        source="NVIDIA DGX A100 user guide: 8 A100 SXM, 6 NVSwitch gen2, 8 ConnectX-6 HDR, "
        "4 PCIe Gen4 switches, 2 AMD EPYC 7742" + _DGX_HOST + " (the 640 GB system; the 320 "
        "GB one has 1 TB and 4 drives)",
    ),
    "pcie-h100": NodeSpec(
        name="pcie-h100",
        gpu="h100-pcie",
        num_gpus=8,
        intra="nvlink-bridge",
        nvlink="nvlink4-bridge",
        pcie="pcie-gen5",
        nic="ib-ndr",
        nics_per_node=4,
        cpu_link="upi",
        default_fabric="ib-ndr",
        source="a typical 8 x H100 PCIe server: 4 PCIe Gen5 switches (2 GPUs + 1 NIC each), "
        "NVLink bridges between GPU pairs",
    ),
    "localhost": NodeSpec(
        name="localhost",
        gpu="cpu",
        num_gpus=2,
        intra="loopback",
        num_pcie_switches=1,
        num_cpus=1,
        source="N gloo processes on one host over the loopback device",
    ),
    "p5-h100": NodeSpec(
        name="p5-h100",
        gpu="h100-sxm",
        num_gpus=8,
        intra="nvswitch",
        nvlink="nvlink4",
        nvswitch="nvswitch-gen3",
        pcie="pcie-gen5",
        nic="efa-p5",
        nics_per_node=8,
        cpu_link="xgmi",
        default_fabric="efa-p5",
        source="AWS p5.48xlarge: 8 H100 SXM with NVSwitch, 32 EFA cards at 3,200 Gbps "
        "(docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html) as 8 ports of "
        "4 x 100 Gb/s, AMD EPYC 7R13 hosts (docs.aws.amazon.com/ec2/latest/instancetypes/ac.html)",
    ),
    "p4d-a100": _P4D,
    "p4de-a100": replace(
        _P4D,
        name="p4de-a100",
        gpu="a100-sxm-80gb",
        source="AWS p4de.24xlarge: as p4d.24xlarge with A100 SXM4 80 GB "
        "(docs.aws.amazon.com/ec2/latest/instancetypes/ac.html)",
    ),
    "a3-high-h100": NodeSpec(
        name="a3-high-h100",
        gpu="h100-sxm",
        num_gpus=8,
        intra="nvswitch",
        nvlink="nvlink4",
        nvswitch="nvswitch-gen3",
        pcie="pcie-gen5",
        nic="gcp-200g",
        nics_per_node=4,
        cpu_link="upi",
        default_fabric="gcp-a3-high",
        source="GCP a3-highgpu-8g: 8 H100 SXM with NVSwitch and NVLink 4, 4 GPU NICs of "
        "200 Gbps (1,000 Gbps with the host NIC; cloud.google.com/compute/docs/gpus/"
        "gpu-network-bandwidth), GPUDirect-TCPX, 4th Gen Intel Xeon hosts",
    ),
    "a3-mega-h100": NodeSpec(
        name="a3-mega-h100",
        gpu="h100-sxm",
        num_gpus=8,
        intra="nvswitch",
        nvlink="nvlink4",
        nvswitch="nvswitch-gen3",
        pcie="pcie-gen5",
        nic="gcp-200g",
        nics_per_node=8,
        cpu_link="upi",
        default_fabric="gcp-a3-mega",
        source="GCP a3-megagpu-8g: 8 H100 SXM with NVSwitch and NVLink 4, 8 GPU NICs of "
        "200 Gbps (8+1 arrangement, 1,800 Gbps; cloud.google.com/compute/docs/gpus/"
        "gpu-network-bandwidth), GPUDirect-TCPXO, 4th Gen Intel Xeon hosts",
    ),
    "a3-ultra-h200": NodeSpec(
        name="a3-ultra-h200",
        gpu="h200",
        num_gpus=8,
        intra="nvswitch",
        nvlink="nvlink4",
        nvswitch="nvswitch-gen3",
        pcie="pcie-gen5",
        nic="gcp-roce-400g",
        nics_per_node=8,
        cpu_link="upi",
        default_fabric="gcp-a3-ultra",
        source="GCP a3-ultragpu-8g: 8 H200 SXM with NVSwitch and NVLink 4, 8 ConnectX-7 GPU "
        "NICs of 400 Gb/s (3,200 Gbps; cloud.google.com/compute/docs/gpus/"
        "gpu-network-bandwidth), RoCE with GPUDirect-RDMA (gIB), Intel Xeon hosts",
    ),
    "nd-h100-v5": NodeSpec(
        name="nd-h100-v5",
        gpu="h100-sxm",
        num_gpus=8,
        intra="nvswitch",
        nvlink="nvlink4",
        nvswitch="nvswitch-gen3",
        pcie="pcie-gen5",
        nic="ib-ndr",
        nics_per_node=8,
        cpu_link="upi",
        default_fabric="azure-ndr",
        source="Azure Standard_ND96isr_H100_v5: 8 H100, one 400 Gb/s Quantum-2 CX7 InfiniBand "
        "link per GPU (3.2 Tbps per VM), 4th Gen Intel Xeon (MicrosoftDocs/azure-docs "
        "articles/virtual-machines/sizes/gpu-accelerated/includes/ndh100v5-series-summary.md)",
    ),
}
"""Server presets by name (``build_cluster(node=...)``)."""


def with_gpus(spec: NodeSpec, num_gpus: int) -> NodeSpec:
    """``spec`` with ``num_gpus`` GPUs (PCIe switches capped at one per GPU)."""
    switches = min(spec.num_pcie_switches, num_gpus)
    nics = min(spec.nics_per_node, num_gpus)
    return replace(spec, num_gpus=num_gpus, num_pcie_switches=switches, nics_per_node=nics)


def server_graph(spec: NodeSpec) -> nx.DiGraph:
    """The DiGraph of one ``spec`` server with local node ids; ``node_index`` is 0.

    >>> g = server_graph(NODE_PRESETS["localhost"]); sorted(g.nodes)
    ['cpu0', 'gpu0', 'gpu1']
    """
    graph = nx.DiGraph()
    gpu = GPUS[spec.gpu]
    for s in range(spec.num_cpus):
        graph.add_node(f"cpu{s}", kind="cpu", node_index=0)
    for j in range(spec.num_gpus):
        graph.add_node(f"gpu{j}", kind="gpu", spec=gpu, node_index=0, local_index=j, nic=None)
    if spec.intra == "loopback":
        for j in range(spec.num_gpus):
            add_link(graph, f"gpu{j}", "cpu0", LINKS["loopback"])
        return graph
    _add_pcie_tree(graph, spec)
    if spec.intra == "nvswitch":
        graph.add_node(
            "nvswitch", kind="nvswitch", spec=NVSWITCHES[str(spec.nvswitch)], node_index=0
        )
        for j in range(spec.num_gpus):
            add_link(graph, f"gpu{j}", "nvswitch", LINKS[str(spec.nvlink)])
    elif spec.intra == "nvlink-bridge":
        for j in range(0, spec.num_gpus, 2):
            add_link(graph, f"gpu{j}", f"gpu{j + 1}", LINKS[str(spec.nvlink)])
    return graph


def _spread(index: int, count: int, buckets: int) -> int:
    """Bucket of item ``index`` of ``count`` split evenly, in order, over ``buckets``."""
    return index * buckets // count


def _add_pcie_tree(graph: nx.DiGraph, spec: NodeSpec) -> None:
    """CPU sockets joined pairwise, PCIe switches under them, GPUs and NICs under the switches."""
    pcie = LINKS[spec.pcie]
    for s in range(spec.num_cpus):
        for t in range(s + 1, spec.num_cpus):
            add_link(graph, f"cpu{s}", f"cpu{t}", LINKS[spec.cpu_link])
    switches = spec.num_pcie_switches
    for k in range(switches):
        graph.add_node(f"pcie{k}", kind="pcie_switch", node_index=0)
        add_link(graph, f"pcie{k}", f"cpu{_spread(k, switches, spec.num_cpus)}", pcie)
    nics_on: dict[int, list[str]] = {}
    for k in range(spec.nics_per_node):
        graph.add_node(f"nic{k}", kind="nic", node_index=0, local_index=k)
        switch = _spread(k, spec.nics_per_node, switches)
        add_link(graph, f"nic{k}", f"pcie{switch}", pcie)
        nics_on.setdefault(switch, []).append(f"nic{k}")
    gpus_on: dict[int, int] = {}
    for j in range(spec.num_gpus):
        switch = _spread(j, spec.num_gpus, switches)
        add_link(graph, f"gpu{j}", f"pcie{switch}", pcie)
        position = gpus_on.get(switch, 0)
        gpus_on[switch] = position + 1
        local = nics_on.get(switch)
        if local:
            graph.nodes[f"gpu{j}"]["nic"] = local[position % len(local)]
        elif spec.nics_per_node:
            graph.nodes[f"gpu{j}"]["nic"] = _nearest_nic(graph, f"gpu{j}")


def _nearest_nic(graph: nx.DiGraph, gpu: str) -> str:
    """The NIC fewest hops from ``gpu`` (lowest index among ties)."""
    hops = nx.single_source_shortest_path_length(graph, gpu)
    nics = [n for n in hops if graph.nodes[n]["kind"] == "nic"]
    return min(nics, key=lambda n: (hops[n], graph.nodes[n]["local_index"]))
