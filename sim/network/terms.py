"""The values the network model passes around: parameters, a group's placement, cost pieces.

``CommParams`` are what calibration fits; ``GroupPlacement`` is what the closed forms and NCCL's
tuner read off the topology for one group of ranks; ``CostTerms`` are the pieces of one collective's
time before parameters apply (``sim/network/analytical.py`` builds them); ``FlowGroup`` is the
unit of the flow model (``sim/network/algorithms.py``).

    terms.time_s(params, size_bytes)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.network.nccl_graph import Hardware
from sim.network.protocols import PROTOCOL_MODES, Protocol
from topologies.topology import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class CommParams:
    """Latency and efficiency parameters of one (op, algorithm, scope); what calibration fits."""

    base_latency_s: float
    """Fixed cost of one call (launch, setup; NCCL's baseLat)."""
    intra_step_latency_s: float
    """Software latency per intra-node algorithm step, on top of the hop latency."""
    inter_step_latency_s: float
    """Software latency per inter-node algorithm step, on top of the hop latency."""
    efficiency_max: float
    """Fraction of link bandwidth reached by large messages."""
    half_size_bytes: float
    """Size at which the efficiency is half of ``efficiency_max`` (when ``shape`` is 1)."""
    shape: float = 1.0
    """Steepness of the efficiency ramp over size."""
    protocol_latency_scale: float = 1.0
    """Multiplier on NCCL's protocol latency tables (1: NCCL's constants; fitted per machine)."""
    protocol: str = "auto"
    """``auto`` (the protocol NCCL's tuner picks, else the fastest of the algorithm's), ``ll``/
    ``ll128``/``simple`` (forced) or ``none`` (plain alpha-beta: no protocol latencies, caps or
    start-up)."""

    def __post_init__(self) -> None:
        """ValueError on an unknown protocol mode."""
        if self.protocol not in PROTOCOL_MODES:
            raise ValueError(
                f"unknown protocol {self.protocol!r}; valid: {', '.join(PROTOCOL_MODES)}"
            )

    def efficiency(self, size_bytes: float) -> float:
        """Fraction of link bandwidth reached at ``size_bytes``."""
        if size_bytes <= 0:
            return self.efficiency_max
        return self.efficiency_max / (1.0 + (self.half_size_bytes / size_bytes) ** self.shape)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupPlacement:
    """Where a group's ranks sit and the bandwidths and latencies the closed forms read."""

    num_ranks: int
    """Ranks in the group."""
    num_nodes: int
    """Hosts the ranks span."""
    ranks_per_node: int
    """Ranks per host (the largest count when uneven)."""
    intra_bandwidth_bytes_per_s: float
    """Per-GPU intra-node bandwidth per direction (bottleneck over the group's ranks)."""
    net_bandwidth_bytes_per_s: float
    """Per-GPU network bandwidth per direction (bottleneck over the group's ranks)."""
    intra_hop_latency_s: float
    """Path latency between two ranks of one node."""
    inter_hop_latency_s: float
    """Path latency between two ranks on different nodes."""
    bisection_bandwidth_bytes_per_s: float
    """Fabric bisection bandwidth per direction (inf for one node)."""
    nvls: bool
    """Whether the nodes' NVSwitch can reduce in the switch (NVLink SHARP)."""
    backend: str = "nccl"
    """``nccl`` (GPUs) or ``gloo`` (CPU processes, the ``localhost`` topology)."""
    gpu_arch: str = ""
    """GPU generation (``hopper``, ``ampere``, ...) for NCCL's per-generation caps."""
    intra_hw: str = "nvlink"
    """Intra-node link type in NCCL's latency tables: ``nvlink`` or ``pci``."""
    nvswitch: bool = False
    """Whether the GPUs of a node meet in an NVSwitch (NCCL's CollNetDirect needs one)."""
    nics_per_node: int = 0
    """NIC ports per server the group can use (0: unknown, one per GPU assumed)."""
    nic_line_rate_bytes_per_s: float = 0.0
    """Line rate of one NIC port per direction (what NCCL's graph search budgets; 0: unknown)."""
    nic_path_bytes_per_s: float = 0.0
    """The GPU-to-NIC path as NCCL's topology rates it: the NIC's speed, capped by the PCIe
    link's NCCL rate (0: unknown)."""
    cpu_amd: bool = False
    """Whether the hosts have AMD CPUs (NCCL's llMaxBw row and network overhead differ)."""
    cpu_arm: bool = False
    """Whether the hosts are Arm (Grace): NCCL corrects Blackwell's NVLSTree times on x86 only."""
    sharp: bool = False
    """Whether NCCL reduces in the fabric's switches: SHARP switches with CollNet enabled
    (``Topology.sharp_capable``), which NCCL's CollNet algorithms and NVLS across nodes need."""
    plugin_latency_s: float = 0.0
    """Latency the NCCL net plugin reports; NCCL's tuner adds it per inter-node step."""
    net_step_latency_s: float | None = None
    """The fabric's own per-message latency per inter-node step (replaces NCCL's NET hwLat in
    the time model; None: NCCL's table)."""
    net_simple_extra_s: float = 0.0
    """Extra per-message latency of Simple on this fabric (completion handling)."""
    net_message_gap_s: float = 0.0
    """The fabric's least time per network message on one channel (``FabricSpec.message_gap_s``)."""
    net_channels: int = 0
    """Channels the fabric's environment pins (``FabricSpec.channels``); 0: NCCL's count."""
    tuner: str = "nccl"
    """Who picks algorithm and protocol: ``nccl`` (its tuning model) or a plugin's tuner."""
    net_protocols: tuple[str, ...] = ()
    """Protocols NCCL may use across the fabric (``NCCL_PROTO`` its plugin or its cloud's
    guide sets); empty: all."""
    net_algorithms: tuple[str, ...] = ()
    """Algorithms NCCL may pick across the fabric (``NCCL_ALGO``); empty: all."""
    nccl_version: str = ""
    """The NCCL release the cluster runs (``Topology.nccl_version``; empty: the model's own)."""

    def hardware(self) -> Hardware:
        """What NCCL's graph search and tuner see of this group (``sim/network/nccl_graph.py``)."""
        step = self.net_step_latency_s
        return Hardware(
            arch=self.gpu_arch, intra_hw=self.intra_hw, num_ranks=self.num_ranks,
            num_nodes=self.num_nodes, ranks_per_node=self.ranks_per_node,
            intra_gbps=_finite(self.intra_bandwidth_bytes_per_s) / 1e9,
            nic_gbps=_nic_gbps(self), nics_per_node=self.nics_per_node or self.ranks_per_node,
            nic_path_gbps=self.nic_path_bytes_per_s / 1e9 if self.num_nodes > 1 else 0.0,
            cpu_amd=self.cpu_amd, cpu_arm=self.cpu_arm, nvls=self.nvls,
            nvswitch=self.nvswitch or self.nvls,
            sharp=self.sharp, plugin_latency_us=self.plugin_latency_s * 1e6,
            net_step_latency_us=None if step is None else step * 1e6,
            net_simple_extra_us=self.net_simple_extra_s * 1e6, protocols=self.net_protocols,
            net_message_gap_us=self.net_message_gap_s * 1e6, channels=self.net_channels,
            algorithms=self.net_algorithms, nccl_version=self.nccl_version,
        )  # fmt: skip


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def _nic_gbps(layout: GroupPlacement) -> float:
    """A NIC port's line rate (GB/s), else the per-GPU network rate; 0 on one node."""
    if layout.num_nodes == 1:
        return 0.0
    rate = layout.nic_line_rate_bytes_per_s or layout.net_bandwidth_bytes_per_s
    return _finite(rate) / 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class CostTerms:
    """The pieces of one collective's time, before parameters are applied."""

    intra_steps: int
    """Algorithm steps whose hops stay inside a node."""
    inter_steps: int
    """Algorithm steps that cross the network."""
    hop_latency_s: float
    """Sum of the path latencies of the steps."""
    bandwidth_time_s: float
    """Busiest link's bytes / bandwidth at 100% efficiency."""
    bus_bytes: float = 0.0
    """The op's bus bytes (what busbw counts), for the protocols' busbw caps."""
    protocols: tuple[Protocol, ...] = ()
    """Protocols the algorithm can use here (empty: plain alpha-beta)."""

    def candidates(self, params: CommParams) -> tuple[Protocol, ...]:
        """The protocols ``params.protocol`` allows (``()`` means plain alpha-beta)."""
        mode = params.protocol
        if mode == "auto":
            return self.protocols
        if mode == "none" or not self.protocols:
            return ()
        chosen = tuple(p for p in self.protocols if p.name == mode)
        if not chosen:
            names = ", ".join(p.name for p in self.protocols)
            raise ValueError(f"protocol {mode!r} is not available here; valid: auto, none, {names}")
        return chosen

    def split_s(self, params: CommParams, size_bytes: float) -> tuple[str, float, float]:
        """(protocol, latency seconds, bandwidth seconds) of the fastest allowed protocol."""
        base = (
            params.base_latency_s
            + self.intra_steps * params.intra_step_latency_s
            + self.inter_steps * params.inter_step_latency_s
            + self.hop_latency_s
        )
        ramp = 1.0 / params.efficiency(size_bytes) if self.bandwidth_time_s > 0 else 0.0
        protocols = self.candidates(params)
        if not protocols:
            return "none", base, self.bandwidth_time_s * ramp
        best = ("", math.inf, math.inf)
        for proto in protocols:
            own = proto.latency_s(self.intra_steps, self.inter_steps, size_bytes)
            latency = base + own * params.protocol_latency_scale
            bandwidth = proto.bandwidth_s(self.bandwidth_time_s, self.bus_bytes, size_bytes)
            bandwidth *= ramp
            # a transport's message gap floors the time (Protocol.gap_s): its excess over the
            # bandwidth term waits like a latency
            latency += max(0.0, proto.gap_s(self.bus_bytes, size_bytes) - bandwidth)
            if latency + bandwidth < best[1] + best[2]:
                best = (proto.name, latency, bandwidth)
        return best

    def latency_s(self, params: CommParams, size_bytes: float) -> float:
        """Everything but the bandwidth term, for the protocol that runs at ``size_bytes``."""
        return self.split_s(params, size_bytes)[1]

    def time_s(self, params: CommParams, size_bytes: float) -> float:
        """Predicted seconds for ``size_bytes`` under ``params``."""
        _, latency, bandwidth = self.split_s(params, size_bytes)
        return latency + bandwidth


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowGroup:
    """Paths that each carry ``size_bytes`` at one common rate."""

    paths: tuple[Path, ...]
    """Directed-edge paths moving in lockstep."""
    size_bytes: float
    """Bytes each path carries (at 100% efficiency)."""
