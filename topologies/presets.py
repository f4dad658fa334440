"""Clusters from presets: N servers of one type on a fabric, built into a ``Topology``.

Server presets: ``dgx-h100``, ``dgx-a100``, ``hgx-h200``, ``dgx-b200``, ``gb200-nvl72`` (one
rack), ``pcie-h100``, ``localhost`` and the cloud servers ``p5-h100`` (AWS), ``a3-mega-h100``
(GCP), ``nd-h100-v5`` (Azure); fabric presets:
``ib-ndr``, ``ib-hdr``, ``roce-400g``, ``ib-ndr-sharp`` (SHARP switches, CollNet off as NCCL
defaults), ``ib-ndr-sharp-collnet`` (in-network reduction), ``efa-p5``,
``gcp-a3-mega``, ``azure-ndr``. Any server type goes on any fabric, with a server count and an
oversubscription ratio. One server needs no fabric; several without one use the server preset's
``default_fabric``.

    >>> build_cluster("dgx-h100", num_nodes=128, fabric="ib-ndr").num_gpus
    1024
"""

from __future__ import annotations

import functools

import networkx as nx

from topologies.fabrics import FABRIC_PRESETS, FabricLayout, FabricSpec, fat_tree_graph
from topologies.hardware import lookup
from topologies.nccl_release import check_nccl_version
from topologies.nodes import MAX_GPUS_PER_NODE, NODE_PRESETS, NodeSpec, server_graph, with_gpus
from topologies.topology import Topology

__all__ = [
    "FABRIC_PRESETS",
    "MAX_GPUS_PER_NODE",
    "NODE_PRESETS",
    "build_cluster",
    "cluster_topology",
]


MAX_GPUS = 131_072
"""Largest cluster built (2x the largest published training clusters' 65k-100k GPUs; the graph
of 16,384 GPUs builds in about a second)."""

MAX_OVERSUBSCRIPTION = 1024.0
"""Largest leaf oversubscription (one up-link for 1,024 down-links; real fabrics use 1-4)."""


def build_cluster(
    node: str,
    num_nodes: int = 1,
    fabric: str | None = None,
    oversubscription: float = 1.0,
    gpus_per_node: int | None = None,
    nccl_version: str = "",
) -> Topology:
    """``num_nodes`` servers of preset ``node`` on preset ``fabric``.

    ``gpus_per_node`` overrides the preset's GPU count (``localhost`` with N processes);
    ``nccl_version`` is the NCCL release its jobs run (empty: the model's own).

    >>> build_cluster("localhost", gpus_per_node=4).num_gpus
    4
    """
    spec = lookup(NODE_PRESETS, node, "node preset")
    fabric_spec = None if fabric is None else lookup(FABRIC_PRESETS, fabric, "fabric preset")
    if gpus_per_node is not None:
        if not isinstance(gpus_per_node, int) or not 1 <= gpus_per_node <= MAX_GPUS_PER_NODE:
            raise ValueError(
                f"gpus_per_node={gpus_per_node!r}; must be an integer in 1..{MAX_GPUS_PER_NODE}"
            )
        spec = with_gpus(spec, gpus_per_node)
    return cluster_topology(
        spec, num_nodes, fabric_spec, oversubscription=oversubscription, nccl_version=nccl_version
    )


def _resolve_fabric(node: NodeSpec, num_nodes: int, fabric: FabricSpec | None) -> FabricSpec | None:
    if fabric is not None and node.nics_per_node == 0:
        raise ValueError(f"node {node.name!r} has no NICs to join fabric {fabric.name!r}")
    if num_nodes == 1 or fabric is not None:
        return fabric
    if node.default_fabric is None:
        raise ValueError(
            f"num_nodes={num_nodes} but node {node.name!r} is a single host with no NICs; "
            "use num_nodes=1"
        )
    return lookup(FABRIC_PRESETS, node.default_fabric, f"node {node.name!r} default_fabric")


def cluster_topology(
    node: NodeSpec,
    num_nodes: int = 1,
    fabric: FabricSpec | None = None,
    *,
    oversubscription: float = 1.0,
    nccl_version: str = "",
) -> Topology:
    """``num_nodes`` servers described by ``node`` on ``fabric`` (specs, not preset names),
    running NCCL release ``nccl_version`` (``topologies.nccl_release``; empty: the model's own)."""
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes!r}; must be an integer >= 1")
    number = isinstance(oversubscription, int | float) and not isinstance(oversubscription, bool)
    if not number or not 1.0 <= oversubscription <= MAX_OVERSUBSCRIPTION:
        raise ValueError(
            f"oversubscription={oversubscription!r}; must be a number >= 1 "
            f"(at most {MAX_OVERSUBSCRIPTION:g})"
        )
    if num_nodes * node.num_gpus > MAX_GPUS:
        raise ValueError(
            f"num_nodes={num_nodes:,} of {node.num_gpus} GPUs is {num_nodes * node.num_gpus:,} "
            f"GPUs; clusters of up to {MAX_GPUS:,} GPUs are built"
        )
    release = check_nccl_version(nccl_version)
    fabric = _resolve_fabric(node, num_nodes, fabric)
    return _built(node, num_nodes, fabric, oversubscription, release)


@functools.lru_cache(maxsize=32)
def _built(
    node: NodeSpec,
    num_nodes: int,
    fabric: FabricSpec | None,
    oversubscription: float,
    nccl_version: str,
) -> Topology:
    """The cluster, built once per (checked) arguments: a topology is not changed after it is
    built (a what-if works on a copy), so plans, searches and sweeps share it."""
    template = server_graph(node)
    graph = nx.DiGraph()
    for i in range(num_nodes):
        prefix = f"n{i}/"
        for local, attrs in template.nodes(data=True):
            graph.add_node(prefix + local, **attrs)
            graph.nodes[prefix + local]["node_index"] = i
            if attrs.get("nic") is not None:
                graph.nodes[prefix + local]["nic"] = prefix + attrs["nic"]
        graph.add_edges_from(
            (prefix + u, prefix + v, dict(d)) for u, v, d in template.edges(data=True)
        )
    layout: FabricLayout | None = None
    if fabric is not None:
        endpoints = [
            (f"n{i}/nic{k}", i, k) for i in range(num_nodes) for k in range(node.nics_per_node)
        ]
        fabric_graph, layout = fat_tree_graph(endpoints, fabric, oversubscription=oversubscription)
        graph.add_nodes_from((n, d) for n, d in fabric_graph.nodes(data=True) if n not in graph)
        graph.add_edges_from(fabric_graph.edges(data=True))
    name = node.name if num_nodes == 1 else f"{num_nodes}x {node.name}"
    if fabric is not None:
        name += f" on {fabric.name}"
    return Topology(
        graph, name=name, num_nodes=num_nodes, node=node, fabric=layout, nccl_version=nccl_version
    )
