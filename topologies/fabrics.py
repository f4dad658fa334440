"""Network fabrics: 1-, 2- and 3-tier fat-trees (leaf-spine, pods + core) with oversubscription.

A ``FabricSpec`` names the switch radix, the link, whether NICs are wired rail-optimised,
whether the switches reduce in the network (SHARP) and the transport's latencies and tuner;
``fat_tree_graph(endpoints, spec, oversubscription=...)`` builds the switches and links above a
list of NIC endpoints and returns the graph with a ``FabricLayout`` (the counts the bisection
and the summary read). Construction, with radix ``k``:

- leaf: ``k/2`` down ports; ``round(k/2 / r)`` up ports for oversubscription ``r`` (so 2:1
  halves the up capacity exactly); one up-link to every spine (2 tiers) or to every aggregation
  switch of its pod (3 tiers).
- 2 tiers: as many spines as leaf up ports; at most ``k`` leaves (a spine port each).
- 3 tiers: pods of ``k/2`` leaves and as many aggregation switches as leaf up ports; aggregation
  switch ``j`` of every pod goes to core group ``j`` (``k/2`` cores, one port per pod), so at
  most ``k`` pods. With ``r = 1`` this is the classic k-ary fat-tree: ``k^3/4`` hosts and
  ``5k^2/4`` switches.
- rail-optimised: NIC ``i`` of the servers of one scalable unit (``k/2`` servers) shares leaf
  ``i`` of that unit; otherwise NICs fill leaves in order.

    >>> graph, layout = fat_tree_graph([(f"h{i}", i, 0) for i in range(16)], FabricSpec(
    ...     name="k4", link="ib-ndr", radix=4, tiers=3, rail_optimized=False))
    >>> layout.num_switches
    20
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from fileio.strict import shorten
from topologies.hardware import LINKS, LinkSpec, lookup
from topologies.links import add_link

MAX_RADIX = 512
"""Most ports per switch (Broadcom Tomahawk 5 splits to 512 x 100GbE; NVIDIA Quantum-X800 has
144 ports): a radix of 2**63 would build 2**62 spines."""

Endpoint = tuple[str, int, int]
"""A NIC to attach: (node id, server index, rail = NIC index inside its server)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FabricSpec:
    """A switched network: switch radix, link type, tiers, wiring."""

    name: str
    """Preset key or a user's label."""
    link: str
    """Link key of every fabric cable (``topologies.hardware.LINKS``, a network link)."""
    radix: int
    """Ports per switch."""
    tiers: int | None = None
    """Switch tiers (1, 2 or 3); None picks the fewest that fit."""
    rail_optimized: bool = True
    """NIC i of every server of a scalable unit on leaf i of that unit."""
    sharp: bool = False
    """Whether the switches can reduce in the network (SHARP): NCCL's CollNet algorithms and
    NVLS across nodes run only on such a fabric, and only with ``collnet``."""
    collnet: bool = False
    """``NCCL_COLLNET_ENABLE=1`` with the SHARP collnet plugin installed: NCCL then adds CollNet
    and NVLS across nodes (NVLS + SHARP). Off by default as in NCCL (init.cc: an unset
    ``collnetEnable`` becomes 0; tuning.cc disables CollNetDirect, CollNetChain and multi-node
    NVLS without it), so a SHARP fabric without it runs what the same fabric without SHARP runs."""
    transport: str = "ib"
    """How NCCL reaches the NICs: ``ib`` (its IB verbs transport, also RoCE), ``ofi``
    (aws-ofi-nccl over EFA) or ``tcpx`` (Google's GPUDirect-TCPX/TCPXO plugin)."""
    plugin_latency_s: float = 0.0
    """Latency the NCCL net plugin reports (``ncclNetProperties.latency``); NCCL's tuner adds it
    to every inter-node step (twice for Simple). Only its choice of algorithm depends on it."""
    step_latency_s: float | None = None
    """The transport's own latency per inter-node message, replacing NCCL's NET hwLat table in
    the time model (None: NCCL's table, 2.7-14 us per step)."""
    simple_extra_latency_s: float = 0.0
    """Extra per-message latency of NCCL's Simple protocol on this transport."""
    channels: int = 0
    """Channels NCCL runs across this fabric when its cloud's guide pins them
    (``NCCL_MIN_NCHANNELS`` = ``NCCL_MAX_NCHANNELS``); 0: NCCL's own count."""
    message_gap_s: float = 0.0
    """The transport's least time per network message on one channel (LogGP's gap g): a
    multi-node Ring/Simple moves each step's bytes per channel in 512 KiB messages (the unit
    the gap is measured in), each taking at least this long, so its network steps run at the
    slower of the byte rate and the message rate (0: no floor)."""
    tuner: str = "nccl"
    """Who picks NCCL's algorithm and protocol: ``nccl`` or a tuner plugin (``aws-ofi-p5``)."""
    protocols: tuple[str, ...] = ()
    """The protocols NCCL may use across this fabric when its net plugin or its cloud's guide
    restricts them (``NCCL_PROTO``); empty: all."""
    algorithms: tuple[str, ...] = ()
    """The algorithms NCCL may use across this fabric when its cloud's guide restricts them
    (``NCCL_ALGO``; ring, tree, nvls, nvlstree, collnet_direct, collnet_chain); empty: all."""
    source: str = ""
    """Where the figures come from."""
    fitted_on: tuple[str, ...] = ()
    """Clusters of ``refdata/collectives`` whose public tables set some of these figures (their
    checks against this preset are in-sample)."""

    def __post_init__(self) -> None:
        _check_network(self)
        link = lookup(LINKS, self.link, "fabric.link")
        if link.kind != "network":
            raise ValueError(f"fabric.link={self.link!r} is a {link.kind} link, not a network")
        for name in ("name", "source"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"fabric.{name}={shorten(getattr(self, name))}; must be text")
        radix = self.radix
        if not _is_int(radix) or radix < 2 or radix % 2 or radix > MAX_RADIX:
            raise ValueError(
                f"fabric.radix={shorten(radix)}; must be an even integer >= 2 "
                f"(at most {MAX_RADIX}, the most ports a switch has)"
            )
        if self.tiers is not None and not (_is_int(self.tiers) and self.tiers in (1, 2, 3)):
            raise ValueError(
                f"fabric.tiers={shorten(self.tiers)}; valid: 1, 2, 3 (or omit for auto)"
            )
        protocols = self.protocols
        if not isinstance(protocols, list | tuple) or any(
            p not in NCCL_PROTOCOLS for p in protocols
        ):
            raise ValueError(
                f"fabric.protocols={shorten(protocols)}; a list of {', '.join(NCCL_PROTOCOLS)} "
                "(empty: all)"
            )
        object.__setattr__(self, "protocols", tuple(protocols))  # YAML gives a list
        algorithms = self.algorithms
        if not isinstance(algorithms, list | tuple) or any(
            a not in NCCL_ALGORITHM_NAMES for a in algorithms
        ):
            raise ValueError(
                f"fabric.algorithms={shorten(algorithms)}; a list of "
                f"{', '.join(NCCL_ALGORITHM_NAMES)} (empty: all)"
            )
        object.__setattr__(self, "algorithms", tuple(algorithms))
        fitted = self.fitted_on
        if not isinstance(fitted, list | tuple) or not all(isinstance(c, str) for c in fitted):
            raise ValueError(
                f"fabric.fitted_on={shorten(fitted)}; a list of cluster names (empty: none)"
            )
        object.__setattr__(self, "fitted_on", tuple(fitted))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


