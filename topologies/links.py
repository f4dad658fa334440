"""Adding links to a cluster graph: the one place an edge's attributes are written.

Below ``nodes``, ``fabrics`` and ``topology``, which all build graphs with it.

    add_link(graph, "gpu0", "nvswitch", LINKS["nvlink4"], multiplicity=18)
"""

from __future__ import annotations

import networkx as nx

from topologies.hardware import LinkSpec


def add_link(graph: nx.DiGraph, u: str, v: str, link: LinkSpec, *, multiplicity: int = 1) -> None:
    """Join ``u`` and ``v`` by a full-duplex ``link`` (two directed edges).

    ``multiplicity`` parallel cables are merged into one edge of that many times the bandwidth.
    """
    attrs = {
        "bandwidth_bytes_per_s": link.nominal_bandwidth_bytes_per_s * multiplicity,
        "effective_bandwidth_bytes_per_s": link.effective_bandwidth_bytes_per_s * multiplicity,
        "latency_s": link.latency_s,
        "kind": link.kind,
        "link": link.name,
    }
    graph.add_edge(u, v, **attrs)
    graph.add_edge(v, u, **attrs)
