"""Collective algorithms as flows on the topology, and NCCL-like automatic selection.

Each algorithm turns a collective into a few *flow groups*: sets of paths whose transfers
advance in lockstep (``FlowGroup``). The decompositions, and why they equal the closed forms of
``sim/network/analytical.py`` on an uncongested topology:

- ring: in steady state a ring channel is n concurrent hops, each carrying the op's wire bytes
  (all_reduce 2(n-1)/n S; all_gather, reduce_scatter (n-1)/n S; broadcast/reduce a chain of
  n-1 hops carrying S), moving at the ring's bottleneck rate. One channel on one node; on
  several nodes one channel per local GPU, each entering every node through a different GPU
  (rail) so every NIC carries 1/g of the bytes and NVLink the other (g-1)/g. The 2(n-1) step
  latencies are paid once before the bytes flow (pipelined ring).
- nvls: every GPU's link to its NVSwitch carries the ``nvls_bytes`` up and down.
- hierarchical: the intra-node phase (NVLS, else a ring per node) and the inter-node phase (a
  ring per rail across nodes, on 1/g of the buffer) run concurrently, as NCCL pipelines them.
- tree: like hierarchical, with the inter-node phase on NCCL's double binary tree per rail.
- direct: every (sender, receiver) pair is an independent flow of S/n (all_to_all); send_recv
  is one send (src, dst), or on more ranks every rank sending S to the next (nccl-tests).
- gloo (CPU): all_reduce and reduce_scatter a ring carrying all_reduce's 2(n-1)/n S (gloo
  reduce-scatters through an all_reduce), all_gather a ring, all_to_all pairwise flows,
  broadcast/reduce the root's binomial-tree edges, S each (the root's link carries
  ceil(log2 n) S, as the closed form).

    groups = decompose("all_reduce", "ring", topology, (0, 1, 2, 3), 1 << 20)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from comm_bench.collectives import get
from sim.network.analytical import (
    NVLS_EFFICIENCY,
    CommParams,
    Layout,
    available_algorithms,
    check_algorithm,
    cost_terms,
    double_tree_edges,
    gloo_plan,
    nvls_bytes,
    ring_wire_bytes,
)
from topologies.topology import Path, Topology

AUTO_ALGORITHMS = ("ring", "tree", "nvls", "direct", "gloo")
"""Algorithms ``auto`` chooses among: NCCL's (its NVLSTree is our ``tree`` on NVLS nodes).

``hierarchical`` (NVLS or ring inside nodes, a ring per rail across them) is not an NCCL
algorithm; it models hierarchical schemes of frameworks and can be forced with ``--algo``.
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowGroup:
    """Paths that each carry ``size_bytes`` at one common rate."""

    paths: tuple[Path, ...]
    """Directed-edge paths moving in lockstep."""
    size_bytes: float
    """Bytes each path carries (at 100% efficiency)."""


def group_nodes(topology: Topology, ranks: Sequence[int]) -> list[list[int]]:
    """The group's ranks per node, nodes in order of first appearance, ranks in given order."""
    by_node: dict[int, list[int]] = {}
    for rank in ranks:
        by_node.setdefault(topology.node_index(rank), []).append(rank)
    return list(by_node.values())


