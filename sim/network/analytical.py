"""Closed-form alpha-beta cost of each collective algorithm on a topology: O(1) per call.

A collective's time is NCCL's protocol-aware alpha-beta model: for the protocol NCCL's tuner
picks (``sim/network/nccl_tuner.py``), or the fastest one the algorithm can use when forced
(LL, LL128, Simple; ``sim/network/protocols.py``), a latency plus a bandwidth term (reference
§3.4-3.7):

    latency_p = (proto_base_p + intra_steps * proto_intra_p + inter_steps * proto_inter_p)
                * plateau_p + base + intra_steps * intra_step + inter_steps * inter_step + hops
    bandwidth_p = max(bandwidth_time / factor_p, bus_bytes / cap_p) * channels_p(size)
                  / tree_correction_p(size) * (1 + chunk_p / size) / efficiency(size)
    efficiency(size) = efficiency_max / (1 + (half_size / size) ** shape)

``bandwidth_time`` is the busiest link's bytes over its bandwidth at 100% efficiency, read off
the topology for the group's placement (``GroupPlacement``): the per-GPU intra-node bandwidth
(NVLink, or the bottleneck of the intra-node hops), the per-GPU network bandwidth and the
bisection. The
two-level and in-network algorithms (``tree``, ``nvlstree``, ``hierarchical``, ``collnet_*``,
``nvls`` across nodes) are in ``sim/network/hierarchy.py``. The flow model
(``sim/network/algorithms.py``) moves the same bytes with the same latencies over the graph, so
on an uncongested topology both give the same time.

    time_s = cost_terms("all_reduce", "ring", layout, 1 << 30).time_s(params, 1 << 30)
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from sim.network.hierarchy import (
    IN_NETWORK,
    NVLS_EFFICIENCY,
    double_tree_edges,
    double_tree_max_sends,
    nvls_bytes,
    nvls_time_s,
    ring_steps,
    ring_wire_bytes,
    two_level,
)
from sim.network.protocols import protocols_for
from sim.network.terms import CommParams, CostTerms, GroupPlacement
from vocab.collectives import get

__all__ = [
    "ALGORITHMS",
    "NVLS_EFFICIENCY",
    "OP_ALGORITHMS",
    "CommParams",
    "CostTerms",
    "GroupPlacement",
    "available_algorithms",
    "check_algorithm",
    "cost_terms",
    "double_tree_edges",
    "double_tree_max_sends",
    "gloo_plan",
    "nvls_bytes",
    "ring_steps",
    "ring_wire_bytes",
]

OP_ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": (
        "ring", "tree", "nvls", "nvlstree", "collnet_direct", "collnet_chain", "hierarchical",
        "gloo",
    ),
    "all_gather": ("ring", "nvls", "collnet_direct", "hierarchical", "gloo"),
    "reduce_scatter": ("ring", "nvls", "collnet_direct", "hierarchical", "gloo"),
    "all_to_all": ("direct", "gloo"),
    "broadcast": ("ring", "gloo"),
    "reduce": ("ring", "gloo"),
    "send_recv": ("direct", "gloo"),
}  # fmt: skip
"""Algorithms each op can run with, as NCCL 2.30 implements them (tuning.cc: all_gather and
reduce_scatter by Ring, NVLS, CollNetDirect and PAT; ``direct``: every transfer at once, point to
point; ``gloo``: gloo's CPU algorithms, see ``_gloo``)."""

ALGORITHMS = (
    "ring", "tree", "nvls", "nvlstree", "collnet_direct", "collnet_chain", "hierarchical",
    "direct", "gloo",
)  # fmt: skip
"""Every algorithm name accepted by ``--algo`` (besides ``auto``)."""

_MAX_COLLNET_LOCAL_RANKS = 8
"""CollNet algorithms run with at most 8 local ranks (``NCCL_MAX_DIRECT_ARITY + 1``)."""


def check_algorithm(op: str, algo: str, layout: GroupPlacement) -> None:
    """ValueError unless ``algo`` can run ``op`` on this layout."""
    if algo not in OP_ALGORITHMS[op]:
        raise ValueError(
            f"algorithm {algo!r} does not implement {op}; valid: {', '.join(OP_ALGORITHMS[op])}"
        )
    multi = layout.num_nodes > 1
    if algo in ("nvls", "nvlstree") and not layout.nvls:
        raise ValueError(
            f"algorithm {algo!r} needs nodes whose NVSwitch reduces in the switch (NVLink "
            "SHARP, H100/H200 NVSwitch gen3); this topology/group has none"
        )
    if algo in ("tree", "nvlstree", "hierarchical") and not multi:
        raise ValueError(f"algorithm {algo!r} needs ranks on >= 2 nodes; this group spans 1")
    if (algo in IN_NETWORK and multi) or algo.startswith("collnet"):
        _check_in_network(op, algo, layout)
    if (algo == "gloo") != (layout.backend == "gloo"):
        raise ValueError(
            f"algorithm {algo!r} does not run on the {layout.backend} backend of this topology; "
            f"valid: {'gloo' if layout.backend == 'gloo' else 'the NCCL algorithms'}"
        )


def _check_in_network(op: str, algo: str, layout: GroupPlacement) -> None:
    """NCCL's conditions for CollNet and NVLS + SHARP (tuning.cc, enqueue.cc)."""
    if layout.num_nodes < 2:
        raise ValueError(f"algorithm {algo!r} needs ranks on >= 2 nodes; this group spans 1")
    if not layout.sharp:
        raise ValueError(
            f"algorithm {algo!r} across nodes needs switches that reduce (SHARP) with NCCL's "
            "CollNet enabled (NCCL_COLLNET_ENABLE=1: fabric ib-ndr-sharp-collnet, or a fabric "
            "with sharp: true and collnet: true); this fabric does not have both"
        )
    if algo == "collnet_direct" and not layout.nvswitch:
        raise ValueError("algorithm 'collnet_direct' needs an NVSwitch inside the nodes")
    g = layout.ranks_per_node
    if algo.startswith("collnet") and g > _MAX_COLLNET_LOCAL_RANKS:
        raise ValueError(f"algorithm {algo!r} runs with at most 8 ranks per node, got {g}")
    heads = min(layout.nics_per_node or g, _MAX_COLLNET_LOCAL_RANKS)
    if op != "all_reduce" and g > heads:
        raise ValueError(
            f"{op} by {algo!r} across nodes needs one NIC (collnet head) per local rank; "
            f"{g} ranks per node share {heads}"
        )


@functools.lru_cache(maxsize=1024)
def available_algorithms(op: str, layout: GroupPlacement) -> tuple[str, ...]:
    """The algorithms of ``op`` this layout supports, in ``OP_ALGORITHMS`` order."""
    usable = []
    for algo in OP_ALGORITHMS[op]:
        try:
            check_algorithm(op, algo, layout)
        except ValueError:
            continue
        usable.append(algo)
    return tuple(usable)


def cost_terms(
    op: str, algo: str, layout: GroupPlacement, size_bytes: float, protocol: str | None = None
) -> CostTerms:
    """The closed-form cost pieces of ``op`` by ``algo`` on ``layout`` (see module docstring).

    ``protocol`` keeps only that protocol (the one NCCL's tuner picked); None keeps them all.
    """
    check_algorithm(op, algo, layout)
    if layout.num_ranks == 1:
        return CostTerms(intra_steps=0, inter_steps=0, hop_latency_s=0.0, bandwidth_time_s=0.0)
    terms = _bare_terms(op, algo, layout, size_bytes)
    protocols = () if layout.backend == "gloo" else protocols_for(op, algo, layout.hardware())
    if protocol is not None:
        chosen = tuple(p for p in protocols if p.name == protocol)
        if not chosen:
            valid = ", ".join(p.name for p in protocols) or "none"
            raise ValueError(f"protocol {protocol!r} does not run {op} by {algo}; valid: {valid}")
        protocols = chosen
    return replace(
        terms, bus_bytes=get(op).wire_bytes(size_bytes, layout.num_ranks), protocols=protocols
    )


def _bare_terms(op: str, algo: str, layout: GroupPlacement, size_bytes: float) -> CostTerms:
    """Steps, hop latencies and bandwidth time of ``op`` by ``algo`` (no protocols yet)."""
    n, nodes = layout.num_ranks, layout.num_nodes
    if algo == "gloo":
        return _gloo(op, layout, size_bytes)
    if algo == "ring":
        return _ring(op, layout, size_bytes)
    if algo == "nvls" and nodes == 1:
        bw_time = nvls_time_s(op, size_bytes, n, layout.intra_bandwidth_bytes_per_s)
        return CostTerms(
            intra_steps=1, inter_steps=0, hop_latency_s=layout.intra_hop_latency_s,
            bandwidth_time_s=bw_time,
        )  # fmt: skip
    if algo != "direct":
        return two_level(op, algo, layout, size_bytes)
    if op == "send_recv":
        hop = layout.intra_hop_latency_s if nodes == 1 else layout.inter_hop_latency_s
        bw = layout.intra_bandwidth_bytes_per_s if nodes == 1 else layout.net_bandwidth_bytes_per_s
        return CostTerms(
            intra_steps=int(nodes == 1), inter_steps=int(nodes > 1), hop_latency_s=hop,
            bandwidth_time_s=size_bytes / bw,
        )  # fmt: skip
    return _direct_all_to_all(layout, size_bytes)


def _ring(op: str, layout: GroupPlacement, size_bytes: float) -> CostTerms:
    n, g, nodes = layout.num_ranks, layout.ranks_per_node, layout.num_nodes
    wire = ring_wire_bytes(op, size_bytes, n)
    steps = ring_steps(op, n)
    inter = 0 if nodes == 1 else ring_steps(op, nodes)
    if op in ("broadcast", "reduce") and nodes > 1:
        inter = nodes - 1
    if nodes == 1:
        bw_time = wire / layout.intra_bandwidth_bytes_per_s
    else:
        # One channel per local GPU; each GPU is its node's exit in one channel (network) and an
        # ordinary ring member in the other g-1 (NVLink).
        bw_time = max(
            wire / g / layout.net_bandwidth_bytes_per_s,
            wire * (g - 1) / g / layout.intra_bandwidth_bytes_per_s,
        )
    hops = (steps - inter) * layout.intra_hop_latency_s + inter * layout.inter_hop_latency_s
    return CostTerms(
        intra_steps=steps - inter, inter_steps=inter, hop_latency_s=hops, bandwidth_time_s=bw_time
    )


def _direct_all_to_all(layout: GroupPlacement, size_bytes: float) -> CostTerms:
    n, g, nodes = layout.num_ranks, layout.ranks_per_node, layout.num_nodes
    chunk = size_bytes / n
    intra_time = (g - 1) * chunk / layout.intra_bandwidth_bytes_per_s if g > 1 else 0.0
    if nodes == 1:
        return CostTerms(
            intra_steps=1, inter_steps=0, hop_latency_s=layout.intra_hop_latency_s,
            bandwidth_time_s=intra_time,
        )  # fmt: skip
    net_time = (n - g) * chunk / layout.net_bandwidth_bytes_per_s
    # Half the ranks send half their data across the bisection (each direction).
    crossing = n * n / 4 * chunk * _crossing_fraction(nodes)
    bisection_time = crossing / layout.bisection_bandwidth_bytes_per_s
    return CostTerms(
        intra_steps=0, inter_steps=1, hop_latency_s=layout.inter_hop_latency_s,
        bandwidth_time_s=max(intra_time, net_time, bisection_time),
    )  # fmt: skip


def _crossing_fraction(num_nodes: int) -> float:
    """Exact share of the n^2/4 bisection pairs when the cut falls between whole nodes."""
    half = num_nodes // 2
    return 4.0 * half * (num_nodes - half) / (num_nodes * num_nodes)


def gloo_plan(op: str, n: int, size_bytes: float) -> tuple[float, int]:
    """(bytes the busiest rank sends, sequential messages) of gloo's CPU algorithm for ``op``.

    gloo (reference §5.2): all_reduce is a ring (reduce-scatter + all-gather, 2(n-1) messages
    of S/n); reduce_scatter is an all_reduce of the whole input plus a local chunk (2x the
    traffic of a real reduce-scatter); all_gather a ring (n-1 messages); all_to_all pairwise
    exchange (n-1 messages of S/n); broadcast and reduce a binomial tree (ceil(log2 n) rounds,
    the root sending or receiving S per round); send_recv one message.
    """
    if op in ("all_reduce", "reduce_scatter"):
        return get("all_reduce").wire_bytes(size_bytes, n), 2 * (n - 1)
    if op in ("all_gather", "all_to_all"):
        return get(op).wire_bytes(size_bytes, n), n - 1
    if op in ("broadcast", "reduce"):
        rounds = math.ceil(math.log2(n))
        return rounds * size_bytes, rounds
    return size_bytes, 1


def _gloo(op: str, layout: GroupPlacement, size_bytes: float) -> CostTerms:
    """gloo's algorithm: ``gloo_plan``'s messages, each a hop of the loopback."""
    sent, messages = gloo_plan(op, layout.num_ranks, size_bytes)
    one_node = layout.num_nodes == 1
    hop = layout.intra_hop_latency_s if one_node else layout.inter_hop_latency_s
    bw = layout.intra_bandwidth_bytes_per_s if one_node else layout.net_bandwidth_bytes_per_s
    return CostTerms(
        intra_steps=messages if one_node else 0, inter_steps=0 if one_node else messages,
        hop_latency_s=messages * hop, bandwidth_time_s=sent / bw,
    )  # fmt: skip
