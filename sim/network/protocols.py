"""NCCL's protocols (LL, LL128, Simple) as cost-model data: latencies, bandwidth factors, caps.

NCCL runs every collective with one of three protocols and its tuner picks the (algorithm,
protocol) with the smallest predicted time (``src/graph/tuning.cc``; reference §3.2-3.7):

- LL: 8-byte lines of 4 B data + 4 B flag, so at most half the link rate (factor 0.5), capped
  by ``llMaxBws`` (busbw, GB/s), but the lowest latency;
- LL128: 128-byte lines carrying 120 B (factor 0.92), enabled by default on NVLink;
- Simple: the full rate, the highest latency (bigger per-step handshakes).

Each protocol carries NCCL's base latency and per-step hardware latency for the algorithm, as
*extra* latency on top of the topology's hop latencies (which already hold Ring/LL's hwLat:
NVLink 0.6 us, PCI 1.0 us, NET 2.7 us per step), and its pipeline start-up chunk: the slot of
its buffer that one step moves (buffer / NCCL_STEPS: LL 512 KiB / 8, LL128 4.69 MiB / 8,
Simple 4 MiB / 8). gloo (CPU) has no protocols: one plain alpha-beta entry.

    protos = protocols_for("all_reduce", "ring", "nccl", ("hopper", "nvlink", 1))
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

US = 1e-6
GBPS = 1e9

PROTOCOL_NAMES = ("ll", "ll128", "simple")
"""NCCL's protocols, in NCCL's enum order."""

PROTOCOL_MODES = ("auto", "none", *PROTOCOL_NAMES)
"""Values of ``CommParams.protocol``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Protocol:
    """One protocol's cost on one algorithm and hardware: NCCL's tuning constants."""

    name: str
    """``ll``, ``ll128``, ``simple`` (NCCL) or ``plain`` (gloo)."""
    bandwidth_factor: float
    """Fraction of the link rate the protocol's wire format leaves for data."""
    bandwidth_cap_bytes_per_s: float
    """Upper bound on the busbw the protocol reaches (NCCL's llMaxBws for LL; else inf)."""
    base_latency_s: float
    """NCCL's baseLat for the algorithm and protocol."""
    intra_step_latency_s: float
    """Per intra-node step, NCCL's hwLat beyond the topology's hop latency."""
    inter_step_latency_s: float
    """Per inter-node step, NCCL's hwLat beyond the topology's hop latency."""
    latency_scale: float
    """Multiplier on the protocol's latencies (NCCL's 1.4 ring plateau on several nodes)."""
    chunk_bytes: float
    """Pipeline start-up: bytes of one buffer slot (buffer / NCCL_STEPS)."""

    def latency_s(self, intra_steps: int, inter_steps: int) -> float:
        """The protocol's own latency for a collective of these steps."""
        steps = intra_steps * self.intra_step_latency_s + inter_steps * self.inter_step_latency_s
        return (self.base_latency_s + steps) * self.latency_scale

    def bandwidth_s(self, bandwidth_time_s: float, bus_bytes: float, size_bytes: float) -> float:
        """Bandwidth seconds: the link-rate time over the factor, the cap, plus start-up."""
        if bandwidth_time_s <= 0:
            return 0.0
        steady = max(
            bandwidth_time_s / self.bandwidth_factor, bus_bytes / self.bandwidth_cap_bytes_per_s
        )
        return steady * (1.0 + self.chunk_bytes / size_bytes) if size_bytes > 0 else steady


# NCCL tuning tables (reference §3.2), microseconds, in (LL, LL128, Simple) order.
_BASE_US = {"ring": (6.6, 14.0, 8.4), "tree": (6.8, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0)}
_HW_US = {
    ("nvlink", "ring"): (0.6, 1.9, 3.4),
    ("pci", "ring"): (1.0, 2.5, 5.7),
    ("net", "ring"): (2.7, 4.0, 14.0),
    ("nvlink", "tree"): (0.6, 1.25, 4.0),
    ("pci", "tree"): (1.0, 1.9, 4.0),
    ("net", "tree"): (5.0, 8.5, 14.0),
    ("nvlink", "nvls"): (0.0, 0.0, 25.0),
    ("net", "nvls"): (0.0, 0.0, 18.0),
    ("nvlink", "nvlstree"): (0.0, 0.0, 25.0),
    ("net", "nvlstree"): (0.0, 0.0, 20.9),
}
_TOPOLOGY_HOP_US = {"nvlink": 0.6, "pci": 1.0, "net": 2.7}
"""What the topology's hop latencies already hold per step (Ring/LL hwLat)."""

