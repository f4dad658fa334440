"""Closed forms of the two-level algorithms and of in-network reduction (NVLS, SHARP).

Bytes per GPU and per NIC, per direction, that each algorithm moves (the busiest link sets the
time; the phases are pipelined, so a two-level algorithm takes its busier tier):

- NVLink SHARP (NVLS) inside a node: the switch reads/reduces and multicasts, so a GPU moves
  reduce_scatter S up and S/g down, all_gather S/g up and S down (NVIDIA/nccl#1083, #1506), and
  all_reduce S(g+1)/g each way (nccl-tests PR #239: "algbw = busbw_wire x n/(n+1)").
- ring phase inside a node (NCCL's Tree chain, CollNet's intra-node reduce-scatter/all-gather):
  the op's ring wire bytes over g ranks, 2(g-1)/g S for all_reduce.
- across nodes: ``tree`` / ``nvlstree`` NCCL's double binary tree on every rail (a node sends
  at most 4 half-buffers of its rail's S/g; 2 on two nodes); ``hierarchical`` a ring per rail.
- in-network reduction (``collnet_direct``, ``collnet_chain``, multi-node ``nvls``): the
  switches reduce, so each node sends its S once and receives the result once, S/g per GPU's
  NIC each way for all_reduce, instead of the ring's 2(N-1)/N S/g. all_reduce busbw can then
  pass the ring's NIC limit (g x NIC) up to the intra-node bound: e.g. 8 x H100 with NDR:
  ring 376 GB/s busbw; NVLS+SHARP algbw min(8 x 47, 0.834 x 370.8 x 8/9) = 275 GB/s, busbw
  2(n-1)/n x 275 ~ 515 GB/s on 2 nodes. all_gather/reduce_scatter have nothing to reduce:
  a node's NICs carry (N-1)/N S one way and S/N the other.

Steps follow NCCL's latency formulas (``sim/network/nccl_tuner.py``): NVLS 1 intra + 1 inter,
NVLSTree 1 + 2 log2 N, Tree 2(g-1) + 2 log2 N, CollNetDirect 2 min(1, g-1) + 1, CollNetChain
2(g-1) + 1, where a tree's log2 N is rounded up: NCCL's binary tree (``ncclGetBtree``: rank 0 has
one child, then a binary tree) is ceil(log2 N) deep, 3 on 6 nodes, where the tuner's latency
formula counts ``log2i`` (rounded down, ``sim/network/nccl_tuner.py``).

    terms = two_level("all_reduce", "collnet_direct", layout, 1 << 30)
"""

from __future__ import annotations

import functools
import math

from sim.network.terms import CostTerms, GroupPlacement
from vocab.collectives import get

NVLINK4_EFFECTIVE_GBPS = 370.8
"""NCCL's effective NVLink4 bandwidth per GPU and direction, 18 x 20.6 GB/s (topo.h)."""

NVLS_EFFICIENCY: dict[str, float] = {
    # NVIDIA/nccl-tests#212 (NCCL maintainer): 8 x H100 NVLS all_reduce peaks at algbw
    # ~275 GB/s; each GPU moves S (n+1)/n each way -> 275 x 9/8 of the 370.8 GB/s link.
    "all_reduce": 275.0 * 9 / 8 / NVLINK4_EFFECTIVE_GBPS,
    # NVIDIA/nccl#1506: NVLS all_gather busbw ~300 GB/s at 1 GB on 8 x H100, algbw 300 x 8/7,
    # carried by the S-direction.
    "all_gather": 300.0 * 8 / 7 / NVLINK4_EFFECTIVE_GBPS,
    # No published figure: the mirrored traffic of all_gather (S up, S/n down, NVIDIA/nccl#1083).
    "reduce_scatter": 300.0 * 8 / 7 / NVLINK4_EFFECTIVE_GBPS,
}
"""Rate of NVLS traffic relative to NCCL's effective NVLink rate, per op (0.834, 0.925, 0.925).
NCCL's own tuner uses one ``nvlsEfficiency`` (0.85 on Hopper) for every op."""


def nvls_bytes(op: str, size_bytes: float, n: int) -> tuple[float, float]:
    """(up, down) bytes each GPU moves to/from the NVSwitch under NVLink SHARP (module docs)."""
    shard = size_bytes / n
    if op == "reduce_scatter":
        return size_bytes, shard
    if op == "all_gather":
        return shard, size_bytes
    return size_bytes + shard, size_bytes + shard


def nvls_time_s(op: str, size_bytes: float, n: int, bandwidth: float) -> float:
    """Seconds of an NVLS phase over ``n`` GPUs of ``bandwidth`` B/s each."""
    up, down = nvls_bytes(op, size_bytes, n)
    return max(up, down) / (bandwidth * NVLS_EFFICIENCY.get(op, NVLS_EFFICIENCY["all_reduce"]))


