"""Flow groups of NVLS and of the two-level algorithms, in-network reduction included.

- NVLS: every GPU's links to its NVSwitch carry the ``nvls_bytes`` up and down, at the op's
  NVLS efficiency (``sim/network/hierarchy.py``).
- intra-node phase of a two-level algorithm: NVLS (``nvls``, ``nvlstree``, ``hierarchical`` on
  NVLS nodes) or a ring per node carrying the op's ring wire bytes over g ranks (NCCL's Tree
  chain, CollNet's intra-node reduce-scatter/all-gather).
- inter-node phase per rail (local GPU index): NCCL's double binary tree (``tree``,
  ``nvlstree``), a ring (``hierarchical``), or the fabric's reduction tree (``collnet_*``,
  ``nvls``): every link from the rail's GPUs up to the switch where their routes meet carries
  the node's reduced share once up, and the result once down.

    groups = nvls_groups("all_reduce", topology, range(8), 1 << 30)
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.network.hierarchy import (
    IN_NETWORK,
    NVLS_EFFICIENCY,
    double_tree_edges,
    nvls_bytes,
    ring_wire_bytes,
    sharp_bytes,
    uses_nvls_inside,
)
from sim.network.terms import FlowGroup, GroupPlacement
from topologies.topology import FABRIC_KINDS, Edge, Path, Topology


def switch_edges(topology: Topology, rank: int) -> tuple[list[Path], list[Path]]:
    """One-edge paths from ``rank``'s GPU up to each of its NVSwitches, and back down."""
    gpu = topology.gpus[rank]
    graph = topology.graph
    switches = sorted(v for v in graph.successors(gpu) if graph.nodes[v]["kind"] == "nvswitch")
    if not switches:
        raise ValueError(f"rank {rank} has no NVSwitch; 'nvls' needs one")
    return [((gpu, s),) for s in switches], [((s, gpu),) for s in switches]


def nvls_groups(
    op: str, topology: Topology, ranks: Sequence[int], size_bytes: float
) -> list[FlowGroup]:
    """Every GPU's NVSwitch links carrying the NVLS bytes of ``op`` over ``ranks``."""
    up_bytes, down_bytes = nvls_bytes(op, size_bytes, len(ranks))
    ups: list[Path] = []
    downs: list[Path] = []
    for rank in ranks:
        up, down = switch_edges(topology, rank)
        ups.extend(up)
        downs.extend(down)
    # Bytes spread evenly over a GPU's switch chips, moved at the switch's NVLS efficiency.
    efficiency = NVLS_EFFICIENCY.get(op, NVLS_EFFICIENCY["all_reduce"])
    per_switch = len(ups) // len(ranks) * efficiency
    return [
        FlowGroup(paths=tuple(ups), size_bytes=up_bytes / per_switch),
        FlowGroup(paths=tuple(downs), size_bytes=down_bytes / per_switch),
    ]


def intra_groups(
    op: str, algo: str, topology: Topology, nodes: list[list[int]], size_bytes: float,
    layout: GroupPlacement,
) -> list[FlowGroup]:  # fmt: skip
    """The intra-node phase of a two-level algorithm, on every node."""
    if layout.ranks_per_node == 1:
        return []
    if uses_nvls_inside(algo, layout):
        groups = []
        for members in nodes:
            groups.extend(nvls_groups(op, topology, members, size_bytes))
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


def inter_groups(
    op: str, algo: str, topology: Topology, nodes: list[list[int]], size_bytes: float
) -> list[FlowGroup]:
    """The inter-node phase of a two-level algorithm, one set of flows per rail."""
    g = len(nodes[0])
    if any(len(members) != g for members in nodes):
        raise ValueError(f"{algo} needs the same number of ranks per node, got {nodes}")
    groups = []
    for rail in range(g):
        members = [node[rail] for node in nodes]
        if algo in IN_NETWORK:
            up, down = sharp_bytes(op, size_bytes, len(nodes))
            groups.extend(reduction_tree_groups(topology, members, rail, up / g, down / g))
        elif algo in ("tree", "nvlstree"):
            for tree in double_tree_edges(len(members)):
                paths = []
                for parent, child in tree:
                    paths.append(topology.path(members[child], members[parent], rail))
                    paths.append(topology.path(members[parent], members[child], rail))
                groups.append(FlowGroup(paths=tuple(paths), size_bytes=size_bytes / g / 2))
        else:
            hops = zip(members, members[1:] + members[:1], strict=True)
            groups.append(
                FlowGroup(
                    paths=tuple(topology.path(a, b, rail) for a, b in hops),
                    size_bytes=ring_wire_bytes(op, size_bytes, len(members)) / g,
                )
            )
    return groups


def reduction_tree_groups(
    topology: Topology, members: Sequence[int], rail: int, up_bytes: float, down_bytes: float
) -> list[FlowGroup]:
    """The fabric reducing one rail: each link from a member up to the switch where the routes
    meet carries ``up_bytes`` once (partial sums merge in the switches), and its reverse
    carries ``down_bytes`` once (the result is multicast back)."""
    root = members[0]
    ups: dict[Edge, None] = {}
    peers = [m for m in members if m != root]
    for member in peers:
        ups.update(dict.fromkeys(_up_to_top(topology, topology.path(member, root, rail))))
    ups.update(dict.fromkeys(_up_to_top(topology, topology.path(root, peers[0], rail))))
    downs = [(v, u) for u, v in ups]
    return [
        FlowGroup(paths=tuple((edge,) for edge in ups), size_bytes=up_bytes),
        FlowGroup(paths=tuple((edge,) for edge in downs), size_bytes=down_bytes),
    ]


def _up_to_top(topology: Topology, path: Path) -> Path:
    """The prefix of ``path`` up to its highest fabric switch (where it turns down)."""
    nodes = topology.graph.nodes
    tiers = [nodes[v].get("tier", 0) if nodes[v]["kind"] in FABRIC_KINDS else -1 for _, v in path]
    top = max(tiers)
    if top < 0:
        raise ValueError("in-network reduction needs ranks on different nodes behind a switch")
    return path[: tiers.index(top) + 1]