NCCL_ALGORITHM_NAMES = ("ring", "tree", "nvls", "nvlstree", "collnet_direct", "collnet_chain")
"""NCCL's algorithms, as ``FabricSpec.algorithms`` names them."""
NCCL_PROTOCOLS = ("ll", "ll128", "simple")
"""NCCL's protocols, as ``FabricSpec.protocols`` names them."""
TRANSPORTS = ("ib", "ofi", "tcpx")
"""Values of ``FabricSpec.transport``."""
TUNERS = ("nccl", "aws-ofi-p5")
"""Values of ``FabricSpec.tuner``: NCCL's own, or aws-ofi-nccl's region tuner on AWS p5."""
TCPX_MESSAGE_GAP_S = 60e-6
"""GPUDirect-TCPX's least time per 512 KiB network message on one channel (GCP A3 High; 512 KiB
is the chunk Google's TCPX environment sets, NCCL_DYNAMIC_CHUNK_SIZE and NCCL_P2P_NET_CHUNKSIZE
= 524288). Two readings of one public table (refdata/collectives/gcp-a3-h100/
all_gather_2n_ring.txt: 2 nodes, Ring and Simple forced, 8 channels, plugin v3.1.9) agree: its
floor, 943-1007 us from 1 to 8 MiB over 15 ring steps of one message per channel, gives 63-67 us
a message; its plateau, 70.9 GB/s busbw at 512 MiB, is 8 channels x 512 KiB every 59 us. 60 us
is taken. The other A3 High table (all_reduce, NCCL 2.18.5, a different source, run under
Google's sample environment of 12 channels) is the check: 30 steps x 60 us = 1.8 ms against
1.65-1.79 ms measured at 1-4 MiB. The plugin reports latency 0 and documents no per-message
cost (google/nccl-plugin-gpudirecttcpx 4b8ea7f); what sets the gap (its socket threads, the
receive daemon, the unpack kernel) is not separated. In-sample for gcp-a3-h100
(docs/collectives.md)."""
GIB_STEP_LATENCY_S = 32.4e-6
"""The gIB plugin's latency per inter-node step over GCP A3 Ultra's RoCE. Derived from sizes the
collective validation does not score: the 2-node ring all_gather of
refdata/collectives/gcp-a3-ultra-h200/all_gather_2n.txt (gIB v1.1.0) takes 54-58 us from 1 to
32 KiB where the model, with the path's 2.7 us alone for the network, gives 26-27 us under the
protocol NCCL's own tuner picks there (Ring/LL); the median excess, 29.7 us, makes one
inter-node step 32.4 us. gIB's environment ships its own tuner config (NCCL_TUNER_CONFIG_PATH),
whose picks are not published, so the figure holds relative to NCCL's tuner. The table's only
op is this one, so nothing of that cluster checks it; in-sample for gcp-a3-ultra-h200
(docs/collectives.md)."""
MAX_LATENCY_S = 1.0
"""Largest per-message latency a fabric may declare (a second: 10^4 x any real network)."""
MAX_CHANNELS = 64
"""Most channels NCCL runs (``MAXCHANNELS``)."""


