"""Small hand-built topologies for the network-model tests (real ``Topology`` objects)."""

from __future__ import annotations

import networkx as nx

from sim.network.analytical import CommParams
from sim.network.calibration import Calibration, FitQuality
from topologies.hardware import GPUS
from topologies.topology import Topology

IDEAL = CommParams(
    base_latency_s=0.0, intra_step_latency_s=0.0, inter_step_latency_s=0.0,
    efficiency_max=1.0, half_size_bytes=0.0, protocol="none",
)  # fmt: skip
"""No software latency, no NCCL protocol, full efficiency: the pure topology closed forms."""


def star_topology(num_gpus: int, bandwidth: float, latency_s: float) -> Topology:
    """``num_gpus`` GPUs on one switch, every link ``bandwidth`` B/s per direction."""
    graph = nx.DiGraph()
    graph.add_node("sw", kind="nvswitch", spec=None, node_index=0)
    for i in range(num_gpus):
        gpu = f"gpu{i}"
        graph.add_node(gpu, kind="gpu", spec=GPUS["h100-sxm"], node_index=0, local_index=i)
        for u, v in ((gpu, "sw"), ("sw", gpu)):
            graph.add_edge(
                u, v, bandwidth_bytes_per_s=bandwidth, effective_bandwidth_bytes_per_s=bandwidth,
                latency_s=latency_s, kind="nvlink",
            )  # fmt: skip
    return Topology(graph, name=f"star{num_gpus}", num_nodes=1)


def calibration_with(params: CommParams, *keys: str) -> Calibration:
    """A calibration holding ``params`` under every ``op/algo/scope`` key given."""
    quality = FitQuality(num_points=1, mape=0.0, min_size_bytes=0, max_size_bytes=0)
    return Calibration(params=dict.fromkeys(keys, params), quality=dict.fromkeys(keys, quality))
