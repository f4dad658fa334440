"""NCCL's tuner: its own predicted time of every (algorithm, protocol), and the one it picks.

A port of NCCL 2.30.7's ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` (``src/graph/tuning.cc``)
and of the selection in ``enqueue.cc`` (``updateCollCostTable``, ``topoGetAlgoInfo``), fed with
the channel graphs of ``sim/network/nccl_graph.py``; a cluster's earlier release swaps in that
release's latency tables and changed rules (``nccl_tables.tuner_release``,
``Hardware.nccl_version``). NCCL runs what *this* model predicts fastest,
not what is fastest: the simulator picks with it and times the pick with its own model
(``sim/network/analytical.py``). Per (op, algorithm, protocol), in NCCL's units:

    busBw   = nChannels x bw      (bw = bwIntra on <= 2 nodes and for CollNet, else bwInter;
                                   NVLS/NVLSTree: min(bwIntra x nvlsEff x (nCh-1)/nCh x (AR 2 |
                                   (ppn-1)/ppn), bwInter x (NVLSTree on 2 nodes: 2), NVLSTree cap))
    busBw  -> refinements (LL 0.5 and llMaxBw, LL128 0.92 and per-channel caps, Tree 0.92 ...,
              CollNetDirect all_reduce / (f - (f-1)/2), f = ppn / nCh, x0.85 on sm90)
    algBw   = busBw x nRanks/nSteps (Ring, NVLS, NVLSTree), x0.5 (Tree, CollNet all_reduce);
              non-Ring all_gather/reduce_scatter keep busBw
    latency = baseLat + steps x hwLat (per algorithm, see ``_latency_us``)
    time_us = latency (x1.4 Ring/Simple all_reduce plateau) + bytes / (1000 x algBw
              x treeCorrectionFactor for Tree all_reduce)

CollNet and multi-node NVLS (NVLS + SHARP) need a fabric that reduces in the network; CollNetDirect
an NVSwitch; all_gather/reduce_scatter over NVLS or CollNetDirect across nodes need the collnet
plugin's ``iallgather``/``ireducescatter`` (the SHARP plugin has both: Mellanox/nccl-rdma-sharp-
plugins ``src/sharp_plugin.c``) and at most one local rank per head.

    pick("all_reduce", layout.hardware(), 1 << 30)  # ("nvls", "simple") on one H100 node
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection
from dataclasses import dataclass

from sim.network import nccl_tables as T
from sim.network.nccl_graph import Hardware, comm_channels, graphs
from sim.network.protocols import inter_step_us, net_overhead_us

MODELLED_OPS = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")
"""The functions NCCL's tuning model covers (``NCCL_NUM_FUNCTIONS``; no all_to_all, send/recv)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """NCCL's model of one (op, algorithm, protocol): ``comm->latencies`` and ``bandwidths``."""

    latency_us: float
    """Latency (us)."""
    algbw_gbps: float
    """Algorithm bandwidth (GB/s); 0 when NCCL disables the combination."""


@functools.lru_cache(maxsize=256)
def tune(hw: Hardware) -> dict[tuple[str, str, str], Entry]:
    """``ncclTopoTuneModel``: every (op, algorithm, protocol) NCCL models on ``hw``."""
    table: dict[tuple[str, str, str], Entry] = {}
    if hw.num_ranks <= 1:
        return table
    for op in MODELLED_OPS:
        for algo in T.NCCL_ALGORITHMS:
            if not _models(op, algo):
                continue
            for proto in T.PROTOCOLS:
                if algo in ("nvls", "nvlstree") and proto != "simple":
                    continue
                bandwidth = _algbw_gbps(op, algo, proto, hw)
                if bandwidth is None:
                    continue
                if not _enabled(op, algo, proto, hw):
                    bandwidth = 0.0
                table[(op, algo, proto)] = Entry(
                    latency_us=_latency_us(op, algo, proto, hw), algbw_gbps=bandwidth
                )
    return table


def _models(op: str, algo: str) -> bool:
    if op in ("broadcast", "reduce"):
        return algo == "ring"
    if op in ("all_gather", "reduce_scatter"):
        return algo in ("ring", "nvls", "collnet_direct")
    return True


def _algbw_gbps(op: str, algo: str, proto: str, hw: Hardware) -> float | None:
    """NCCL's algorithm bandwidth, or None where the graph has no channels for it."""
    graph = graphs(hw)[algo]
    if graph.num_channels == 0:
        return None
    n, nodes = hw.num_ranks, hw.num_nodes
    ppn = n / nodes
    collnet = algo in ("collnet_direct", "collnet_chain")
    bw = graph.bw_intra_gbps if nodes <= 2 or collnet else graph.bw_inter_gbps
    release = T.tuner_release(hw.nccl_version)
    graph_rule = release.nvls_bandwidth == "graph"
    if algo in ("nvls", "nvlstree") and graph_rule:
        bw = _nvls_graph_gbps(op, algo, hw, release.nvls_gather_ppn)
    elif algo in ("nvls", "nvlstree"):
        if graph.num_channels < 2:
            return None
        intra = graph.bw_intra_gbps * T.NVLS_EFFICIENCY.get(hw.arch, 0.0)
        intra *= (graph.num_channels - 1) / graph.num_channels
        intra *= 2.0 if op == "all_reduce" else (ppn - 1) / ppn
        inter = graph.bw_inter_gbps * (2 if nodes <= 2 and algo == "nvlstree" else 1)
        cap = T.per_channel(T.PER_CH_NVLSTREE_GBPS, hw.arch, nodes)
        bw = min(intra, inter, cap if algo == "nvlstree" else math.inf)
    bus = graph.num_channels * bw
    bus = _refine(op, algo, proto, hw, bus)
    if (op in ("all_gather", "reduce_scatter") and algo in ("nvls", "collnet_direct")
            and nodes > 1 and not _one_rank_per_head(hw)):  # fmt: skip
        bus = 0.0
    if graph_rule and algo in ("nvls", "nvlstree"):  # before 2.28.3
        every_op = release.nvls_ratio_every_op
        return bus * 5.0 / 6.0 if every_op or op == "all_reduce" else bus
    if not (algo != "ring" and op in ("all_gather", "reduce_scatter")):
        steps = {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1}
        ratio = n / steps.get(op, n) if algo in ("ring", "nvls", "nvlstree") else 0.5
        bus *= ratio
    return bus