_FACTORS = {"ring": (0.5, 0.92, 1.0), "tree": (1 / 3.8 / 0.92, 120 / 128 / 0.92, 1.0)}
"""Bandwidth factors per protocol: Ring LL 0.5, LL128 0.92; Tree LL busBw/3.8 and LL128
busBw x 120/128 relative to Tree/Simple's 0.92 x busBw (reference §3.4)."""

_LL_MAX_GBPS = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}
"""llMaxBws on one node, per GPU generation (busbw GB/s)."""
_LL_MAX_MULTI_GBPS = (39.0, 20.4)
"""llMaxBws on 2 and > 2 nodes (Intel hosts; reference §3.2)."""

_CHUNK_BYTES = (512 * 1024 / 8, 120 * 640 * 8 * 8 / 8, (1 << 22) / 8)
"""One NCCL_STEPS slot of each protocol's buffer (LL 512 KiB, LL128 4.69 MiB, Simple 4 MiB)."""

_RING_PLATEAU = 1.4
"""NCCL multiplies Ring/Simple all_reduce latency by 1.4 on several nodes (tuning.cc)."""


@functools.lru_cache(maxsize=512)
def protocols_for(
    op: str, algo: str, backend: str, shape: tuple[str, str, int]
) -> tuple[Protocol, ...]:
    """The protocols ``algo`` may use for ``op`` on hardware ``shape`` = (arch, intra hw, nodes).

    NVLS and NVLSTree (our ``tree`` on NVLS nodes, ``nvls``) run Simple only; LL128 is enabled
    on NVLink only; ``hierarchical`` and ``direct`` (not in NCCL's model) use Ring's constants.
    gloo has no protocols (empty tuple: plain alpha-beta).
    """
    if backend == "gloo":
        return ()
    arch, intra_hw, nodes = shape
    table = {"tree": "tree", "nvls": "nvls"}.get(algo, "ring")
    if algo == "tree" and intra_hw == "nvlink" and arch in ("hopper", "blackwell"):
        table = "nvlstree"
    names: tuple[str, ...] = ("simple",) if table in ("nvls", "nvlstree") else PROTOCOL_NAMES
    if intra_hw != "nvlink":
        names = tuple(n for n in names if n != "ll128")
    return tuple(_protocol(name, op, algo, table, arch, intra_hw, nodes) for name in names)


def _protocol(
    name: str, op: str, algo: str, table: str, arch: str, intra_hw: str, nodes: int
) -> Protocol:
    index = PROTOCOL_NAMES.index(name)
    base = _BASE_US["nvls" if table == "nvlstree" else table][index]
    intra = _HW_US.get((intra_hw, table), _HW_US[(intra_hw, "ring")])[index]
    inter = _HW_US[("net", table)][index]
    cap = math.inf
    if name == "ll":
        cap_gbps = (
            _LL_MAX_GBPS.get(arch, math.inf)
            if nodes == 1
            else _LL_MAX_MULTI_GBPS[0 if nodes == 2 else 1]
        )
        cap = cap_gbps * GBPS
    plateau = algo == "ring" and op == "all_reduce" and name == "simple" and nodes > 1
    return Protocol(
        name=name,
        bandwidth_factor=_FACTORS["tree" if table == "tree" else "ring"][index],
        bandwidth_cap_bytes_per_s=cap,
        base_latency_s=base * US,
        intra_step_latency_s=max(intra - _TOPOLOGY_HOP_US[intra_hw], 0.0) * US,
        inter_step_latency_s=max(inter - _TOPOLOGY_HOP_US["net"], 0.0) * US,
        latency_scale=_RING_PLATEAU if plateau else 1.0,
        chunk_bytes=_CHUNK_BYTES[index],
    )