def layout_of(topology: Topology, ranks: Sequence[int]) -> Layout:
    """Read the bandwidths and latencies the closed forms need for this group off the topology."""
    if len(set(ranks)) != len(ranks) or not ranks:
        raise ValueError(f"ranks must be distinct and non-empty, got {list(ranks)}")
    nodes = group_nodes(topology, ranks)
    g = max(len(members) for members in nodes)
    intra_bw, intra_lat = math.inf, 0.0
    spec = topology.gpu_spec(ranks[0])
    nvlink_any = topology.injection_bandwidth_bytes_per_s(ranks[0], "nvlink") > 0
    seen: set[tuple[int, ...]] = set()
    for members in nodes:
        if len(members) < 2:
            continue
        if topology.node is not None:  # identical servers: one look per pattern of local GPUs
            pattern = tuple(topology.local_index(r) for r in members)
            if pattern in seen:
                continue
            seen.add(pattern)
        ring = list(zip(members, members[1:] + members[:1], strict=True))
        hop_bw = min(_path_bw(topology, topology.path(a, b)) for a, b in ring)
        nvlink = min(
            topology.injection_bandwidth_bytes_per_s(r, "nvlink", effective=True) for r in members
        )
        intra_bw = min(intra_bw, nvlink if nvlink > 0 else hop_bw)
        intra_lat = max(intra_lat, topology.path_latency_s(topology.path(*ring[0])))
    net_bw, inter_lat = math.inf, 0.0
    bisection = math.inf
    if len(nodes) > 1:
        probes = ranks  # identical servers: one rank per local GPU position is enough
        if topology.node is not None:
            probes = list({topology.local_index(r): r for r in ranks}.values())
        net_bw = min(
            topology.injection_bandwidth_bytes_per_s(r, "network", effective=True) for r in probes
        )
        cross = topology.path(nodes[0][0], nodes[1][0])
        if net_bw == 0:
            net_bw = _path_bw(topology, cross)
        inter_lat = topology.path_latency_s(cross)
        bisection = topology.bisection_bandwidth_bytes_per_s(effective=True) * len(nodes)
        bisection /= topology.num_nodes
    return Layout(
        num_ranks=len(ranks),
        num_nodes=len(nodes),
        ranks_per_node=g,
        intra_bandwidth_bytes_per_s=intra_bw,
        net_bandwidth_bytes_per_s=net_bw,
        intra_hop_latency_s=intra_lat,
        inter_hop_latency_s=inter_lat,
        bisection_bandwidth_bytes_per_s=bisection,
        nvls=topology.nvls_capable(),
        backend="gloo" if spec.name == "cpu" else "nccl",
        gpu_arch=gpu_arch(spec.name),
        intra_hw="nvlink" if nvlink_any else "pci",
    )


def gpu_arch(spec_name: str) -> str:
    """GPU generation of a catalogue GPU name (``""`` when unknown), for NCCL's tables."""
    for prefix, arch in (("h1", "hopper"), ("h2", "hopper"), ("a1", "ampere"), ("v1", "volta")):
        if spec_name.lower().startswith(prefix):
            return arch
    return ""


def _path_bw(topology: Topology, path: Path) -> float:
    return topology.path_bandwidth_bytes_per_s(path, effective=True)


def choose_algorithm(
    op: str, layout: Layout, size_bytes: float, params_for: Callable[[str], CommParams]
) -> str:
    """The algorithm with the smallest predicted time, as NCCL's tuner picks (ties: list order).

    Only NCCL's own algorithms compete (``AUTO_ALGORITHMS``); ``hierarchical`` runs when forced.
    """
    best, best_time = "", math.inf
    for algo in available_algorithms(op, layout):
        if algo not in AUTO_ALGORITHMS:
            continue
        time_s = cost_terms(op, algo, layout, size_bytes).time_s(params_for(algo), size_bytes)
        if time_s < best_time:
            best, best_time = algo, time_s
    if not best:
        raise ValueError(f"no algorithm can run {op} on this group")
    return best


MAX_DIRECT_FLOWS = 1_000_000
"""Most pairwise flows one direct collective may have in the flow model (about 1,000 ranks):
beyond that the flows alone take minutes and gigabytes; the analytical model is O(1)."""