def _nvls_graph_gbps(op: str, algo: str, hw: Hardware, gather_ppn: bool) -> float:
    """NVLS / NVLSTree bandwidth per channel before 2.28.3 (``TunerRelease.nvls_bandwidth``
    ``graph``): the graph's own speeds, NVLSTree's network half on more than two nodes, and 2.27's
    all_gather / reduce_scatter rule."""
    graph = graphs(hw)[algo]
    if algo == "nvlstree":
        inter = graph.bw_inter_gbps if hw.num_nodes <= 2 else graph.bw_inter_gbps / 2
        return min(graph.bw_intra_gbps, inter)
    if gather_ppn and op != "all_reduce":
        ppn = hw.num_ranks / hw.num_nodes
        return min(graph.bw_intra_gbps * (ppn - 1) / ppn, graph.bw_inter_gbps * 0.9)
    return min(graph.bw_intra_gbps, graph.bw_inter_gbps)


def _refine(op: str, algo: str, proto: str, hw: Hardware, bus: float) -> float:
    """tuning.cc's "various model refinements" of the bus bandwidth."""
    nodes = hw.num_nodes
    channels = graphs(hw)[algo].num_channels
    ll_max = T.ll_max_gbps(hw.arch, nodes, hw.cpu_amd, hw.nccl_version)
    release = T.tuner_release(hw.nccl_version)
    if algo == "ring" and proto == "ll":
        factor = T.LL_FACTOR
        if release.ring_ll_quarter:
            quarter = nodes > 1 or op in ("all_reduce", "reduce")
            factor = 1.0 / 4.0 if quarter else 1.0 / 3.0
        bus = min(ll_max, bus * factor)
    if algo == "ring" and proto == "ll128":
        cap = T.per_channel(T.PER_CH_RING_LL128_GBPS, hw.arch, nodes)
        one_ppn = hw.num_ranks < 2 * nodes
        factor = release.ring_ll128_one_ppn if one_ppn else T.LL128_FACTOR
        bus = min(bus * factor, T.channel_cap(channels, cap))
    if algo == "tree" and op == "all_reduce":
        cap = T.per_channel(T.PER_CH_TREE_GBPS, hw.arch, nodes)
        bus = min(bus * T.TREE_AR_FACTOR, T.channel_cap(channels, cap))
    if algo == "tree" and proto == "ll":
        bus = min(bus * T.TREE_LL_FACTOR, ll_max)
    if algo == "tree" and proto == "ll128":
        factor = T.TREE_LL128_FACTOR[0 if nodes == 1 else 1]
        cap = T.per_channel(T.PER_CH_TREE_LL128_GBPS, hw.arch, nodes)
        bus = min(bus * factor, T.channel_cap(channels, cap))
    if algo in ("collnet_direct", "collnet_chain") and proto != "simple":
        return 0.0
    if algo == "collnet_direct":
        graph = graphs(hw)[algo]
        ppn = hw.num_ranks / nodes
        if op in ("all_gather", "reduce_scatter"):
            return ppn * min(graph.bw_intra_gbps, graph.bw_inter_gbps * 0.9)
        factor = ppn / channels
        factor -= (factor - 1) / 2
        bus /= factor
        if hw.arch in ("hopper", "blackwell"):
            bus *= T.COLLNET_SM90_FACTOR
    return bus


def _one_rank_per_head(hw: Hardware) -> bool:
    """All_gather/reduce_scatter via NVLS or CollNetDirect across nodes: every node's local ranks
    fit its collnet heads (``localRanks <= collNetHeadsNum``)."""
    return hw.sharp and hw.ranks_per_node <= min(hw.nics_per_node, T.MAX_DIRECT_ARITY + 1)


