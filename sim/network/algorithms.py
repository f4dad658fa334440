"""Collective algorithms as flows on the topology, and the (algorithm, protocol) NCCL picks.

Each algorithm turns a collective into a few *flow groups*: sets of paths whose transfers
advance in lockstep (``FlowGroup``). The decompositions, and why they equal the closed forms of
``sim/network/analytical.py`` on an uncongested topology:

- ring: in steady state a ring channel is n concurrent hops, each carrying the op's wire bytes
  (all_reduce 2(n-1)/n S; all_gather, reduce_scatter (n-1)/n S; broadcast/reduce a chain of
  n-1 hops carrying S), moving at the ring's bottleneck rate. One channel on one node; on
  several nodes one channel per local GPU, each entering every node through a different GPU
  (rail) so every NIC carries 1/g of the bytes and NVLink the other (g-1)/g. The 2(n-1) step
  latencies are paid once before the bytes flow (pipelined ring).
- nvls (one node): every GPU's link to its NVSwitch carries the ``nvls_bytes`` up and down.
- two-level (``tree``, ``nvlstree``, ``hierarchical``, ``collnet_direct``, ``collnet_chain``,
  ``nvls`` across nodes): an intra-node phase and an inter-node phase per rail, concurrent as
  NCCL pipelines them (``sim/network/tiered_flows.py``; in-network reduction loads each link of
  the fabric's reduction tree once).
- direct: every (sender, receiver) pair is an independent flow of S/n (all_to_all); send_recv
  is one send (src, dst), or on more ranks every rank sending S to the next (nccl-tests).
- gloo (CPU): all_reduce and reduce_scatter a ring carrying all_reduce's 2(n-1)/n S (gloo
  reduce-scatters through an all_reduce), all_gather a ring, all_to_all pairwise flows,
  broadcast/reduce the root's binomial-tree edges, S each (the root's link carries
  ceil(log2 n) S, as the closed form).

Which algorithm and protocol run (``choose``) is what NCCL's tuner predicts fastest
(``sim/network/nccl_tuner.py``), or a tuner plugin's pick on fabrics that load one.

    groups = decompose("all_reduce", "ring", topology, (0, 1, 2, 3), 1 << 20)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from sim.network.analytical import (
    GroupPlacement,
    available_algorithms,
    check_algorithm,
    gloo_plan,
    ring_wire_bytes,
)
from sim.network.nccl_tables import LL_MAX_GBPS, NCCL_ALGORITHMS
from sim.network.nccl_tuner import MODELLED_OPS, pick
from sim.network.plugin_tuner import region_pick
from sim.network.terms import FlowGroup
from sim.network.tiered_flows import inter_groups, intra_groups, nvls_groups, switch_edges
from topologies.hardware import LINKS, GPUSpec
from topologies.topology import FABRIC_KINDS, Path, Topology
from vocab.collectives import get

__all__ = [
    "AUTO_ALGORITHMS",
    "FlowGroup",
    "choose",
    "choose_algorithm",
    "decompose",
    "group_nodes",
    "placement_of",
    "ring_orders",
    "switch_edges",
]

AUTO_ALGORITHMS = (*NCCL_ALGORITHMS, "direct", "gloo")
"""Algorithms ``auto`` chooses among: NCCL's, ``direct`` for all_to_all and send_recv (outside
NCCL's tuning model) and ``gloo`` on CPU. ``hierarchical`` (NVLS or a ring inside nodes, a ring
per rail across them) models frameworks' hierarchical schemes and runs only when forced."""


def group_nodes(topology: Topology, ranks: Sequence[int]) -> list[list[int]]:
    """The group's ranks per node, nodes in order of first appearance, ranks in given order."""
    by_node: dict[int, list[int]] = {}
    for rank in ranks:
        by_node.setdefault(topology.node_index(rank), []).append(rank)
    return list(by_node.values())


