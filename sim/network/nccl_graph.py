"""NCCL's channel graphs (``ncclTopoGraph``) estimated from a group's hardware, for its tuner.

NCCL searches, per algorithm, for ``nChannels`` channels of ``bwIntra``/``bwInter`` GB/s each
(``src/graph/search.cc`` ``ncclTopoCompute``, NCCL 2.30.7): it walks a per-generation speed list
from the top, keeps the graph with the most ``nChannels x bw``, stops at the link capacity, then
``ncclTopoDupChannels`` doubles the channels at half the speed where the speed is >= 25 GB/s
(except Hopper+ graphs under 50 GB/s with more than 4 channels). We do not replay the search on
a PCI tree; for symmetric servers we apply its budgets directly:

- ring / tree, one node: channels of speed ``s`` until the GPU's intra-node bandwidth is used
  (``floor(B / s)``); across nodes: one channel per NIC that has ``s`` to spare
  (``nics x floor(nic / s)``), each GPU's NVLink carrying ``s`` in ``(g - 1) / g`` of them (it
  is its node's exit in one channel of every ``g``).
- NVLS (Hopper+ NVSwitch): one channel per GPU (``minChannels = maxChannels = ngpus`` on one
  node), each loading every GPU's NVLink by ``s`` and its head's by ``2 s``: ``(g + 1) s <= B``;
  across nodes one head per NIC; the second pass raises ``bwInter`` while it stays under
  ``2 x bwIntra`` (to the top speed on one node, where nothing uses it; to the NIC across).
- CollNetDirect: one head per NIC (at most 8), ``s`` up to the NIC rate, each GPU carrying
  about ``2 s`` of NVLink. CollNetChain: a chain through every GPU per channel, like a ring.
- Tree, CollNetChain and CollNetDirect then get the search's second pass: ``bwIntra`` rises a
  listed speed at a time while it is under ``2 x bwInter`` and the graph still fits the NVLink
  (``_raise_intra``), so a tree on two nodes can run its intra-node legs at twice the NIC's
  speed, which the tuner reads there (p4d, A3 Mega, A100 on HDR; not NDR, at the list's top).

Bandwidths are NCCL's (GB/s): the topology's *effective* NVLink/PCIe rates (NCCL's 20.6 GB/s per
NVLink4 lane) and the NIC *line rate* (``mbps / 8000``).

    graphs(layout.hardware())["ring"].num_channels
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from sim.network import nccl_tables as T


@dataclass(frozen=True, slots=True, kw_only=True)
class Graph:
    """One algorithm's channels as NCCL's search leaves them."""

    num_channels: int
    """``nChannels`` of the graph (0: the algorithm is unavailable)."""
    bw_intra_gbps: float
    """``bwIntra``: GB/s per channel inside a node."""
    bw_inter_gbps: float
    """``bwInter``: GB/s per channel across nodes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """What NCCL's graph search and tuning model see of one group (hashable, for caches)."""

    arch: str
    """GPU generation (``volta`` .. ``blackwell``; empty when unknown)."""
    intra_hw: str
    """``nvlink`` or ``pci``: which intra-node latency row applies."""
    num_ranks: int
    """Ranks of the communicator."""
    num_nodes: int
    """Nodes it spans."""
    ranks_per_node: int
    """Local ranks (the largest count)."""
    intra_gbps: float
    """Per-GPU intra-node bandwidth per direction (GB/s)."""
    nic_gbps: float
    """Line rate of one NIC port (GB/s; 0 without NICs)."""
    nics_per_node: int
    """NIC ports per node."""
    nic_path_gbps: float = 0.0
    """Bandwidth of the GPU-to-NIC path as NCCL's topology sees it (``ncclTopoGetMinNetBw``:
    the NIC's speed, capped by the PCIe links on the way); 0: ``nic_gbps``."""
    cpu_amd: bool
    """AMD hosts (NCCL's llMaxBw row, network overhead)."""
    cpu_arm: bool
    """Arm hosts (Grace): NCCL corrects Blackwell's NVLSTree times on x86 hosts only."""
    nvls: bool
    """NVSwitch with NVLink SHARP (``nvlsSupport``)."""
    nvswitch: bool
    """An NVSwitch joins the GPUs (``nvsCount > 0``; CollNetDirect needs it)."""
    sharp: bool
    """The fabric reduces in the network (``collnetEnable`` with the SHARP plugin)."""
    plugin_latency_us: float = 0.0
    """Net plugin's ``latency`` property (NCCL's ``graph->latencyInter``)."""
    net_step_latency_us: float | None = None
    """The fabric's own per-message latency (time model only; None: NCCL's NET hwLat)."""
    net_simple_extra_us: float = 0.0
    """Extra per-message latency of Simple on this fabric (time model only)."""
    net_message_gap_us: float = 0.0
    """The fabric's least time per network message on one channel (time model only)."""
    channels: int = 0
    """``NCCL_MIN_NCHANNELS`` = ``NCCL_MAX_NCHANNELS`` of the fabric's environment (0: unset)."""
    protocols: tuple[str, ...] = ()
    """``NCCL_PROTO`` across the fabric (empty: every protocol)."""
    algorithms: tuple[str, ...] = ()
    """``NCCL_ALGO`` across the fabric (empty: every algorithm)."""
    nccl_version: str = ""
    """The NCCL release the cluster runs, whose latency tables apply
    (``nccl_tables.tuner_release``; empty: the release the tables were read from)."""