def decompose(
    op: str, algo: str, topology: Topology, ranks: Sequence[int], size_bytes: float,
    *, root: int = 0, layout: Layout | None = None,
) -> list[FlowGroup]:  # fmt: skip
    """The flow groups of ``op`` by ``algo`` on ``ranks`` (see the module docstring)."""
    layout = layout or layout_of(topology, ranks)
    check_algorithm(op, algo, layout)
    if len(ranks) == 1 or size_bytes == 0:
        return []
    nodes = group_nodes(topology, ranks)
    if algo == "gloo":
        return _gloo_groups(op, topology, ranks, size_bytes, root)
    if algo == "ring":
        return _ring_groups(op, topology, ranks, nodes, size_bytes, root)
    if algo == "nvls":
        return _nvls_groups(op, topology, ranks, size_bytes)
    if algo in ("hierarchical", "tree"):
        return _intra_groups(op, topology, nodes, size_bytes, layout) + _inter_groups(
            op, algo, topology, nodes, size_bytes
        )
    if op == "send_recv":
        return _send_recv_groups(topology, ranks, size_bytes)
    pairs = len(ranks) * (len(ranks) - 1)
    if pairs > MAX_DIRECT_FLOWS:
        raise ValueError(
            f"the flow model of {op} over {len(ranks):,} ranks needs {pairs:,} point-to-point "
            f"flows; it simulates at most {MAX_DIRECT_FLOWS:,}: use the analytical model "
            "(--fidelity analytical) at this scale"
        )
    chunk = size_bytes / len(ranks)
    return [
        FlowGroup(paths=(topology.path(src, dst),), size_bytes=chunk)
        for src in ranks
        for dst in ranks
        if src != dst
    ]


def ring_orders(nodes: Sequence[Sequence[int]]) -> list[list[int]]:
    """Rank order of each ring channel: one on one node, else one per local GPU (rail).

    Channel c enters node j at local position (c - j) mod g and leaves from the GPU before it,
    which is where it enters node j+1: each GPU exits its node in exactly one channel.
    """
    if len(nodes) == 1:
        return [list(nodes[0])]
    g = len(nodes[0])
    if any(len(members) != g for members in nodes):
        raise ValueError(f"multi-node rings need the same number of ranks per node, got {nodes}")
    orders = []
    for channel in range(g):
        order: list[int] = []
        for j, members in enumerate(nodes):
            start = (channel - j) % g
            order.extend([*members[start:], *members[:start]])
        orders.append(order)
    return orders


def _ring_groups(
    op: str, topology: Topology, ranks: Sequence[int], nodes: list[list[int]],
    size_bytes: float, root: int,
) -> list[FlowGroup]:  # fmt: skip
    orders = ring_orders(nodes)
    wire = ring_wire_bytes(op, size_bytes, len(ranks))
    chain = get(op).rooted
    groups = []
    for channel, order in enumerate(orders):
        if chain:  # a pipelined chain from the root: the ring without the hop into the root
            at = order.index(ranks[root])
            order = order[at:] + order[:at]
        hops = list(zip(order, order[1:] + order[:1], strict=True))
        if chain:
            hops = hops[:-1]
        paths = tuple(topology.path(a, b, channel) for a, b in hops)
        groups.append(FlowGroup(paths=paths, size_bytes=wire / len(orders)))
    return groups


def switch_edges(topology: Topology, rank: int) -> tuple[list[Path], list[Path]]:
    """One-edge paths from ``rank``'s GPU up to each of its NVSwitches, and back down."""
    gpu = topology.gpus[rank]
    graph = topology.graph
    switches = sorted(v for v in graph.successors(gpu) if graph.nodes[v]["kind"] == "nvswitch")
    if not switches:
        raise ValueError(f"rank {rank} has no NVSwitch; 'nvls' needs one")
    return [((gpu, s),) for s in switches], [((s, gpu),) for s in switches]


def _nvls_groups(
    op: str, topology: Topology, ranks: Sequence[int], size_bytes: float
) -> list[FlowGroup]:
    up_bytes, down_bytes = nvls_bytes(op, size_bytes, len(ranks))
    ups: list[Path] = []
    downs: list[Path] = []
    for rank in ranks:
        up, down = switch_edges(topology, rank)
        ups.extend(up)
        downs.extend(down)
    # Bytes spread evenly over a GPU's switch chips, moved at the switch's NVLS efficiency.
    per_switch = len(ups) // len(ranks) * NVLS_EFFICIENCY
    return [
        FlowGroup(paths=tuple(ups), size_bytes=up_bytes / per_switch),
        FlowGroup(paths=tuple(downs), size_bytes=down_bytes / per_switch),
    ]


