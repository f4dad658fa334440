"""Closed-form alpha-beta cost of each collective algorithm on a topology: O(1) per call.

A collective's time is NCCL's protocol-aware alpha-beta model: for every protocol the algorithm
can use (LL, LL128, Simple; ``sim/network/protocols.py``) a latency plus a bandwidth term, and the
fastest protocol wins, as NCCL's tuner picks (reference §3.4-3.7):

    latency_p = (proto_base_p + intra_steps * proto_intra_p + inter_steps * proto_inter_p)
                * plateau_p + base + intra_steps * intra_step + inter_steps * inter_step + hops
    bandwidth_p = max(bandwidth_time / factor_p, bus_bytes / cap_p) * (1 + chunk_p / size)
                  / efficiency(size)
    efficiency(size) = efficiency_max / (1 + (half_size / size) ** shape)
    time = min_p (latency_p + bandwidth_p)

The ``chunk_p / size`` term is pipeline start-up: the first chunk (a protocol buffer slot,
buffer / NCCL_STEPS) crosses before the pipeline is full, so small messages ramp up.
``bandwidth_time`` is the busiest link's bytes over its bandwidth at 100% efficiency, read off
the topology for the group's layout (``Layout``): the per-GPU intra-node bandwidth (NVLink, or
the bottleneck of the intra-node hops), the per-GPU network bandwidth and the bisection. The
flow model (``sim/network/algorithms.py``) moves the same bytes with the same latencies over the
graph, so on an uncongested topology both give the same time.

    time_s = cost_terms("all_reduce", "ring", layout, 1 << 30).time_s(params, 1 << 30)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from comm_bench.collectives import get
from sim.network.protocols import PROTOCOL_MODES, Protocol, protocols_for

OP_ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "nvls", "hierarchical", "gloo"),
    "all_gather": ("ring", "nvls", "hierarchical", "gloo"),
    "reduce_scatter": ("ring", "nvls", "hierarchical", "gloo"),
    "all_to_all": ("direct", "gloo"),
    "broadcast": ("ring", "gloo"),
    "reduce": ("ring", "gloo"),
    "send_recv": ("direct", "gloo"),
}
"""Algorithms each op can run with (``direct``: every transfer at once, point to point;
``gloo``: gloo's CPU algorithms, see ``_gloo``)."""

ALGORITHMS = ("ring", "tree", "nvls", "hierarchical", "direct", "gloo")
"""Every algorithm name accepted by ``--algo`` (besides ``auto``)."""

NVLS_EFFICIENCY = 0.85
"""Rate of NVLink SHARP traffic relative to the NVLink rate (NCCL's nvlsEfficiency, Hopper)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommParams:
    """Latency and efficiency parameters of one (op, algorithm, scope); what calibration fits."""

    base_latency_s: float
    """Fixed cost of one call (launch, setup; NCCL's baseLat)."""
    intra_step_latency_s: float
    """Software latency per intra-node algorithm step, on top of the hop latency."""
    inter_step_latency_s: float
    """Software latency per inter-node algorithm step, on top of the hop latency."""
    efficiency_max: float
    """Fraction of link bandwidth reached by large messages."""
    half_size_bytes: float
    """Size at which the efficiency is half of ``efficiency_max`` (when ``shape`` is 1)."""
    shape: float = 1.0
    """Steepness of the efficiency ramp over size."""
    protocol_latency_scale: float = 1.0
    """Multiplier on NCCL's protocol latency tables (1: NCCL's constants; fitted per machine)."""
    protocol: str = "auto"
    """``auto`` (fastest of the algorithm's NCCL protocols), ``ll``/``ll128``/``simple``
    (forced) or ``none`` (plain alpha-beta: no protocol latencies, caps or start-up)."""

    def __post_init__(self) -> None:
        """ValueError on an unknown protocol mode."""
        if self.protocol not in PROTOCOL_MODES:
            raise ValueError(
                f"unknown protocol {self.protocol!r}; valid: {', '.join(PROTOCOL_MODES)}"
            )

    def efficiency(self, size_bytes: float) -> float:
        """Fraction of link bandwidth reached at ``size_bytes``."""
        if size_bytes <= 0:
            return self.efficiency_max
        return self.efficiency_max / (1.0 + (self.half_size_bytes / size_bytes) ** self.shape)


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Where a group's ranks sit and the bandwidths and latencies the closed forms read."""

    num_ranks: int
    """Ranks in the group."""
    num_nodes: int
    """Hosts the ranks span."""
    ranks_per_node: int
    """Ranks per host (the largest count when uneven)."""
    intra_bandwidth_bytes_per_s: float
    """Per-GPU intra-node bandwidth per direction (bottleneck over the group's ranks)."""
    net_bandwidth_bytes_per_s: float
    """Per-GPU network bandwidth per direction (bottleneck over the group's ranks)."""
    intra_hop_latency_s: float
    """Path latency between two ranks of one node."""
    inter_hop_latency_s: float
    """Path latency between two ranks on different nodes."""
    bisection_bandwidth_bytes_per_s: float
    """Fabric bisection bandwidth per direction (inf for one node)."""
    nvls: bool
    """Whether the nodes' NVSwitch can reduce in the switch (NVLink SHARP)."""
    backend: str = "nccl"
    """``nccl`` (GPUs) or ``gloo`` (CPU processes, the ``localhost`` topology)."""
    gpu_arch: str = ""
    """GPU generation (``hopper``, ``ampere``, ...) for NCCL's per-generation caps."""
    intra_hw: str = "nvlink"
    """Intra-node link type in NCCL's latency tables: ``nvlink`` or ``pci``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CostTerms:
    """The pieces of one collective's time, before parameters are applied."""

    intra_steps: int
    """Algorithm steps whose hops stay inside a node."""
    inter_steps: int
    """Algorithm steps that cross the network."""
    hop_latency_s: float
    """Sum of the path latencies of the steps."""
    bandwidth_time_s: float
    """Busiest link's bytes / bandwidth at 100% efficiency."""
    bus_bytes: float = 0.0
    """The op's bus bytes (what busbw counts), for the protocols' busbw caps."""
    protocols: tuple[Protocol, ...] = ()
    """Protocols the algorithm can use here (empty: plain alpha-beta)."""

    def candidates(self, params: CommParams) -> tuple[Protocol, ...]:
        """The protocols ``params.protocol`` allows (``()`` means plain alpha-beta)."""
        mode = params.protocol
        if mode == "auto":
            return self.protocols
        if mode == "none" or not self.protocols:
            return ()
        chosen = tuple(p for p in self.protocols if p.name == mode)
        if not chosen:
            names = ", ".join(p.name for p in self.protocols)
            raise ValueError(f"protocol {mode!r} is not available here; valid: auto, none, {names}")
        return chosen

    def split_s(self, params: CommParams, size_bytes: float) -> tuple[str, float, float]:
        """(protocol, latency seconds, bandwidth seconds) of the fastest allowed protocol."""
        base = (
            params.base_latency_s
            + self.intra_steps * params.intra_step_latency_s
            + self.inter_steps * params.inter_step_latency_s
            + self.hop_latency_s
        )
        ramp = 1.0 / params.efficiency(size_bytes) if self.bandwidth_time_s > 0 else 0.0
        protocols = self.candidates(params)
        if not protocols:
            return "none", base, self.bandwidth_time_s * ramp
        best = ("", math.inf, math.inf)
        for proto in protocols:
            own = proto.latency_s(self.intra_steps, self.inter_steps)
            latency = base + own * params.protocol_latency_scale
            bandwidth = proto.bandwidth_s(self.bandwidth_time_s, self.bus_bytes, size_bytes)
            if latency + bandwidth * ramp < best[1] + best[2]:
                best = (proto.name, latency, bandwidth * ramp)
        return best

    def latency_s(self, params: CommParams, size_bytes: float) -> float:
        """Everything but the bandwidth term, for the protocol that runs at ``size_bytes``."""
        return self.split_s(params, size_bytes)[1]

    def time_s(self, params: CommParams, size_bytes: float) -> float:
        """Predicted seconds for ``size_bytes`` under ``params``."""
        _, latency, bandwidth = self.split_s(params, size_bytes)
        return latency + bandwidth


def check_algorithm(op: str, algo: str, layout: Layout) -> None:
    """ValueError unless ``algo`` can run ``op`` on this layout."""
    if algo not in OP_ALGORITHMS[op]:
        raise ValueError(
            f"algorithm {algo!r} does not implement {op}; valid: {', '.join(OP_ALGORITHMS[op])}"
        )
    if algo == "nvls" and (not layout.nvls or layout.num_nodes > 1):
        raise ValueError(
            "algorithm 'nvls' needs one node whose NVSwitch reduces in the switch (NVLink "
            "SHARP, H100/H200 NVSwitch gen3); this topology/group has none"
        )
    if algo in ("tree", "hierarchical") and layout.num_nodes < 2:
        raise ValueError(f"algorithm {algo!r} needs ranks on >= 2 nodes; this group spans 1")
    if (algo == "gloo") != (layout.backend == "gloo"):
        raise ValueError(
            f"algorithm {algo!r} does not run on the {layout.backend} backend of this topology; "
            f"valid: {'gloo' if layout.backend == 'gloo' else 'the NCCL algorithms'}"
        )


def available_algorithms(op: str, layout: Layout) -> tuple[str, ...]:
    """The algorithms of ``op`` this layout supports, in ``OP_ALGORITHMS`` order."""
    usable = []
    for algo in OP_ALGORITHMS[op]:
        try:
            check_algorithm(op, algo, layout)
        except ValueError:
            continue
        usable.append(algo)
    return tuple(usable)


def cost_terms(op: str, algo: str, layout: Layout, size_bytes: float) -> CostTerms:
    """The closed-form cost pieces of ``op`` by ``algo`` on ``layout`` (see module docstring)."""
    check_algorithm(op, algo, layout)
    if layout.num_ranks == 1:
        return CostTerms(intra_steps=0, inter_steps=0, hop_latency_s=0.0, bandwidth_time_s=0.0)
    terms = _bare_terms(op, algo, layout, size_bytes)
    return replace(
        terms,
        bus_bytes=get(op).wire_bytes(size_bytes, layout.num_ranks),
        protocols=protocols_for(op, algo, layout.backend, _protocol_shape(layout)),
    )


def _protocol_shape(layout: Layout) -> tuple[str, str, int]:
    """(GPU generation, intra-node link type, nodes): what NCCL's protocol tables depend on."""
    return layout.gpu_arch, layout.intra_hw, layout.num_nodes


def _bare_terms(op: str, algo: str, layout: Layout, size_bytes: float) -> CostTerms:
    """Steps, hop latencies and bandwidth time of ``op`` by ``algo`` (no protocols yet)."""
    n, nodes = layout.num_ranks, layout.num_nodes
    if algo == "gloo":
        return _gloo(op, layout, size_bytes)
    if algo == "ring":
        return _ring(op, layout, size_bytes)
    if algo == "nvls":
        up, down = nvls_bytes(op, size_bytes, n)
        bw_time = max(up, down) / (layout.intra_bandwidth_bytes_per_s * NVLS_EFFICIENCY)
        return CostTerms(
            intra_steps=1, inter_steps=0, hop_latency_s=layout.intra_hop_latency_s,
            bandwidth_time_s=bw_time,
        )  # fmt: skip
    if algo in ("hierarchical", "tree"):
        return _two_level(op, algo, layout, size_bytes)
    if op == "send_recv":
        hop = layout.intra_hop_latency_s if nodes == 1 else layout.inter_hop_latency_s
        bw = layout.intra_bandwidth_bytes_per_s if nodes == 1 else layout.net_bandwidth_bytes_per_s
        return CostTerms(
            intra_steps=int(nodes == 1), inter_steps=int(nodes > 1), hop_latency_s=hop,
            bandwidth_time_s=size_bytes / bw,
        )  # fmt: skip
    return _direct_all_to_all(layout, size_bytes)


def ring_wire_bytes(op: str, size_bytes: float, n: int) -> float:
    """Bytes every rank sends around a ring: the op's busbw bytes (broadcast/reduce: a chain)."""
    return get(op).wire_bytes(size_bytes, n)


def ring_steps(op: str, n: int) -> int:
    """Algorithm steps of a ring over ``n`` ranks (NCCL: AR 2(n-1), else n-1)."""
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def _ring(op: str, layout: Layout, size_bytes: float) -> CostTerms:
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


def nvls_bytes(op: str, size_bytes: float, n: int) -> tuple[float, float]:
    """(up, down) bytes each GPU moves to/from the NVSwitch under NVLink SHARP.

    A GPU's own shard never crosses its link. reduce_scatter: the switch reads the n-1 shards
    the others own ((n-1)/n S up) and returns the reduced shard (S/n down); all_gather: each
    GPU pushes its shard once (S/n up) and the switch multicasts the others ((n-1)/n S down);
    all_reduce is both: S each way, so algbw ~ the link rate and busbw = 2(n-1)/n x algbw
    (~1.75x the link on 8 GPUs; reference §1.6).
    """
    shard = size_bytes / n
    if op == "reduce_scatter":
        return size_bytes - shard, shard
    if op == "all_gather":
        return shard, size_bytes - shard
    return size_bytes, size_bytes


def _two_level(op: str, algo: str, layout: Layout, size_bytes: float) -> CostTerms:
    """Intra-node phase on NVLink (NVLS when the switch reduces), inter-node phase on the rails.

    Phases are pipelined, so the bandwidth term is the busiest of the two tiers.
    """
    g, nodes = layout.ranks_per_node, layout.num_nodes
    rail_bytes = size_bytes / g
    if algo == "tree":
        net_bytes = double_tree_max_sends(nodes) * rail_bytes / 2
        inter = 2 * math.ceil(math.log2(nodes))
    else:
        net_bytes = ring_wire_bytes(op, size_bytes, nodes) / g
        inter = ring_steps(op, nodes)
    intra_op_bytes, intra = _intra_phase(op, layout, size_bytes)
    bw_time = max(
        net_bytes / layout.net_bandwidth_bytes_per_s,
        intra_op_bytes / layout.intra_bandwidth_bytes_per_s,
    )
    hops = intra * layout.intra_hop_latency_s + inter * layout.inter_hop_latency_s
    return CostTerms(
        intra_steps=intra, inter_steps=inter, hop_latency_s=hops, bandwidth_time_s=bw_time
    )


def _intra_phase(op: str, layout: Layout, size_bytes: float) -> tuple[float, int]:
    """(busiest direction's bytes per GPU, steps) of the intra-node part of a two-level op.

    NVLS bytes are counted at ``1 / NVLS_EFFICIENCY`` (the switch's reduction rate)."""
    g = layout.ranks_per_node
    if g == 1:
        return 0.0, 0
    if layout.nvls:
        up, down = nvls_bytes(op, size_bytes, g)
        return max(up, down) / NVLS_EFFICIENCY, 1 if op != "all_reduce" else 2
    return ring_wire_bytes(op, size_bytes, g), ring_steps(op, g)


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


def _direct_all_to_all(layout: Layout, size_bytes: float) -> CostTerms:
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


def _gloo(op: str, layout: Layout, size_bytes: float) -> CostTerms:
    """gloo's algorithm: ``gloo_plan``'s messages, each a hop of the loopback."""
    sent, messages = gloo_plan(op, layout.num_ranks, size_bytes)
    one_node = layout.num_nodes == 1
    hop = layout.intra_hop_latency_s if one_node else layout.inter_hop_latency_s
    bw = layout.intra_bandwidth_bytes_per_s if one_node else layout.net_bandwidth_bytes_per_s
    return CostTerms(
        intra_steps=messages if one_node else 0, inter_steps=0 if one_node else messages,
        hop_latency_s=messages * hop, bandwidth_time_s=sent / bw,
    )  # fmt: skip