def _speeds(arch: str, inter: bool) -> tuple[float, ...]:
    key = arch if arch in ("hopper", "blackwell") else "pre_hopper"
    return (T.SPEEDS_INTER if inter else T.SPEEDS_INTRA)[key]


def _search(speeds: tuple[float, ...], channels_at, capacity: float) -> tuple[int, float]:
    """NCCL's first pass: the most ``nChannels x s`` from the top speed down, ties to the first.

    It stops at a graph that fills ``capacity`` and once the next speed is <= 0.49 x the best.
    """
    best_channels, best_speed = 0, 0.0
    for speed in speeds:
        if best_speed and speed <= 0.49 * best_speed:
            break
        channels = channels_at(speed)
        if channels <= 0:
            continue
        if channels * speed > best_channels * best_speed:
            best_channels, best_speed = channels, speed
            if channels * speed >= capacity:
                break
    return best_channels, best_speed


def _dup(arch: str, channels: int, speed: float) -> Graph:
    """``ncclTopoDupChannels``: twice the channels at half the speed, where NCCL does that."""
    late = arch in ("hopper", "blackwell")
    if channels and speed >= 25.0 and not (late and speed < 50.0 and channels > 4):
        doubled = min(2 * channels, T.MAX_RING_CHANNELS)
        speed /= -(-doubled // channels)
        channels = doubled
    return Graph(num_channels=channels, bw_intra_gbps=speed, bw_inter_gbps=speed)


def _chain_budget(hw: Hardware) -> float:
    """NVLink GB/s a chain or ring of channels may load on one GPU (``ring_graph``'s budget)."""
    if hw.num_nodes == 1:
        return hw.intra_gbps
    g = hw.ranks_per_node
    return hw.intra_gbps * g / (g - 1) if g > 1 else math.inf


def ring_graph(hw: Hardware) -> Graph:
    """The ring graph: see the module docstring."""
    g = hw.ranks_per_node
    if hw.num_nodes == 1:
        total = _chain_budget(hw)
        channels, speed = _search(
            _speeds(hw.arch, False),
            lambda s: min(int(total // s), T.MAX_RING_CHANNELS),
            total,
        )
        return _dup(hw.arch, channels, speed)
    nic = hw.nic_gbps
    intra_share = _chain_budget(hw)

    def channels_at(speed: float) -> int:
        if speed > nic:
            return 0
        by_net = hw.nics_per_node * int(nic // speed)
        by_intra = int(intra_share // speed) if math.isfinite(intra_share) else by_net
        return min(by_net, by_intra, T.MAX_RING_CHANNELS)

    capacity = min(hw.nics_per_node * nic, hw.intra_gbps if g > 1 else math.inf)
    channels, speed = _search(_speeds(hw.arch, True), channels_at, capacity)
    return _dup(hw.arch, channels, speed)


def _raise_intra(graph: Graph, speeds: tuple[float, ...], fits: Callable[[float], bool]) -> Graph:
    """NCCL's second pass for every pattern but the ring and NVLS (search.cc, "increase bwIntra
    for trees (2 nodes or collnet)", in every release here): ``bwIntra`` rises one listed speed
    at a time while it is under ``2 x bwInter`` and the graph still ``fits`` at the higher one."""
    intra = graph.bw_intra_gbps
    for speed in reversed(speeds):  # ascending: the next speed up each time
        if speed <= intra:
            continue
        if intra >= 2 * graph.bw_inter_gbps or not fits(speed):
            break
        intra = speed
    return dataclasses.replace(graph, bw_intra_gbps=intra)


def tree_graph(hw: Hardware) -> Graph:
    """A tree-patterned graph (Tree and PAT, CollNetChain): NCCL searches it on its own with at
    most the ring's channels, so at the ring's channels and the fastest listed speed not above
    the ring's (a doubled ring can sit between two), then ``_raise_intra`` while the channels fit
    the ring's NVLink budget. The tuner and the time model read a tree's ``bwIntra`` on one or
    two nodes."""
    ring = ring_graph(hw)
    if not ring.num_channels:
        return ring
    speeds = _speeds(hw.arch, hw.num_nodes > 1)
    start = next((s for s in speeds if s <= ring.bw_intra_gbps), ring.bw_intra_gbps)
    budget = _chain_budget(hw)
    graph = Graph(num_channels=ring.num_channels, bw_intra_gbps=start, bw_inter_gbps=start)
    return _raise_intra(graph, speeds, lambda speed: ring.num_channels * speed <= budget)


def nvls_graph(hw: Hardware) -> Graph:
    """The NVLS (and NVLSTree) graph; no channels without NVLink SHARP or before Hopper."""
    g = hw.ranks_per_node
    if not hw.nvls or hw.arch not in ("hopper", "blackwell") or g < 2:
        return Graph(num_channels=0, bw_intra_gbps=0.0, bw_inter_gbps=0.0)
    inter = hw.num_nodes > 1
    channels = min(g, T.MAX_NVLS_ARITY, hw.nics_per_node if inter else g)
    fits = [s for s in _speeds(hw.arch, inter) if (g + 1) * s <= hw.intra_gbps]
    if inter:
        fits = [s for s in fits if s <= hw.nic_gbps]
    intra = fits[0] if fits else 0.0
    # Second pass: bwInter rises while it stays under 2 x bwIntra (up to the NIC across nodes;
    # on one node nothing consumes it, so to the top of the list).
    bw_inter = next(
        (s for s in _speeds(hw.arch, inter) if s < 2 * intra and (not inter or s <= hw.nic_gbps)),
        intra,
    )
    return Graph(num_channels=channels if intra else 0, bw_intra_gbps=intra, bw_inter_gbps=bw_inter)


def collnet_graphs(hw: Hardware) -> tuple[Graph, Graph]:
    """(CollNetDirect, CollNetChain) graphs; no channels without SHARP or on one node. Both get
    the search's second pass (``_raise_intra``; the tuner reads a CollNet graph's ``bwIntra`` on
    any number of nodes): the direct heads while each GPU's NVLink carries ``2 x bwIntra``, the
    chain as a tree (``tree_graph``)."""
    none = Graph(num_channels=0, bw_intra_gbps=0.0, bw_inter_gbps=0.0)
    if not hw.sharp or hw.num_nodes < 2:
        return none, none
    heads = min(hw.nics_per_node, hw.ranks_per_node, T.MAX_DIRECT_ARITY + 1)
    fits = [s for s in _speeds(hw.arch, True) if s <= hw.nic_gbps and 2 * s <= hw.intra_gbps]
    if not hw.nvswitch or not fits:
        direct = none
    else:
        direct = _raise_intra(
            Graph(num_channels=heads, bw_intra_gbps=fits[0], bw_inter_gbps=fits[0]),
            _speeds(hw.arch, True),
            lambda speed: 2 * speed <= hw.intra_gbps,
        )
    return direct, tree_graph(hw)


@functools.lru_cache(maxsize=256)
def graphs(hw: Hardware) -> dict[str, Graph]:
    """Each NCCL algorithm's graph (``graphs[]`` in init.cc: Tree and PAT share the tree graph,
    NVLS and NVLSTree the NVLS graph)."""
    ring = ring_graph(hw)
    nvls = nvls_graph(hw)
    direct, chain = collnet_graphs(hw)
    return {
        "ring": ring, "tree": tree_graph(hw), "nvls": nvls, "nvlstree": nvls,
        "collnet_direct": direct, "collnet_chain": chain,
    }  # fmt: skip


def comm_channels(hw: Hardware) -> int:
    """``comm->nChannels``: the ring graph's channels doubled (``ncclTopoPostset``), doubled again
    on Hopper+ across nodes while ``bwIntra > 45`` and fewer than 16 (connect.cc)."""
    if hw.channels:  # pinned by NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS
        return hw.channels
    ring = graphs(hw)["ring"]
    channels = min(2 * ring.num_channels, 64)
    late = hw.arch in ("hopper", "blackwell")
    if late and hw.num_nodes > 1 and ring.bw_intra_gbps > 45.0 and channels < 16:
        channels *= 2
    return max(channels, 1)