def _latency_us(op: str, algo: str, proto: str, hw: Hardware) -> float:
    """``comm->latencies[op][algo][proto]``."""
    p = T.PROTOCOLS.index(proto)
    n, nodes = hw.num_ranks, hw.num_nodes
    ppn = n // nodes
    tables = T.tuner_release(hw.nccl_version)
    intra_row = tables.nvlink if hw.intra_hw == "nvlink" else tables.pci
    intra = intra_row[algo][p]
    inter = inter_step_us(proto, algo, hw, physical=False)
    base = tables.base[algo][p]
    if algo == "ring":
        hw_row = tables.net if nodes > 1 else intra_row
        if op in ("broadcast", "reduce"):
            return base + hw_row["ring"][p]  # sameChannels graphs
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        if nodes > 1:
            intra = max(intra, net_overhead_us(proto, hw))
        inter_steps = 0 if nodes == 1 else 2 * (nodes - 1) if op == "all_reduce" else nodes - 1
        if op == "all_reduce" and nodes > 1 and tables.ring_all_reduce_2n_net_steps:
            inter_steps = 2 * nodes
        return base + (steps - inter_steps) * intra + inter_steps * inter
    log_nodes = int(math.log2(nodes))
    if algo == "tree":
        return base + (2 * ((ppn - 1) * intra + log_nodes * inter) if op == "all_reduce" else 0.0)
    if algo == "collnet_direct":
        return base + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * T.COLLNET_ARITY_US) + inter
    if algo == "collnet_chain":
        return base + 2 * (ppn - 1) * intra + inter
    if algo == "nvls":
        return intra + (inter if nodes > 1 else 0.0)
    return base + intra + 2 * log_nodes * inter  # nvlstree


def _enabled(op: str, algo: str, proto: str, hw: Hardware) -> bool:
    """NCCL's enable rules (tuning.cc end, enqueue.cc ``updateCollCostTable``)."""
    multi = hw.num_nodes > 1
    collnet = algo in ("collnet_direct", "collnet_chain")
    disabled = (
        (algo == "nvlstree" and not multi)
        or ((collnet or (algo == "nvls" and multi)) and not hw.sharp)
        or (algo == "collnet_direct" and not hw.nvswitch)
        or (collnet and hw.ranks_per_node > T.MAX_DIRECT_ARITY + 1)
        or (algo in ("nvls", "nvlstree") and not hw.nvls)
        or (algo == "nvls" and op != "all_reduce" and hw.ranks_per_node > T.MAX_NVLS_ARITY)
    )
    # LL128 by default on Hopper+ up to PXN, else PXB, and only with NVLink inside the node.
    if (hw.protocols and proto not in hw.protocols) or (
        hw.algorithms and algo not in hw.algorithms
    ):
        return False
    return not disabled and not (proto == "ll128" and hw.intra_hw != "nvlink")


def time_us(op: str, algo: str, proto: str, hw: Hardware, size_bytes: float) -> float:
    """``ncclTopoGetAlgoTime`` for one call; -1 where NCCL disables the combination."""
    entry = tune(hw).get((op, algo, proto))
    if entry is None or entry.algbw_gbps <= 0:
        return -1.0
    bw, latency = entry.algbw_gbps, entry.latency_us
    if algo == "tree" and op == "all_reduce":
        bw *= T.tree_correction(proto, size_bytes)
    blackwell_x86 = hw.arch == "blackwell" and not hw.cpu_arm  # minCompCap >= 100, x86 hosts
    corrects = blackwell_x86 and T.tuner_release(hw.nccl_version).blackwell_nvlstree_correction
    if algo == "nvlstree" and op == "all_reduce" and corrects:
        bw *= T.tree_correction(proto, size_bytes, limit=24)
    plateau = algo == "ring" and proto == "simple" and hw.num_nodes > 1 and op == "all_reduce"
    if plateau and size_bytes / (comm_channels(hw) * hw.num_ranks) >= 64:
        latency *= T.RING_PLATEAU[0 if hw.arch == "volta" else 1]
    return latency + size_bytes / (1000.0 * bw)


def pick(
    op: str, hw: Hardware, size_bytes: float, allowed: Collection[str] = T.NCCL_ALGORITHMS
) -> tuple[str, str] | None:
    """The (algorithm, protocol) NCCL runs: the smallest ``time_us`` among ``allowed``
    algorithms, ties to the first in NCCL's enum order; None for ops outside its model."""
    if op not in MODELLED_OPS:
        return None
    best: tuple[str, str] | None = None
    best_time = math.inf
    for algo in T.NCCL_ALGORITHMS:
        if algo not in allowed:
            continue
        for proto in T.PROTOCOLS:
            t = time_us(op, algo, proto, hw, size_bytes)
            if 0 <= t < best_time:
                best, best_time = (algo, proto), t
    return best
