"""NCCL's protocols (LL, LL128, Simple) as time-model data: latencies, factors, caps, channels.

Each (op, algorithm, protocol) NCCL can run becomes a ``Protocol`` (constants from
``sim/network/nccl_tables.py``, NCCL 2.30.7 ``src/graph/tuning.cc``):

- wire format: LL carries 4 B per 8-byte line (factor 0.5), LL128 120 of 128 B (0.92), Simple
  the full rate; Tree's LL (1/3.8) and LL128 (120/128) are relative to Tree/Simple;
- caps on the busbw: LL's ``llMaxBw``, the per-channel maxima (``perChMaxRingLL128Bw``,
  ``perChMaxTreeBw``, ``perChMaxTreeLL128Bw``, ``perChMaxNVLSTreeBw``) times the graph's channels;
- latencies: ``baseLat`` plus per-step ``hwLat`` beyond what the topology's hops already hold
  (NVLink 0.6, PCI 1.0, NET 2.7 us per step); a fabric's own per-message latency replaces the
  NET row (``GroupPlacement.net_step_latency_s``); multi-node rings pay at least the proxy
  overhead per
  intra step (1 us Intel, 2 us AMD, x3 Simple); Ring/Simple all_reduce on several nodes x1.4;
- mid sizes: the pipeline start-up chunk (a buffer slot), the channels NCCL launches for the
  size (``nc`` shrinks while ``bytes < nc x threads x threshold``, enqueue.cc; each launched
  channel moves at most its graph channel's speed, an assumption: NCCL models only the full
  count), Tree all_reduce's ``treeCorrectionFactor`` and NVLSTree's pipeline fill across
  nodes (``NVLSTREE_NUM_FILL_WAVES``).

gloo (CPU) has no protocols: an empty tuple, plain alpha-beta.

    protos = protocols_for("all_reduce", "ring", hardware)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from sim.network import nccl_tables as T
from sim.network.nccl_graph import Hardware, comm_channels, graphs

US = 1e-6
GBPS = 1e9

PROTOCOL_NAMES = T.PROTOCOLS
"""NCCL's protocols, in NCCL's enum order."""

PROTOCOL_MODES = ("auto", "none", *PROTOCOL_NAMES)
"""Values of ``CommParams.protocol``."""

SIMPLE_ONLY = ("nvls", "nvlstree", "collnet_direct", "collnet_chain")
"""Algorithms NCCL runs with Simple only (tuning.cc)."""

_TOPOLOGY_HOP_US = {"nvlink": 0.6, "pci": 1.0, "net": 2.7}
"""What the topology's hop latencies already hold per step (Ring/LL hwLat)."""


NVLS_CHUNK_OVERHEAD_BYTES = 16.3 * 1024
"""The fixed cost of one NVLS chunk, as bytes of the chunk's own transfer: each chunk an NVLS
channel reduces or multicasts costs ``1 + c / chunk`` of its bytes' time. NCCL shrinks the chunk
from 128 KiB to 64, 32 and 16 KiB below 1 GiB, 64 MiB and 8 MiB on 8 H100s (16 channels x 8
heads), which is why NVLS all_reduce reaches its rate only from 1 GiB. Fitted (with a latency
and a rate) on the one-node NVLS all_reduce of refdata/nccl/h100_8gpu_all_reduce_nvls.txt
(16.3 KiB, 1 MiB - 8 GiB); the same fit on three other clusters' tables gives 15.8 (Azure ND
H100 v5), 16.8 (AWS p5) and 18.2 KiB (Azure ND H200 v5) (``commsim validate --collectives``)."""


