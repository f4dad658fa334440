"""Collective decompositions into flows, their parity with the closed forms, auto selection."""

from __future__ import annotations

import pytest
import simpy

from sim.network.algorithms import choose_algorithm, decompose, placement_of, ring_orders
from sim.network.comm_model import CommModel
from tests.sim.helpers import IDEAL, calibration_with, star_topology
from topologies.config import load_cluster
from topologies.presets import build_cluster


def _flow_time(topology, op, ranks, size, algo, calibration=None):
    env = simpy.Environment()
    model = CommModel(env, topology, fidelity="flow", calibration=calibration)
    env.run(model.run(op, ranks, size, algo=algo))
    return env.now, model.estimate_s(op, ranks, size, algo=algo)


def test_ring_channels_enter_each_node_through_a_different_gpu():
    nodes = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    orders = ring_orders(nodes)
    assert len(orders) == 4
    exits = []
    for order in orders:
        assert sorted(order) == list(range(12))
        for j in range(3):
            assert sorted(order[4 * j : 4 * j + 4]) == nodes[j]  # a node's ranks stay together
            exits.append(order[4 * j + 3])
    assert sorted(exits) == list(range(12))  # every GPU is its node's exit exactly once
    assert ring_orders([[5, 3, 1]]) == [[5, 3, 1]]


def test_flow_ring_all_reduce_on_an_ideal_switch_equals_the_closed_form():
    n, size, bw, hop = 8, 3 << 28, 50e9, 1e-6
    topology = star_topology(n, bw, hop)
    calibration = calibration_with(IDEAL, "all_reduce/ring/intra")
    flow_s, _ = _flow_time(topology, "all_reduce", range(n), size, "ring", calibration)
    assert flow_s == pytest.approx(2 * (n - 1) / n * size / bw + 2 * (n - 1) * 2 * hop, rel=1e-12)


@pytest.mark.parametrize(
    ("num_nodes", "op", "algo"),
    [
        (1, "all_reduce", "ring"),
        (1, "all_gather", "ring"),
        (1, "reduce_scatter", "nvls"),
        (1, "all_reduce", "nvls"),
        (1, "all_to_all", "direct"),
        (1, "broadcast", "ring"),
        (4, "all_reduce", "ring"),
        (4, "all_reduce", "tree"),
        (4, "all_reduce", "hierarchical"),
        (4, "all_gather", "hierarchical"),
        (4, "reduce", "ring"),
        (2, "all_to_all", "direct"),
    ],
)
def test_flow_and_analytical_agree_on_an_uncongested_cluster(num_nodes, op, algo):
    topology = build_cluster("dgx-h100", num_nodes, "ib-ndr" if num_nodes > 1 else None)
    for size in (1 << 16, 1 << 30):
        flow_s, analytical_s = _flow_time(topology, op, range(topology.num_gpus), size, algo)
        assert flow_s == pytest.approx(analytical_s, rel=0.01)


def test_decomposed_bytes_match_the_ops_wire_bytes():
    topology = build_cluster("dgx-h100", 2, "ib-ndr")
    ranks = list(range(16))
    groups = decompose("all_reduce", "ring", topology, ranks, 16e9)
    carried = sum(g.size_bytes * len(g.paths) for g in groups)
    assert carried == pytest.approx(16 * 2 * 15 / 16 * 16e9)  # n ranks x 2(n-1)/n S
    a2a = decompose("all_to_all", "direct", topology, ranks, 16e9)
    assert len(a2a) == 16 * 15 and sum(g.size_bytes for g in a2a) == pytest.approx(15 * 16e9)
    bcast = decompose("broadcast", "ring", topology, ranks, 1e9, root=3)
    assert all(g.paths[0][0][0] == topology.gpus[3] for g in bcast)  # chains start at the root
    assert decompose("all_reduce", "ring", topology, [0], 1e9) == []


def test_auto_picks_like_nccl():
    h100 = placement_of(build_cluster("dgx-h100"), range(8))
    assert choose_algorithm("all_reduce", h100, 8 << 30) == "nvls"
    assert choose_algorithm("all_reduce", h100, 1024) == "ring"  # NVLS latency 25 us
    a100 = placement_of(build_cluster("dgx-a100"), range(8))
    assert choose_algorithm("all_reduce", a100, 8 << 30) == "ring"
    two_nodes = placement_of(build_cluster("dgx-h100", 2, "ib-ndr"), range(16))
    assert choose_algorithm("all_reduce", two_nodes, 8 << 30) == "nvlstree"
    assert choose_algorithm("all_to_all", two_nodes, 8 << 30) == "direct"


def _small_fat_tree(oversubscription: float):
    """4 one-GPU servers, 2 per leaf (radix 4): 2:1 leaves have one spine up-link."""
    return load_cluster({
        "node": {"base": "dgx-h100", "num_gpus": 1, "nics_per_node": 1}, "num_nodes": 4,
        "fabric": {"base": "ib-ndr", "radix": 4, "rail_optimized": False, "tiers": 2},
        "oversubscription": oversubscription,
    })  # fmt: skip


def test_oversubscribed_fat_tree_slows_a_cross_spine_all_to_all_by_the_expected_factor():
    # Each server sends S/4 to each of 3 peers, 2 of them behind the spine. Non-blocking, the NIC
    # (3 x S/4 at B) bounds it: 0.75 S/B. With one up-link per leaf (2:1), 4 cross flows share
    # B: S/B. Expected slowdown 4/3.
    size, nic = 4e9, 47e9
    calibration = calibration_with(IDEAL, "all_to_all/direct/inter")
    oversubscribed = _small_fat_tree(2.0)
    latency = placement_of(oversubscribed, range(4)).inter_hop_latency_s
    blocked, _ = _flow_time(oversubscribed, "all_to_all", range(4), size, "direct", calibration)
    _, ideal = _flow_time(_small_fat_tree(1.0), "all_to_all", range(4), size, "direct", calibration)
    assert blocked - latency == pytest.approx(size / nic, rel=1e-9)
    assert ideal - latency == pytest.approx(0.75 * size / nic, rel=1e-9)
    assert (blocked - latency) / (ideal - latency) == pytest.approx(4 / 3, rel=1e-9)