def ring_wire_bytes(op: str, size_bytes: float, n: int) -> float:
    """Bytes every rank sends around a ring: the op's busbw bytes (broadcast/reduce: a chain)."""
    return get(op).wire_bytes(size_bytes, n)


def ring_steps(op: str, n: int) -> int:
    """Algorithm steps of a ring over ``n`` ranks (NCCL: AR 2(n-1), else n-1)."""
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def sharp_bytes(op: str, size_bytes: float, num_nodes: int) -> tuple[float, float]:
    """(up, down) bytes a node's NICs carry when the fabric reduces in the network."""
    if op == "all_gather":
        return size_bytes / num_nodes, size_bytes * (num_nodes - 1) / num_nodes
    if op == "reduce_scatter":
        return size_bytes * (num_nodes - 1) / num_nodes, size_bytes / num_nodes
    return size_bytes, size_bytes


IN_NETWORK = ("collnet_direct", "collnet_chain", "nvls")
"""Algorithms whose inter-node phase the fabric's switches reduce (``nvls`` on several nodes)."""


def two_level(op: str, algo: str, layout: GroupPlacement, size_bytes: float) -> CostTerms:
    """Cost pieces of a multi-node two-level algorithm (see the module docstring)."""
    g, nodes = layout.ranks_per_node, layout.num_nodes
    if algo in IN_NETWORK:
        net_bytes = max(sharp_bytes(op, size_bytes, nodes)) / g
        inter = 1
    elif algo in ("tree", "nvlstree"):
        net_bytes = double_tree_max_sends(nodes) * size_bytes / g / 2
        inter = 2 * math.ceil(math.log2(nodes))
    else:
        net_bytes = ring_wire_bytes(op, size_bytes, nodes) / g
        inter = ring_steps(op, nodes)
    intra_time, intra = _intra_phase(op, algo, layout, size_bytes)
    bw_time = max(net_bytes / layout.net_bandwidth_bytes_per_s, intra_time)
    hops = intra * layout.intra_hop_latency_s + inter * layout.inter_hop_latency_s
    return CostTerms(
        intra_steps=intra, inter_steps=inter, hop_latency_s=hops, bandwidth_time_s=bw_time
    )


def uses_nvls_inside(algo: str, layout: GroupPlacement) -> bool:
    """Whether ``algo``'s intra-node phase runs on NVLS (``hierarchical`` wherever it can)."""
    return algo in ("nvls", "nvlstree") or (algo == "hierarchical" and layout.nvls)


def _intra_phase(
    op: str, algo: str, layout: GroupPlacement, size_bytes: float
) -> tuple[float, int]:
    """(seconds, steps) of the intra-node part of a two-level op (0 with one GPU per node)."""
    g = layout.ranks_per_node
    bandwidth = layout.intra_bandwidth_bytes_per_s
    if g == 1:
        return 0.0, 0
    if uses_nvls_inside(algo, layout):
        steps = 2 if algo == "hierarchical" and op == "all_reduce" else 1
        return nvls_time_s(op, size_bytes, g, bandwidth), steps
    seconds = ring_wire_bytes(op, size_bytes, g) / bandwidth
    if algo == "collnet_direct":
        return seconds, 2 * min(1, g - 1)
    if algo in ("collnet_chain", "tree"):
        return seconds, 2 * (g - 1)
    return seconds, ring_steps(op, g)


@functools.lru_cache(maxsize=256)
def double_tree_max_sends(num_nodes: int) -> int:
    """Most tree-edge sends of any node over NCCL's two complementary binary trees.

    Each tree edge carries the half-buffer once up (reduce) and once down (broadcast); a node
    sends once to its parent and once to each child, per tree (see ``double_tree_edges``).
    """
    sends = [0] * num_nodes
    for tree in double_tree_edges(num_nodes):
        for parent, child in tree:
            sends[parent] += 1
            sends[child] += 1
    return max(sends)


def double_tree_edges(num_nodes: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """(parent, child) node pairs of NCCL's two complementary binary trees (``ncclGetDtree``).

    Tree 0 is NCCL's in-order binary tree (``ncclGetBtree``: odd nodes inner, even nodes
    leaves); tree 1 mirrors it (node i -> N-1-i) when N is even and shifts it by one when N is
    odd, so most inner nodes of one tree are leaves of the other.
    """
    n = num_nodes
    first = tuple((_btree_parent(r, n), r) for r in range(1, n))
    if n % 2 == 0:
        second = tuple((n - 1 - p, n - 1 - c) for p, c in first)
    else:
        second = tuple(((p + 1) % n, (c + 1) % n) for p, c in first)
    return first, second


def _btree_parent(rank: int, n: int) -> int:
    """Parent of ``rank`` in NCCL's in-order binary tree over ``n`` nodes (root 0)."""
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    parent = (rank ^ bit) | (bit << 1)
    return parent if parent < n else rank ^ bit