NVLSTREE_NUM_FILL_WAVES = 2.0
"""Pipeline fill of NVLSTree across nodes, in waves of chunks (one chunk on every concurrent
operation: channels x heads x the chunk NCCL picks for the size). A chunk crosses seven stages
(``RunWorkColl<..., NCCL_ALGO_NVLS_TREE, ...>`` in src/device/all_reduce.h: scatter into the
NVLS buffer, NVLS reduce and network send, the network, the root's NVLS reduce and send down,
the network, multicast, gather) before the last one's results land; at the steady rate the NVLS
phases set, the ones other than the bottleneck take two to three waves. Two is the lower end:
the excess over the steady rate measured on InfiniBand NDR clusters at 2 nodes is 1.5-2.0 waves
(``ib-ndr-h100-8node-issue309`` and ``ib-ndr-h100-xe9680``: about 50 us at 8-32 MiB, 64 KiB
chunks, and 135 us at 64-512 MiB, 128 KiB chunks; ``ib-ndr-h100-crusoe``, from 128 MiB:
120-270 us), and the fill follows NCCL's chunk (``shrunk_chunk``), not the size. A message
smaller than one wave fills in its own time."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Protocol:
    """One protocol's cost on one (op, algorithm, hardware): NCCL's tuning constants."""

    name: str
    """``ll``, ``ll128`` or ``simple``."""
    bandwidth_factor: float
    """Fraction of the link rate the protocol's wire format leaves for data."""
    bandwidth_cap_bytes_per_s: float
    """Upper bound on the busbw (NCCL's llMaxBw, per-channel maxima; inf when none)."""
    base_latency_s: float
    """NCCL's baseLat for the algorithm and protocol (plus CollNetDirect's arity term)."""
    intra_step_latency_s: float
    """Per intra-node step, NCCL's hwLat beyond the topology's hop latency."""
    inter_step_latency_s: float
    """Per inter-node step, the NET latency beyond the topology's hop latency."""
    latency_scale: float = 1.0
    """Multiplier on the protocol's latencies from ``plateau_min_bytes`` on (the ring plateau)."""
    plateau_min_bytes: float = math.inf
    """Size from which ``latency_scale`` applies (64 B per channel and rank, tuning.cc)."""
    chunk_bytes: float = 0.0
    """Pipeline start-up: bytes of one buffer slot (buffer / NCCL_STEPS)."""
    channel_bytes: float = 0.0
    """Bytes per launched channel before NCCL adds another (threads x threshold; 0: all)."""
    num_channels: int = 1
    """Channels of the communicator (``comm->nChannels``): the most NCCL launches."""
    channel_bandwidth_bytes_per_s: float = math.inf
    """busbw one launched channel carries at most: its graph channel's speed x the factor."""
    tree_correction: bool = False
    """Whether NCCL's ``treeCorrectionFactor`` scales the bandwidth by size."""
    chunk_ops: int = 0
    """NVLS / NVLSTree: concurrent chunk operations (channels x heads) NCCL shrinks the chunk
    against (0: the algorithm's chunk does not change with size here)."""
    max_chunk_bytes: int = 0
    """NVLS / NVLSTree: the chunk before shrinking (``nvlsChunkSize``, ``nvlsTreeMaxChunkSize``)."""
    chunk_steps: tuple[tuple[int, int], ...] = ()
    """NVLS / NVLSTree: NCCL's shrinking rule (``nccl_tables.NVLS_CHUNK_STEPS``)."""
    num_fill_waves: float = 0.0
    """Pipeline fill in waves of chunks (``chunk_ops`` x the size's chunk, at most the message):
    NVLSTree across nodes (``NVLSTREE_NUM_FILL_WAVES``); 0 elsewhere."""
    message_gap_s: float = 0.0
    """Least time per network message on one channel (``FabricSpec.message_gap_s``): Ring/Simple
    across nodes on a fabric that has one; 0 elsewhere."""
    ring_steps: int = 0
    """Steps of the ring (n - 1, all_reduce 2(n - 1)) whose messages ``message_gap_s`` times."""

    def gap_s(self, bus_bytes: float, size_bytes: float) -> float:
        """The message-rate floor of a multi-node ring: each of its steps moves bus_bytes /
        steps per launched channel in messages of ``chunk_bytes`` (512 KiB; the unit the gap
        was measured in), each taking at least ``message_gap_s`` on the network. A floor on
        the time, not bytes on the links: ``CostTerms.split_s`` adds what it exceeds the
        bandwidth term by to the latency, so the flow model does not load the links with it and
        a calibration's efficiency does not scale it."""
        if not (self.message_gap_s and self.ring_steps and self.chunk_bytes):
            return 0.0
        per_channel = bus_bytes / self.ring_steps / self.launched_channels(size_bytes)
        messages = max(1, math.ceil(per_channel / self.chunk_bytes - 1e-9))
        return self.ring_steps * messages * self.message_gap_s

    def latency_s(self, intra_steps: int, inter_steps: int, size_bytes: float = 0.0) -> float:
        """The protocol's own latency for a collective of these steps."""
        steps = intra_steps * self.intra_step_latency_s + inter_steps * self.inter_step_latency_s
        scale = self.latency_scale if size_bytes >= self.plateau_min_bytes else 1.0
        return (self.base_latency_s + steps) * scale

    def launched_channels(self, size_bytes: float) -> int:
        """Channels NCCL launches for ``size_bytes``: fewer while each would get too little
        (``nc`` shrinks while ``bytes < nc x threads x threshold``, enqueue.cc)."""
        if self.channel_bytes <= 0:
            return self.num_channels
        return max(1, min(self.num_channels, int(size_bytes // self.channel_bytes)))

    def bandwidth_s(self, bandwidth_time_s: float, bus_bytes: float, size_bytes: float) -> float:
        """Bandwidth seconds: link time over the factor, the caps (busbw and the launched
        channels'), Tree's correction, pipeline start-up."""
        if bandwidth_time_s <= 0:
            return 0.0
        channels_bw = self.launched_channels(size_bytes) * self.channel_bandwidth_bytes_per_s
        steady = max(
            bandwidth_time_s / self.bandwidth_factor,
            bus_bytes / self.bandwidth_cap_bytes_per_s,
            bus_bytes / channels_bw,
        )
        rate_s = steady
        if self.tree_correction:
            steady /= T.tree_correction(self.name, size_bytes)
        steady *= self.chunk_factor(size_bytes)
        if size_bytes <= 0:
            return steady
        # the fill: waves of chunks (at most the message) at the steady rate, before the
        # per-chunk costs
        wave = min(self.chunk_ops * self.chunk(size_bytes), size_bytes)
        fill = rate_s * self.num_fill_waves * wave / size_bytes
        # start-up: one buffer slot ahead of the steady rate, or the whole message where it is
        # smaller than a slot (it cannot fill more than itself)
        return steady * (1.0 + min(self.chunk_bytes, size_bytes) / size_bytes) + fill

    def chunk(self, size_bytes: float) -> int:
        """NVLS / NVLSTree: the chunk NCCL moves ``size_bytes`` in (0 elsewhere)."""
        if not self.chunk_ops:
            return 0
        return T.shrunk_chunk(size_bytes, self.chunk_ops, self.max_chunk_bytes, self.chunk_steps)

    def chunk_factor(self, size_bytes: float) -> float:
        """NVLS / NVLSTree: the per-chunk cost at this size's chunk, relative to the default
        128 KiB chunk the NVLS rates are quoted at (``NVLS_CHUNK_OVERHEAD_BYTES``)."""
        chunk = self.chunk(size_bytes)
        if not chunk:
            return 1.0
        c = NVLS_CHUNK_OVERHEAD_BYTES
        return (1.0 + c / chunk) / (1.0 + c / T.NVLS_CHUNK_BYTES)


@functools.lru_cache(maxsize=1024)
def protocols_for(op: str, algo: str, hw: Hardware) -> tuple[Protocol, ...]:
    """The protocols ``algo`` may use for ``op`` on ``hw``.

    NVLS, NVLSTree and CollNet run Simple only; LL128 is enabled on NVLink only (tuning.cc: up to
    PXN between GPU and NIC, NVB inside the node); ``hierarchical`` and ``direct`` (not in NCCL's
    model) use Ring's constants.
    """
    names: tuple[str, ...] = ("simple",) if algo in SIMPLE_ONLY else PROTOCOL_NAMES
    if hw.intra_hw != "nvlink":
        names = tuple(n for n in names if n != "ll128")
    if hw.protocols:  # NCCL_PROTO across the fabric
        names = tuple(n for n in names if n in hw.protocols) or ("simple",)
    return tuple(_protocol(name, op, algo, hw) for name in names)


def _table_algo(algo: str) -> str:
    return algo if algo in T.NCCL_ALGORITHMS else "ring"


def _protocol(name: str, op: str, algo: str, hw: Hardware) -> Protocol:
    p = T.PROTOCOLS.index(name)
    table = _table_algo(algo)
    tables = T.tuner_release(hw.nccl_version)
    intra_row = tables.nvlink if hw.intra_hw == "nvlink" else tables.pci
    intra = intra_row[table][p]
    inter = inter_step_us(name, table, hw, physical=True)
    multi = hw.num_nodes > 1
    if table == "ring" and multi and op not in ("broadcast", "reduce"):
        intra = max(intra, net_overhead_us(name, hw))
    base = tables.base[table][p]
    if table == "collnet_direct":
        base += 2 * (hw.ranks_per_node - 1) * T.COLLNET_ARITY_US
    plateau = table == "ring" and op == "all_reduce" and name == "simple" and multi
    channels = comm_channels(hw)
    factor = _factor(name, table, hw)
    ops, largest, steps = _nvls_chunking(table, hw)
    ring_steps = _gapped_ring_steps(name, op, algo, hw)
    return Protocol(
        name=name,
        bandwidth_factor=factor,
        bandwidth_cap_bytes_per_s=_cap_gbps(name, op, table, hw) * GBPS,
        base_latency_s=base * US,
        intra_step_latency_s=max(intra - _TOPOLOGY_HOP_US[hw.intra_hw], 0.0) * US,
        inter_step_latency_s=max(inter - _TOPOLOGY_HOP_US["net"], 0.0) * US,
        latency_scale=T.RING_PLATEAU[0 if hw.arch == "volta" else 1] if plateau else 1.0,
        plateau_min_bytes=64.0 * channels * hw.num_ranks,
        chunk_bytes=0.0 if table in ("nvls", "nvlstree") else T.BUFFER_BYTES[name] / T.NCCL_STEPS,
        channel_bytes=_channel_bytes(name, table, hw.num_ranks),
        num_channels=channels,
        channel_bandwidth_bytes_per_s=_channel_gbps(table, hw) * factor * GBPS,
        tree_correction=table == "tree" and op == "all_reduce",
        chunk_ops=ops, max_chunk_bytes=largest, chunk_steps=steps,
        num_fill_waves=NVLSTREE_NUM_FILL_WAVES if table == "nvlstree" and multi else 0.0,
        message_gap_s=hw.net_message_gap_us * US if ring_steps else 0.0,
        ring_steps=ring_steps,
    )  # fmt: skip


def _gapped_ring_steps(name: str, op: str, algo: str, hw: Hardware) -> int:
    """Steps of a Ring/Simple across nodes on a fabric with a per-message gap (n - 1,
    all_reduce 2(n - 1)); 0 elsewhere."""
    per_rank = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}.get(op, 0)
    ring = algo == "ring" and name == "simple" and hw.num_nodes > 1
    if not (ring and per_rank and hw.net_message_gap_us > 0):
        return 0
    return per_rank * (hw.num_ranks - 1)


def nvls_tuning(hw: Hardware) -> tuple[int, int, int]:
    """(channels, chunk, NVLSTree's largest chunk) as ``ncclNvlsTuning`` sets them
    (src/transport/nvls.cc): 16 channels on Hopper, on Blackwell 24 in one NVLink domain and 32
    across nodes, which ``ncclNvlsTreeSm100Tuning`` retunes from the node count, the local
    ranks and the GPU-to-NIC path's bandwidth (``Hardware.nic_path_gbps``; the GPU and its NIC
    under one PCIe switch, ``PATH_PXB``, as in every server preset); NVLSTree's largest chunk
    falls back to 64 KiB from 4 nodes on, else the chunk."""
    chunk, tree = T.NVLS_CHUNK_BYTES, 0
    if hw.arch != "blackwell":
        channels = T.NVLS_CHANNELS_SM90
    elif hw.num_nodes == 1:
        channels = T.NVLS_CHANNELS_SM100["one_node"]
    else:
        channels = T.NVLS_CHANNELS_SM100["nodes"]
        ppn, nic = hw.ranks_per_node, hw.nic_path_gbps or hw.nic_gbps
        if hw.num_nodes == 2 and nic >= 48.0:
            channels, tree = 32, 128 * 1024
            if ppn <= 4:
                chunk = tree = 256 * 1024
            elif ppn >= 16 or (ppn <= 8 and nic < 96.0):
                tree = 64 * 1024
        elif nic >= 96.0:
            if ppn <= 8:
                channels, chunk, tree = 24, 256 * 1024, 256 * 1024
            else:
                channels, tree = 32, (128 if ppn < 32 else 64) * 1024
        elif nic >= 48.0:
            channels, tree = 24, 64 * 1024  # 128 KiB unless the NIC sits past the GPU's switch
    if tree == 0:
        tree = T.NVLSTREE_MAX_CHUNK_BYTES_4_NODES if hw.num_nodes >= 4 else chunk
    return channels, chunk, tree


def _nvls_chunking(table: str, hw: Hardware) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """(concurrent ops, largest chunk, shrinking rule) of NVLS / NVLSTree (``nvls_tuning``);
    zeros for other algorithms and for NVLS across nodes (its chunk depends on the SHARP
    bandwidth; not modelled)."""
    channels, chunk, tree = nvls_tuning(hw)
    ops = channels * hw.ranks_per_node
    if table == "nvls" and hw.num_nodes == 1:
        return ops, chunk, T.NVLS_CHUNK_STEPS
    if table == "nvlstree":
        return ops, tree, T.NVLSTREE_CHUNK_STEPS
    return 0, 0, ()


def _channel_gbps(table: str, hw: Hardware) -> float:
    """Speed of one channel of the algorithm's graph (bwIntra on <= 2 nodes, else bwInter, as
    tuning.cc reads it); inf where the graph has none (no cap)."""
    if table not in ("ring", "tree"):
        return math.inf
    graph = graphs(hw)[table]
    speed = graph.bw_intra_gbps if hw.num_nodes <= 2 else graph.bw_inter_gbps
    return speed if graph.num_channels and speed > 0 else math.inf


def inter_step_us(name: str, table: str, hw: Hardware, *, physical: bool) -> float:
    """Latency of one inter-node step: NCCL's NET hwLat of the cluster's release (Tree's row with
    one GPU per node, from 2.23) plus the plugin latency (x2 for Simple) in NCCL's model; the
    fabric's own figure, where it has one, in the time model."""
    p = T.PROTOCOLS.index(name)
    release = T.tuner_release(hw.nccl_version)
    ppn_one = hw.num_ranks == hw.num_nodes and release.ppn1_tree_net
    if physical and hw.net_step_latency_us is not None:
        return hw.net_step_latency_us + (hw.net_simple_extra_us if name == "simple" else 0.0)
    latency = release.net["tree" if ppn_one else table][p]
    if not physical:
        latency += hw.plugin_latency_us * (2 if name == "simple" else 1)
    return latency


def net_overhead_us(name: str, hw: Hardware) -> float:
    """``getNetOverhead`` x3 for Simple: the floor of a multi-node ring's intra-step latency."""
    overhead = T.NET_OVERHEAD_US["amd" if hw.cpu_amd else "intel"]
    return overhead * (3 if name == "simple" else 1)


def _channel_bytes(name: str, table: str, num_ranks: int) -> float:
    """Bytes per channel before NCCL launches another (Ring/Tree only; Ring/LL x nRanks)."""
    if table not in ("ring", "tree"):
        return 0.0
    threshold = T.THREAD_THRESHOLD[name] * (num_ranks if table == "ring" and name == "ll" else 1)
    return float(T.THREADS[name] * threshold)


def _factor(name: str, table: str, hw: Hardware) -> float:
    """Wire-format factor; Tree's relative to Tree/Simple (tuning.cc stacks the LL and LL128
    factors on the all_reduce's 0.92, so relative to Simple they are the factors alone),
    CollNetDirect's sm90 efficiency."""
    if table == "tree":
        ll128 = T.TREE_LL128_FACTOR[0 if hw.num_nodes == 1 else 1]
        return {"ll": T.TREE_LL_FACTOR, "ll128": ll128, "simple": 1.0}[name]
    if table == "collnet_direct" and hw.arch in ("hopper", "blackwell"):
        return T.COLLNET_SM90_FACTOR
    return {"ll": T.LL_FACTOR, "ll128": T.LL128_FACTOR, "simple": 1.0}[name]


def _cap_gbps(name: str, op: str, table: str, hw: Hardware) -> float:
    """The busbw cap of (op, algorithm, protocol) on ``hw`` (nccl-tests busbw, GB/s)."""
    n, nodes = hw.num_ranks, hw.num_nodes
    channels = graphs(hw)[table].num_channels if table in T.NCCL_ALGORITHMS else 0
    ll_max = T.ll_max_gbps(hw.arch, nodes, hw.cpu_amd, hw.nccl_version)
    if table == "ring":
        if name == "ll":
            return ll_max
        if name == "ll128":
            return T.channel_cap(channels, T.per_channel(T.PER_CH_RING_LL128_GBPS, hw.arch, nodes))
        return math.inf
    if table == "tree" and op == "all_reduce":
        # NCCL's Tree busBw is twice its algbw; nccl-tests' is 2(n-1)/n of it.
        tree_bus = {
            "ll": ll_max,
            "ll128": T.channel_cap(
                channels, T.per_channel(T.PER_CH_TREE_LL128_GBPS, hw.arch, nodes)
            ),
            "simple": T.channel_cap(channels, T.per_channel(T.PER_CH_TREE_GBPS, hw.arch, nodes)),
        }[name]
        return tree_bus * (n - 1) / n
    if table == "nvlstree":
        cap = T.per_channel(T.PER_CH_NVLSTREE_GBPS, hw.arch, nodes)
        return T.channel_cap(channels, cap) if cap > 0 else math.inf
    return math.inf