def _check_network(spec: FabricSpec) -> None:
    """ValueError naming the field unless SHARP, CollNet (only with SHARP), transport, latencies
    and tuner are valid."""
    if not isinstance(spec.sharp, bool):
        raise ValueError(f"fabric.sharp={shorten(spec.sharp)}; give true/false")
    if not isinstance(spec.collnet, bool):
        raise ValueError(f"fabric.collnet={shorten(spec.collnet)}; give true/false")
    if spec.collnet and not spec.sharp:
        raise ValueError(
            "fabric.collnet=true needs switches that reduce in the network (fabric.sharp=true): "
            "NCCL's CollNet runs on SHARP through its collnet plugin"
        )
    channels = spec.channels
    if not _is_int(channels) or not 0 <= channels <= MAX_CHANNELS:
        raise ValueError(
            f"fabric.channels={shorten(channels)}; must be an integer in 0..{MAX_CHANNELS} "
            "(0: NCCL's own count)"
        )
    for name, valid in (("transport", TRANSPORTS), ("tuner", TUNERS)):
        value = getattr(spec, name)
        if not isinstance(value, str) or value not in valid:
            raise ValueError(f"fabric.{name}={shorten(value)}; valid: {', '.join(valid)}")
    for name in ("plugin_latency_s", "step_latency_s", "simple_extra_latency_s", "message_gap_s"):
        value = getattr(spec, name)
        if value is None and name == "step_latency_s":
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not 0.0 <= value <= MAX_LATENCY_S:
            raise ValueError(
                f"fabric.{name}={shorten(value)}; must be a number of seconds in "
                f"0..{MAX_LATENCY_S:g}"
            )