def placement_of(topology: Topology, ranks: Sequence[int]) -> GroupPlacement:
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
        if topology.uniform:  # identical servers: one look per pattern of local GPUs
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
        if topology.uniform:
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
        net_bw *= fabric_factor(topology, nodes)
    return GroupPlacement(
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
        gpu_arch=gpu_arch(spec),
        intra_hw="nvlink" if nvlink_any else "pci",
        nvswitch=_has_nvswitch(topology, ranks[0]),
        nccl_version=topology.nccl_version,
        **_network_fields(topology, len(nodes) > 1),
    )


def fabric_factor(topology: Topology, nodes: Sequence[Sequence[int]]) -> float:
    """The share of its network rate a group keeps on a fabric whose switch links a what-if
    changed (``Topology.intact``; 1 otherwise): its traffic across servers taken as the rail
    flows of its ring (local GPU c of each server to local GPU c of the next, one channel per
    local GPU, as ``analytical._ring`` times it), each routed as the fabric routes it, sharing
    each link with the group's other flows on it; the group moves at its slowest flow's rate,
    relative to the same flows on the intact fabric (at most 1: a re-route that happens to
    spread the group's flows better does not make the fabric faster than the analytical model's
    non-blocking one)."""
    intact = topology.intact
    if intact is None or len(nodes) < 2:
        return 1.0
    now, before = _slowest_rail_flow(topology, nodes), _slowest_rail_flow(intact, nodes)
    return 1.0 if math.isinf(before) else min(1.0, now / before)


def _slowest_rail_flow(topology: Topology, nodes: Sequence[Sequence[int]]) -> float:
    """Bytes/s of the slowest of the group's rail flows across servers (``fabric_factor``),
    each link's effective rate shared evenly among the group's flows on it."""
    width = min(len(members) for members in nodes)
    flows = [
        (nodes[i][c], nodes[(i + 1) % len(nodes)][c])
        for c in range(width)
        for i in range(len(nodes))
    ]
    graph = topology.graph
    switches = {n for n, kind in graph.nodes(data="kind") if kind in FABRIC_KINDS}
    edges = graph.edges
    # switch-to-switch links only: the NICs' own rates are the injection bandwidth's
    routes = [[e for e in topology.path(a, b) if set(e) <= switches] for a, b in flows]
    load: dict[tuple[str, str], int] = {}
    for route in routes:
        for edge in route:
            load[edge] = load.get(edge, 0) + 1
    return min(
        (edges[e]["effective_bandwidth_bytes_per_s"] / load[e] for route in routes for e in route),
        default=math.inf,
    )


def _has_nvswitch(topology: Topology, rank: int) -> bool:
    graph = topology.graph
    return any(graph.nodes[v]["kind"] == "nvswitch" for v in graph.successors(topology.gpus[rank]))


def _network_fields(topology: Topology, multi_node: bool) -> dict[str, Any]:
    """Placement fields read off the server spec and the fabric (NIC count and rate, CPU
    vendor, SHARP, the transport's latencies and tuner)."""
    fields: dict[str, Any] = {}
    node = topology.node
    if node is not None:
        fields["nics_per_node"] = node.nics_per_node
        if node.nic is not None:
            nic = LINKS[node.nic].nominal_bandwidth_bytes_per_s
            fields["nic_line_rate_bytes_per_s"] = nic
            pcie = LINKS[node.pcie].effective_bandwidth_bytes_per_s if node.pcie else nic
            fields["nic_path_bytes_per_s"] = min(nic, pcie)
        cpu_model = str(getattr(node, "cpu_model", None) or "")
        fields["cpu_amd"] = node.cpu_link == "xgmi" or cpu_model.startswith("epyc")
        # Grace Blackwell superchips (GB200, GB300) host their GPUs on Arm
        fields["cpu_arm"] = node.gpu.startswith("gb") or cpu_model.startswith("grace")
    if multi_node and topology.fabric is not None:
        fabric = topology.fabric.spec
        fields.update(
            sharp=topology.sharp_capable(), plugin_latency_s=fabric.plugin_latency_s,
            net_step_latency_s=fabric.step_latency_s,
            net_simple_extra_s=fabric.simple_extra_latency_s, tuner=fabric.tuner,
            net_message_gap_s=fabric.message_gap_s, net_channels=fabric.channels,
            net_protocols=fabric.protocols, net_algorithms=fabric.algorithms,
        )  # fmt: skip
    return fields


