"""A cluster as a networkx DiGraph, with cached deterministic routing between GPU ranks.

Nodes carry ``kind`` (gpu, nvswitch, pcie_switch, cpu, nic, leaf, spine, core); GPU nodes also
carry ``spec`` (GPUSpec), ``node_index``, ``local_index`` and ``nic`` (their NIC's node id, or
None). Every full-duplex link is two directed edges with ``bandwidth_bytes_per_s`` (nominal, per
direction), ``effective_bandwidth_bytes_per_s``, ``latency_s``, ``kind`` and ``link`` (catalogue
key). Routing: shortest paths by hop count inside a server (networkx), up/down routing through
the fat-tree (up to the lowest common ancestor tier, then down), with equal-cost choices made by
a stable hash of (src, dst, flow_key) so that runs repeat.

    >>> from topologies.presets import build_cluster
    >>> len(build_cluster("dgx-h100").path(0, 1))  # GPU -> NVSwitch -> GPU
    2
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import networkx as nx

from topologies.fabrics import FabricLayout
from topologies.hardware import GPUSpec
from topologies.nodes import NodeSpec

Edge = tuple[str, str]
"""A directed link (from node id, to node id)."""
Path = tuple[Edge, ...]
"""A route: consecutive directed links."""

NODE_KINDS = ("gpu", "nvswitch", "pcie_switch", "cpu", "nic", "leaf", "spine", "core")
"""Values of the ``kind`` node attribute."""
EDGE_KINDS = ("nvlink", "pcie", "network", "cpu_link", "loopback")
"""Values of the ``kind`` edge attribute."""
TIERS = ("nvlink", "network", "pcie")
"""Tiers accepted by ``Topology.injection_bandwidth_bytes_per_s``."""
FABRIC_KINDS = ("leaf", "spine", "core")
"""Node kinds that belong to the network fabric rather than to a server."""


def stable_hash(*parts: object) -> int:
    """A 64-bit hash of ``parts`` that is the same in every process (unlike ``hash()``)."""
    text = "\x1f".join(str(part) for part in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


class Topology:
    """A built cluster: the graph, the GPUs in rank order, and cached routing queries."""

    def __init__(
        self,
        graph: nx.DiGraph,
        *,
        name: str,
        num_nodes: int,
        node: NodeSpec | None = None,
        fabric: FabricLayout | None = None,
        nccl_version: str = "",
    ) -> None:
        self.graph = graph
        self.name = name
        self.num_nodes = num_nodes
        self.node = node
        self.fabric = fabric
        self.nccl_version = nccl_version
        """The NCCL release its jobs run (``major.minor.patch``; empty: the release the network
        model's tables were read from): which algorithm and protocol NCCL picks."""
        self.uniform = node is not None
        """Whether every server is built alike (a what-if that degrades one NIC clears it):
        queries may then look at one server for all."""
        self.intact: Topology | None = None
        """The cluster before a what-if changed its fabric's switch links (None: unchanged):
        the analytical model compares a group's routes on both (``fabric_factor``)."""
        gpus = [n for n, kind in graph.nodes(data="kind") if kind == "gpu"]
        gpus.sort(key=lambda n: (graph.nodes[n]["node_index"], graph.nodes[n]["local_index"]))
        self.gpus: tuple[str, ...] = tuple(gpus)
        self.num_gpus = len(gpus)
        self.gpus_per_node = self.num_gpus // max(num_nodes, 1)
        self._paths: dict[tuple[int, int, int], Path] = {}
        self._intra: dict[tuple[str, str], list[list[str]]] = {}
        self._members: dict[int, list[str]] | None = None
        self._routing: _FabricRouting | None = None
        self._injection: dict[tuple[int, str, bool], float] = {}
        self._sharers: dict[str, int] | None = None
        self._bisection: dict[bool, float] = {}
        self._nvls: bool | None = None

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, num_nodes={self.num_nodes}, num_gpus={self.num_gpus})"

    # --- ranks -------------------------------------------------------------------------------
    def _gpu(self, rank: int) -> str:
        if not 0 <= rank < self.num_gpus:
            raise ValueError(f"rank {rank} out of range for {self.num_gpus} GPUs in {self.name}")
        return self.gpus[rank]

    def gpu_spec(self, rank: int) -> GPUSpec:
        """The GPU model of ``rank``."""
        spec: GPUSpec = self.graph.nodes[self._gpu(rank)]["spec"]
        return spec

    def node_index(self, rank: int) -> int:
        """Which server ``rank`` sits in (0-based)."""
        return int(self.graph.nodes[self._gpu(rank)]["node_index"])

    def local_index(self, rank: int) -> int:
        """Position of ``rank`` inside its server (0-based)."""
        return int(self.graph.nodes[self._gpu(rank)]["local_index"])

    def nodes_of_kind(self, kind: str) -> list[str]:
        """Node ids whose ``kind`` attribute is ``kind``, in insertion order."""
        return [n for n, k in self.graph.nodes(data="kind") if k == kind]

    # --- routing -----------------------------------------------------------------------------
    def path(self, src_rank: int, dst_rank: int, flow_key: int = 0) -> Path:
        """Directed links from ``src_rank``'s GPU to ``dst_rank``'s (empty when equal); cached."""
        key = (src_rank, dst_rank, flow_key)
        cached = self._paths.get(key)
        if cached is None:
            cached = self._route(self._gpu(src_rank), self._gpu(dst_rank), flow_key)
            self._paths[key] = cached
        return cached

    def _route(self, src: str, dst: str, flow_key: int) -> Path:
        if src == dst:
            return ()
        h = stable_hash(src, dst, flow_key)
        nodes = self.graph.nodes
        if nodes[src]["node_index"] == nodes[dst]["node_index"]:
            return _edges(self._intra_path(src, dst, h))
        src_nic, dst_nic = nodes[src].get("nic"), nodes[dst].get("nic")
        if src_nic is None or dst_nic is None:
            raise ValueError(f"{src} and {dst} are in different servers but one has no NIC")
        hops = self._intra_path(src, src_nic, h)
        hops += self._fabric().route(src_nic, dst_nic, h >> 16)[1:]
        hops += self._intra_path(dst_nic, dst, h >> 32)[1:]
        return _edges(hops)

    def _intra_path(self, src: str, dst: str, h: int) -> list[str]:
        """A shortest (by hops, then widest) path inside a server; ``h`` picks among equals.

        Servers built from one ``NodeSpec`` share their routes: they are cached by local name.
        """
        prefix = src[: src.index("/") + 1] if self.node is not None and "/" in src else ""
        key = (src[len(prefix) :], dst[len(prefix) :])
        choices = self._intra.get(key)
        if choices is None:
            choices = [[n[len(prefix) :] for n in p] for p in self._widest_shortest(src, dst)]
            self._intra[key] = choices
        return [prefix + n for n in choices[h % len(choices)]]

    def _widest_shortest(self, src: str, dst: str) -> list[list[str]]:
        if self._members is None:
            self._members = {}
            for n, index in self.graph.nodes(data="node_index"):
                if index is not None:
                    self._members.setdefault(index, []).append(n)
        server = self.graph.subgraph(self._members[self.graph.nodes[src]["node_index"]])
        try:
            shortest = sorted(nx.all_shortest_paths(server, src, dst))
        except nx.NetworkXNoPath:
            raise ValueError(f"no path from {src} to {dst} inside their server") from None
        # Among equally short paths, the fastest (NVLink over a shared PCIe switch).
        widths = [self.path_bandwidth_bytes_per_s(_edges(p)) for p in shortest]
        return [p for p, w in zip(shortest, widths, strict=True) if w == max(widths)]

    def _fabric(self) -> _FabricRouting:
        if self._routing is None:
            self._routing = _FabricRouting(self.graph)
        return self._routing

    def path_bandwidth_bytes_per_s(self, path: Path, *, effective: bool = False) -> float:
        """Bottleneck bandwidth of ``path`` (per direction); ``inf`` for the empty path."""
        attr = "effective_bandwidth_bytes_per_s" if effective else "bandwidth_bytes_per_s"
        edges = self.graph.edges
        return min((edges[e][attr] for e in path), default=math.inf)

    def path_latency_s(self, path: Path) -> float:
        """Sum of the per-hop latencies of ``path``."""
        edges = self.graph.edges
        return math.fsum(edges[e]["latency_s"] for e in path)

    # --- capacities --------------------------------------------------------------------------
    def injection_bandwidth_bytes_per_s(
        self, rank: int, tier: str, *, effective: bool = False
    ) -> float:
        """Per-direction bandwidth ``rank`` can push into ``tier`` (0.0 when it has none).

        ``nvlink``/``pcie``: the GPU's own links of that kind. ``network``: its NIC's fabric
        links shared among the GPUs using that NIC, capped by the PCIe path to the NIC.
        """
        if tier not in TIERS:
            raise ValueError(f"unknown tier {tier!r}; valid: {', '.join(TIERS)}")
        key = (rank, tier, effective)
        if key not in self._injection:
            self._injection[key] = self._injection_uncached(rank, tier, effective)
        return self._injection[key]

    def _injection_uncached(self, rank: int, tier: str, effective: bool) -> float:
        gpu = self._gpu(rank)
        attr = "effective_bandwidth_bytes_per_s" if effective else "bandwidth_bytes_per_s"
        if tier != "network":
            out = self.graph.out_edges(gpu, data=True)
            return math.fsum(d[attr] for _, _, d in out if d["kind"] == tier)
        nic = self.graph.nodes[gpu].get("nic")
        if nic is None:
            return 0.0
        uplinks = self.graph.out_edges(nic, data=True)
        nic_bw = math.fsum(d[attr] for _, _, d in uplinks if d["kind"] == "network")
        if self._sharers is None:
            self._sharers = {}
            for g in self.gpus:
                used = self.graph.nodes[g].get("nic")
                self._sharers[used] = self._sharers.get(used, 0) + 1
        sharers = self._sharers[nic]
        to_nic = _edges(self._intra_path(gpu, nic, 0))
        return min(nic_bw / sharers, self.path_bandwidth_bytes_per_s(to_nic, effective=effective))

    def bisection_bandwidth_bytes_per_s(self, *, effective: bool = False) -> float:
        """Capacity across a cut of the GPUs into two equal halves (per direction).

        One server: max-flow between its first and second half of GPUs. Several servers: the
        narrowest of half the servers' NIC capacity and the fabric's tier cuts.
        """
        cached = self._bisection.get(effective)
        if cached is None:
            cached = self._bisection[effective] = self._bisection_bytes_per_s(effective)
        return cached

    def _bisection_bytes_per_s(self, effective: bool) -> float:
        if self.num_gpus < 2:
            return 0.0
        attr = "effective_bandwidth_bytes_per_s" if effective else "bandwidth_bytes_per_s"
        if self.num_nodes == 1:
            return _half_cut_max_flow(self.graph, self.gpus, attr)
        node0 = [n for n, i in self.graph.nodes(data="node_index") if i == 0]
        per_node = math.fsum(
            d[attr]
            for nic in node0
            if self.graph.nodes[nic]["kind"] == "nic"
            for _, _, d in self.graph.out_edges(nic, data=True)
            if d["kind"] == "network"
        )
        cuts = [self.num_nodes / 2 * per_node]
        if self.fabric is not None:
            cuts.append(self.fabric.bisection_bytes_per_s(effective=effective))
        return min(cuts)

    def sharp_capable(self) -> bool:
        """Whether NCCL reduces in this fabric's switches: SHARP switches (``FabricSpec.sharp``)
        with CollNet enabled (``FabricSpec.collnet``)."""
        return self.fabric is not None and self.fabric.spec.sharp and self.fabric.spec.collnet

    def nvls_capable(self) -> bool:
        """Whether the servers' NVSwitches can reduce in-switch (NVLink SHARP)."""
        if self._nvls is None:
            self._nvls = any(
                d.get("spec") is not None and d["spec"].supports_nvls
                for _, d in self.graph.nodes(data=True)
                if d["kind"] == "nvswitch"
            )
        return self._nvls