FABRIC_PRESETS: dict[str, FabricSpec] = {
    "ib-ndr": FabricSpec(
        name="ib-ndr",
        link="ib-ndr",
        radix=64,
        source="NVIDIA Quantum-2 QM9700: 64 NDR 400 Gb/s ports; DGX SuperPOD rail-optimised",
    ),
    "ib-hdr": FabricSpec(
        name="ib-hdr",
        link="ib-hdr",
        radix=40,
        source="NVIDIA Quantum QM8700: 40 HDR 200 Gb/s ports; DGX A100 SuperPOD rail-optimised",
    ),
    "roce-400g": FabricSpec(
        name="roce-400g",
        link="roce-400g",
        radix=128,
        source="NVIDIA Spectrum-4 SN5600: 64 x 800 GbE split to 128 x 400 GbE; rail-optimised; "
        "NCCL's IB verbs transport reports no latency (src/transport/net_ib/init.cc)",
    ),
    "ib-ndr-sharp": FabricSpec(
        name="ib-ndr-sharp",
        link="ib-ndr",
        radix=64,
        sharp=True,
        source="NVIDIA Quantum-2 QM9700: 64 NDR ports with SHARPv3 in-network reduction, under "
        "NCCL's defaults (NCCL_COLLNET_ENABLE unset: no CollNet, no NVLS across nodes; "
        "ib-ndr-sharp-collnet sets it); rail-optimised",
    ),
    "ib-ndr-sharp-collnet": FabricSpec(
        name="ib-ndr-sharp-collnet",
        link="ib-ndr",
        radix=64,
        sharp=True,
        collnet=True,
        source="NVIDIA Quantum-2 QM9700: 64 NDR ports with SHARPv3 in-network reduction; "
        "NCCL_COLLNET_ENABLE=1 and the SHARP collnet plugin (Mellanox/nccl-rdma-sharp-plugins "
        "2f5ac02: all_reduce, iallgather, ireducescatter); rail-optimised",
    ),
    "efa-p5": FabricSpec(
        name="efa-p5",
        link="efa-p5",
        radix=64,
        rail_optimized=False,
        transport="ofi",
        plugin_latency_s=75e-6,
        step_latency_s=75e-6,
        simple_extra_latency_s=3e-6,
        tuner="aws-ofi-p5",
        fitted_on=("aws-p5-h100",),
        source="AWS EFA on p5 through aws-ofi-nccl (aws/aws-ofi-nccl 2daf7d3): the internode "
        "latency the plugin reports for p5/p5e, 75 us (src/platform-aws.cpp, 'Internode "
        "latency set at'), is each inter-node step's latency, + 3 us completion overhead for "
        "Simple (TUNER_NET_COMP_OVERHEAD, include/nccl_ofi_param.h); the plugin's own region "
        "tuner models 20 us (net_lat, src/tuner/nccl_ofi_model.cpp), which the public p5 tables "
        "at 2-32 nodes contradict (commsim validate --collectives: 29.3% with it, 18.0% with "
        "75 us); no CollNet ('No CollNet on AWS today'), region tuner on > 2 nodes. AWS does not "
        "publish switch radix or wiring: a non-blocking fat tree of radix-64 switches is assumed",
    ),
    "efa-p4d": FabricSpec(
        name="efa-p4d",
        link="efa-p4d",
        radix=64,
        rail_optimized=False,
        transport="ofi",
        plugin_latency_s=75e-6,
        step_latency_s=75e-6,
        protocols=("simple",),
        source="AWS EFA on p4d/p4de through aws-ofi-nccl (aws/aws-ofi-nccl 2daf7d3, "
        "src/platform-aws.cpp: p4d.24xlarge and p4de.24xlarge latency 75 us, each inter-node "
        "step's latency as on p5; send-recv protocol, no tuner model: NCCL's own tuner); the "
        "plugin sets "
        "NCCL_PROTO=simple where EFA's send-recv cannot deliver 128-byte lines in order "
        "(aws/aws-ofi-nccl#76: 'EFA doesn't support LL and LL128'; PR #850), as on p4d; no "
        "CollNet. AWS does "
        "not publish switch radix or wiring: a non-blocking fat tree of radix-64 switches is "
        "assumed",
    ),
    "gcp-a3-high": FabricSpec(
        name="gcp-a3-high",
        link="gcp-200g",
        radix=64,
        rail_optimized=False,
        transport="tcpx",
        channels=12,
        message_gap_s=TCPX_MESSAGE_GAP_S,
        fitted_on=("gcp-a3-h100",),
        protocols=("simple",),
        algorithms=("ring",),
        source="GCP A3 High GPUDirect-TCPX: 4 x 200 Gbps GPU NICs per VM (1,000 Gbps with the "
        "host NIC; cloud.google.com/compute/docs/gpus/gpu-network-bandwidth); the TCPX plugin "
        "reports latency 0 (google/nccl-plugin-gpudirecttcpx 4b8ea7f, src/net_tcpx.cc); Google's "
        "GPUDirect-TCPX NCCL environment sets NCCL_ALGO=Ring and NCCL_PROTO=Simple "
        "(cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx-autopilot"
        "#environment-variables-nccl) and 12 channels (GoogleCloudPlatform/"
        "ai-infra-cluster-provisioning sample_workloads/nccltest/gke/values.yaml); at least "
        "60 us per 512 KiB message on a channel (TCPX_MESSAGE_GAP_S, from Google's public A3 High "
        "all_gather table). Google does not publish switch radix or wiring: a "
        "non-blocking fat tree of radix-64 switches is assumed",
    ),
    "gcp-a3-mega": FabricSpec(
        name="gcp-a3-mega",
        link="gcp-200g",
        radix=64,
        rail_optimized=False,
        transport="tcpx",
        protocols=("simple", "ll128"),
        source="GCP A3 Mega GPUDirect-TCPXO: 8 x 200 Gbps GPU NICs per VM; the TCPX plugin "
        "reports latency 0 (google/nccl-plugin-gpudirecttcpx 4b8ea7f, src/net_tcpx.cc); "
        "Google's TCPXO environment sets NCCL_PROTO=Simple,LL128 (nccl-env-profile.sh from the "
        "February 2025 installer on, Simple alone before; GoogleCloudPlatform/"
        "container-engine-accelerators gpudirect-tcpxo/README.md) and, since the Nov 19, 2025 "
        "release, no longer NCCL_ALGO=Ring,Tree and NCCL_NVLS_ENABLE=0, so NVLSTree runs; its "
        "algorithms are left to NCCL's own tuner here, though TCPXO loads a tuner plugin whose "
        "config (a3plus_tuner_config.textproto) is not published: a public A3 Mega all_reduce "
        "under Ring,Tree reaches 339 GB/s busbw at 8 GiB, Tree's rate, where NCCL's tuner keeps "
        "Ring (187 GB/s). Google does not publish switch radix or wiring: a non-blocking fat "
        "tree of radix-64 switches is assumed",
    ),
    "gcp-a3-ultra": FabricSpec(
        name="gcp-a3-ultra",
        link="gcp-roce-400g",
        radix=64,
        rail_optimized=False,
        step_latency_s=GIB_STEP_LATENCY_S,
        fitted_on=("gcp-a3-ultra-h200",),
        source="GCP A3 Ultra: 8 x 400 Gb/s ConnectX-7 RoCE per VM, GPUDirect-RDMA through the "
        "gIB NCCL plugin (an IB verbs transport, NCCL_NET=gIB); 32.4 us per inter-node step from "
        "the floor of Google's public A3 Ultra all_gather table below 64 KiB, relative to what "
        "NCCL's own tuner picks there (GIB_STEP_LATENCY_S; gIB ships its own tuner config). "
        "Google does not publish switch radix or wiring: a non-blocking fat tree of radix-64 "
        "switches is assumed",
    ),
    "azure-ndr": FabricSpec(
        name="azure-ndr",
        link="ib-ndr",
        radix=64,
        rail_optimized=False,
        source="Azure ND H100 v5: a dedicated 'topology-agnostic' 400 Gb/s Quantum-2 CX7 "
        "InfiniBand link per GPU (MicrosoftDocs/azure-docs ndh100v5-series-summary.md), so NICs "
        "are not wired by rail here; Quantum-2 switches (64 NDR ports); no SHARP stated",
    ),
}
"""Fabric presets by name (``build_cluster(fabric=...)``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FabricLayout:
    """The counts of a built fat-tree."""

    spec: FabricSpec
    """What was asked for."""
    link: LinkSpec
    """The cable of every fabric link."""
    num_tiers: int
    """Switch tiers built."""
    num_endpoints: int
    """NICs attached."""
    leaf_down_ports: int
    """Ports of a leaf towards NICs."""
    leaf_up_ports: int
    """Ports of a leaf towards the tier above (0 with one tier)."""
    num_leaves: int
    """Leaf switches."""
    num_pods: int
    """Pods (3 tiers), else 1."""
    num_spines: int
    """Spines (2 tiers) or aggregation switches (3 tiers), all pods together."""
    num_cores: int
    """Core switches (3 tiers), else 0."""
    requested_oversubscription: float = 1.0
    """The ratio asked for (``oversubscription`` is what the port counts give)."""

    @property
    def num_switches(self) -> int:
        """Switches of every tier."""
        return self.num_leaves + self.num_spines + self.num_cores

    @property
    def oversubscription(self) -> float:
        """Leaf down-port capacity over up-port capacity (1.0 with one tier)."""
        return self.leaf_down_ports / self.leaf_up_ports if self.leaf_up_ports else 1.0

    def tier_oversubscription(self) -> dict[str, float]:
        """Down over up capacity at each tier that has an up-link."""
        ratios = {"leaf": self.oversubscription} if self.num_tiers > 1 else {}
        if self.num_tiers == 3:
            ratios["spine"] = 1.0  # aggregation: k/2 leaves below, k/2 cores above
        return ratios

    def bisection_bytes_per_s(self, *, effective: bool = False) -> float:
        """Worst balanced cut along the tree: half the NICs, leaves' or pods' up capacity."""
        link_bw = (
            self.link.effective_bandwidth_bytes_per_s
            if effective
            else self.link.nominal_bandwidth_bytes_per_s
        )
        cuts = [self.num_endpoints / 2 * link_bw]
        if self.num_tiers >= 2 and self.num_leaves > 1:
            cuts.append(self.num_leaves * self.leaf_up_ports * link_bw / 2)
        if self.num_tiers == 3 and self.num_pods > 1:
            cuts.append(self.num_spines * (self.spec.radix // 2) * link_bw / 2)
        return min(cuts)


def _leaf_of(endpoints: Sequence[Endpoint], down_ports: int, rail_optimized: bool) -> list[int]:
    """Leaf index of every endpoint."""
    if not rail_optimized:
        return [position // down_ports for position in range(len(endpoints))]
    num_rails = max(rail for _, _, rail in endpoints) + 1
    return [(server // down_ports) * num_rails + rail for _, server, rail in endpoints]


def _tiers_needed(spec: FabricSpec, num_leaves: int, num_endpoints: int, up_ports: int) -> int:
    """Fewest tiers that hold ``num_leaves`` (or check the requested count); ValueError if none."""
    k = spec.radix
    capacity = {1: 1, 2: k, 3: k * (k // 2)}  # leaves each tier count can hold
    tiers = spec.tiers or next((t for t in (1, 2, 3) if num_leaves <= capacity[t]), 3)
    if num_leaves > capacity[tiers] or (tiers > 1 and up_ports < 1):
        raise ValueError(
            f"fabric {spec.name!r} (radix {k}, {tiers} tier(s)) holds at most "
            f"{capacity[tiers] * (k // 2)} NIC ports in {capacity[tiers]} leaves; "
            f"{num_endpoints} NICs need {num_leaves} leaves"
        )
    return tiers


def fat_tree_graph(
    endpoints: Sequence[Endpoint], spec: FabricSpec, *, oversubscription: float = 1.0
) -> tuple[nx.DiGraph, FabricLayout]:
    """Switches and links of a fat-tree over ``endpoints`` (which become ``nic`` nodes).

    Switch ids: ``leaf<i>``, ``spine<i>`` (2 tiers) or ``pod<p>/agg<j>`` + ``core<j>.<c>``.
    Switch attributes: ``kind`` (leaf, spine, core), ``tier`` (1..3), ``pod`` (None: above all
    pods).
    """
    if not math.isfinite(oversubscription) or oversubscription < 1.0:
        raise ValueError(f"oversubscription={oversubscription!r}; must be a number >= 1")
    if not endpoints:
        raise ValueError(f"fabric {spec.name!r} has no NICs to connect")
    link = LINKS[spec.link]
    down = spec.radix // 2
    up = max(1, round(down / oversubscription))
    leaf_of = _leaf_of(endpoints, down, spec.rail_optimized)
    num_leaves = max(leaf_of) + 1
    tiers = _tiers_needed(spec, num_leaves, len(endpoints), up)
    pods = -(-num_leaves // down) if tiers == 3 else 1
    graph = nx.DiGraph()
    for i in range(num_leaves):
        graph.add_node(f"leaf{i}", kind="leaf", tier=1, pod=i // down if tiers == 3 else 0)
    for (nic, _, _), leaf in zip(endpoints, leaf_of, strict=True):
        graph.add_node(nic, kind="nic")
        add_link(graph, nic, f"leaf{leaf}", link)
    if tiers == 2:
        for s in range(up):
            graph.add_node(f"spine{s}", kind="spine", tier=2, pod=None)
            for i in range(num_leaves):
                add_link(graph, f"leaf{i}", f"spine{s}", link)
    elif tiers == 3:
        _add_pods_and_core(graph, link, num_leaves, pods, down, up)
    layout = FabricLayout(
        spec=spec,
        link=link,
        num_tiers=tiers,
        num_endpoints=len(endpoints),
        leaf_down_ports=down,
        leaf_up_ports=up if tiers > 1 else 0,
        num_leaves=num_leaves,
        num_pods=pods,
        num_spines=up if tiers == 2 else up * pods if tiers == 3 else 0,
        num_cores=up * down if tiers == 3 else 0,
        requested_oversubscription=float(oversubscription),
    )
    return graph, layout


def _add_pods_and_core(
    graph: nx.DiGraph, link: LinkSpec, num_leaves: int, pods: int, down: int, up: int
) -> None:
    """Aggregation switches (``up`` per pod) and core groups (one per aggregation index)."""
    for j in range(up):
        for c in range(down):
            graph.add_node(f"core{j}.{c}", kind="core", tier=3, pod=None)
    for p in range(pods):
        for j in range(up):
            agg = f"pod{p}/agg{j}"
            graph.add_node(agg, kind="spine", tier=2, pod=p)
            for i in range(p * down, min((p + 1) * down, num_leaves)):
                add_link(graph, f"leaf{i}", agg, link)
            for c in range(down):
                add_link(graph, agg, f"core{j}.{c}", link)