def gpu_arch(spec: GPUSpec) -> str:
    """The GPU's family where NCCL's per-generation tables know it, else ``""``."""
    return spec.family if spec.family in LL_MAX_GBPS else ""


def _path_bw(topology: Topology, path: Path) -> float:
    return topology.path_bandwidth_bytes_per_s(path, effective=True)


@functools.lru_cache(maxsize=4096)
def choose(
    op: str, layout: GroupPlacement, size_bytes: float, algo: str = "auto"
) -> tuple[str, str | None]:
    """(algorithm, protocol) that runs: NCCL's tuner pick (or the fabric's tuner plugin's) among
    the algorithms this layout supports, or the best protocol of a forced ``algo``.

    The protocol is None where NCCL's model does not apply (gloo, all_to_all, send_recv,
    ``hierarchical``, a forced algorithm its graphs give no channels); the time model then
    takes the algorithm's fastest protocol.
    """
    if algo != "auto":
        check_algorithm(op, algo, layout)
        if algo not in NCCL_ALGORITHMS or op not in MODELLED_OPS:
            return algo, None
        usable = [algo]
    else:
        usable = [a for a in available_algorithms(op, layout) if a in AUTO_ALGORITHMS]
        if layout.net_algorithms and layout.num_nodes > 1:  # NCCL_ALGO across the fabric
            usable = [a for a in usable if a in layout.net_algorithms or a not in NCCL_ALGORITHMS]
        if layout.backend == "gloo" or op not in MODELLED_OPS:
            if not usable:
                raise ValueError(f"no algorithm can run {op} on this group")
            return usable[0], None
    if layout.tuner == "aws-ofi-p5":
        plugin = region_pick(
            op, num_ranks=layout.num_ranks, num_nodes=layout.num_nodes, size_bytes=size_bytes,
            allowed=usable,
        )  # fmt: skip
        if plugin is not None:
            return plugin
    chosen = pick(op, layout.hardware(), size_bytes, allowed=usable)
    if chosen is not None:
        return chosen
    if algo != "auto":  # NCCL's model has no channels for it here: the fastest protocol runs
        return algo, None
    raise ValueError(f"no algorithm can run {op} on this group")


def choose_algorithm(op: str, layout: GroupPlacement, size_bytes: float) -> str:
    """The algorithm ``choose`` picks."""
    return choose(op, layout, size_bytes)[0]


MAX_DIRECT_FLOWS = 1_000_000
"""Most pairwise flows one direct collective may have in the flow model (about 1,000 ranks):
beyond that the flows alone take minutes and gigabytes; the analytical model is O(1)."""


def decompose(
    op: str, algo: str, topology: Topology, ranks: Sequence[int], size_bytes: float,
    *, root: int = 0, layout: GroupPlacement | None = None,
) -> list[FlowGroup]:  # fmt: skip
    """The flow groups of ``op`` by ``algo`` on ``ranks`` (see the module docstring)."""
    layout = layout or placement_of(topology, ranks)
    check_algorithm(op, algo, layout)
    if len(ranks) == 1 or size_bytes == 0:
        return []
    nodes = group_nodes(topology, ranks)
    if algo == "gloo":
        return _gloo_groups(op, topology, ranks, size_bytes, root)
    if algo == "ring":
        return _ring_groups(op, topology, ranks, nodes, size_bytes, root)
    if algo == "nvls" and len(nodes) == 1:
        return nvls_groups(op, topology, ranks, size_bytes)
    if algo != "direct":
        return intra_groups(op, algo, topology, nodes, size_bytes, layout) + inter_groups(
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