def _edges(hops: Sequence[str]) -> Path:
    return tuple(itertools.pairwise(hops))


def _half_cut_max_flow(graph: nx.DiGraph, gpus: Sequence[str], attr: str) -> float:
    """Max flow from the first half of ``gpus`` to the second half (one server: small graph)."""
    half = len(gpus) // 2
    flow_graph = nx.DiGraph()
    for u, v, d in graph.edges(data=True):
        flow_graph.add_edge(u, v, capacity=d[attr])
    for gpu in gpus[:half]:
        flow_graph.add_edge("_source", gpu)  # no capacity attribute: unbounded
    for gpu in gpus[half : 2 * half]:
        flow_graph.add_edge(gpu, "_sink")
    return float(nx.maximum_flow_value(flow_graph, "_source", "_sink"))


class _FabricRouting:
    """Up/down routing tables of a tree fabric, read once from the graph. A link a what-if took
    down (edge attribute ``down``) stays in the up tables, so the hash picks as on the intact
    fabric, and a flow that would take it is routed through another up-link that still leads to
    its destination."""

    def __init__(self, graph: nx.DiGraph) -> None:
        self.up: dict[str, tuple[str, ...]] = {}
        self.dead_up: dict[str, frozenset[str]] = {}
        """Up-links a what-if took down, per switch (absent: none)."""
        self.down: dict[str, dict[Any, str]] = {}
        self.tier: dict[str, int] = {}
        self.pod: dict[str, Any] = {}
        self.cut = False
        """Whether a link is down: only then are routes checked against ``reach``."""
        for n, d in graph.nodes(data=True):
            if d["kind"] in FABRIC_KINDS:
                self.tier[n] = d["tier"]
                self.pod[n] = d.get("pod")
        for n in self.tier:
            ups: list[str] = []
            dead: list[str] = []
            downs: dict[Any, str] = {}
            for m, data in graph.succ[n].items():
                if m not in self.tier:
                    continue
                if data.get("down"):
                    dead.append(m)
                elif self.tier[m] < self.tier[n]:
                    downs[m if self.tier[m] == 1 else self.pod[m]] = m
                if self.tier[m] > self.tier[n]:
                    ups.append(m)
            self.up[n] = tuple(sorted(ups))
            self.down[n] = downs
            if dead:
                self.cut = True
                self.dead_up[n] = frozenset(dead)
        for nic in (n for n, k in graph.nodes(data="kind") if k == "nic"):
            self.up[nic] = tuple(sorted(m for m in graph.successors(nic) if m in self.tier))
        # the leaves each switch reaches going down its live links: built only when a link is
        # down (on an intact tree a switch reaches the leaves its pod holds, ``_covers``)
        self.reach: dict[str, frozenset[str]] = {}
        if self.cut:
            for n in sorted(self.tier, key=self.tier.__getitem__):
                self.reach[n] = (
                    frozenset({n})
                    if self.tier[n] == 1
                    else frozenset().union(*(self.reach[m] for m in self.down[n].values()))
                )

    def _covers(self, switch: str, leaf: str) -> bool:
        """Whether ``switch`` reaches ``leaf`` going down."""
        if switch not in self.tier:
            return False
        if self.cut:
            return leaf in self.reach[switch]
        if self.tier[switch] == 1:
            return switch == leaf
        return self.pod[switch] is None or self.pod[switch] == self.pod[leaf]

    def _viable(self, switch: str, leaf: str) -> bool:
        """Whether ``leaf`` is reachable from ``switch`` going up, then down, on live links."""
        return self._covers(switch, leaf) or any(
            self._viable(u, leaf) for u in self._live_up(switch)
        )

    def _live_up(self, switch: str) -> list[str]:
        dead = self.dead_up.get(switch, frozenset())
        return [u for u in self.up.get(switch, ()) if u not in dead]

    def route(self, src_nic: str, dst_nic: str, h: int) -> list[str]:
        """Hops from ``src_nic`` to ``dst_nic``: up to a common ancestor, then down."""
        dst_leaves = self.up.get(dst_nic, ())
        if not self.up.get(src_nic) or not dst_leaves:
            raise ValueError(f"{src_nic} or {dst_nic} is not attached to a network fabric")
        dst_leaf = dst_leaves[h % len(dst_leaves)]
        h //= len(dst_leaves)
        hops = [src_nic]
        while not self._covers(hops[-1], dst_leaf):
            here = hops[-1]
            ups = self.up[here]
            pick = ups[h % len(ups)] if ups else None
            h //= max(len(ups), 1)
            if pick is None or (
                self.cut
                and (pick in self.dead_up.get(here, ()) or not self._viable(pick, dst_leaf))
            ):
                # a link what-if took the hashed way out: another up-link that still leads there
                alive = [u for u in self._live_up(here) if self._viable(u, dst_leaf)]
                if not alive:
                    raise ValueError(
                        f"no route from {src_nic} to {dst_nic}: the fabric's links left no path "
                        "(a link what-if cut them)"
                    )
                pick = alive[h % len(alive)]
            hops.append(pick)
        while hops[-1] != dst_leaf:
            children = self.down[hops[-1]]
            child = children.get(dst_leaf) or children.get(self.pod[dst_leaf])
            if child is None or not self._covers(child, dst_leaf):
                child = next(c for c in children.values() if self._covers(c, dst_leaf))
            hops.append(child)
        hops.append(dst_nic)
        return hops


def count_by_kind(graph: nx.DiGraph, kinds: Iterable[str] = NODE_KINDS) -> dict[str, int]:
    """How many nodes of each kind ``graph`` has (kinds with none are reported as 0)."""
    counts = dict.fromkeys(kinds, 0)
    for _, kind in graph.nodes(data="kind"):
        counts[kind] = counts.get(kind, 0) + 1
    return counts