def _intra_groups(
    op: str, topology: Topology, nodes: list[list[int]], size_bytes: float, layout: Layout
) -> list[FlowGroup]:
    if layout.ranks_per_node == 1:
        return []
    if layout.nvls:
        groups = []
        for members in nodes:
            groups.extend(_nvls_groups(op, topology, members, size_bytes))
        return groups
    wire = ring_wire_bytes(op, size_bytes, layout.ranks_per_node)
    return [
        FlowGroup(
            paths=tuple(
                topology.path(a, b) for a, b in zip(members, members[1:] + members[:1], strict=True)
            ),
            size_bytes=wire,
        )
        for members in nodes
    ]


def _inter_groups(
    op: str, algo: str, topology: Topology, nodes: list[list[int]], size_bytes: float
) -> list[FlowGroup]:
    g = len(nodes[0])
    if any(len(members) != g for members in nodes):
        raise ValueError(f"{algo} needs the same number of ranks per node, got {nodes}")
    rail_bytes = size_bytes / g
    groups = []
    for rail in range(g):
        members = [node[rail] for node in nodes]
        if algo == "tree":
            for tree in double_tree_edges(len(members)):
                paths = []
                for parent, child in tree:
                    paths.append(topology.path(members[child], members[parent], rail))
                    paths.append(topology.path(members[parent], members[child], rail))
                groups.append(FlowGroup(paths=tuple(paths), size_bytes=rail_bytes / 2))
            continue
        hops = zip(members, members[1:] + members[:1], strict=True)
        groups.append(
            FlowGroup(
                paths=tuple(topology.path(a, b, rail) for a, b in hops),
                size_bytes=ring_wire_bytes(op, size_bytes, len(members)) / g,
            )
        )
    return groups


def _gloo_groups(
    op: str, topology: Topology, ranks: Sequence[int], size_bytes: float, root: int
) -> list[FlowGroup]:
    """gloo's algorithms as flow groups (module docstring); bytes as ``gloo_plan``'s."""
    n = len(ranks)
    sent, _ = gloo_plan(op, n, size_bytes)
    if op in ("all_reduce", "reduce_scatter", "all_gather"):
        hops = zip(ranks, [*ranks[1:], ranks[0]], strict=True)
        return [FlowGroup(paths=tuple(topology.path(a, b) for a, b in hops), size_bytes=sent)]
    if op in ("broadcast", "reduce"):
        rounds = math.ceil(math.log2(n))
        children = [ranks[(root + (1 << k)) % n] for k in range(rounds)]
        pairs = [(ranks[root], c) if op == "broadcast" else (c, ranks[root]) for c in children]
        return [
            FlowGroup(paths=tuple(topology.path(a, b) for a, b in pairs), size_bytes=size_bytes)
        ]
    if op == "send_recv":
        return _send_recv_groups(topology, ranks, size_bytes)
    chunk = size_bytes / n
    return [
        FlowGroup(paths=(topology.path(src, dst),), size_bytes=chunk)
        for src in ranks
        for dst in ranks
        if src != dst
    ]


def _send_recv_groups(
    topology: Topology, ranks: Sequence[int], size_bytes: float
) -> list[FlowGroup]:
    """One send (src, dst), or nccl-tests' ring shift: every rank sends S to the next."""
    pairs = (
        [(ranks[0], ranks[1])]
        if len(ranks) == 2
        else list(zip(ranks, [*ranks[1:], ranks[0]], strict=True))
    )
    return [FlowGroup(paths=(topology.path(a, b),), size_bytes=size_bytes) for a, b in pairs]
