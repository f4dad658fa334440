"""Routing, capacities and determinism of built clusters."""

import collections
import itertools
import math
import subprocess
import sys

import networkx as nx
import pytest

from topologies.fabrics import FabricSpec
from topologies.nodes import NodeSpec
from topologies.presets import build_cluster, cluster_topology
from topologies.topology import stable_hash

SMALL_NODE = NodeSpec(
    name="tiny", gpu="h100-sxm", num_gpus=2, intra="nvswitch", nvlink="nvlink4",
    nvswitch="nvswitch-gen3", num_pcie_switches=1, nic="ib-ndr", nics_per_node=2, num_cpus=1,
)  # fmt: skip
"""2 GPUs, 2 NICs: small enough for a max-flow cross-check of the bisection."""


def _kinds(topology, path):
    return [topology.graph.nodes[v]["kind"] for _, v in path]


def test_intra_node_path_goes_through_the_nvswitch():
    topo = build_cluster("dgx-h100")
    for a, b in itertools.permutations(range(8), 2):
        path = topo.path(a, b)
        assert path == ((topo.gpus[a], "n0/nvswitch"), ("n0/nvswitch", topo.gpus[b]))
        assert topo.path_bandwidth_bytes_per_s(path) == 450e9
        assert topo.path_latency_s(path) == pytest.approx(0.6e-6)
    assert topo.path(3, 3) == ()
    assert topo.path_bandwidth_bytes_per_s(()) == math.inf
    assert topo.path_latency_s(()) == 0.0


def test_cross_node_path_shapes():
    topo = build_cluster("dgx-h100", num_nodes=128, fabric="ib-ndr")
    same_leaf = topo.path(0, 8)  # rail 0 of servers 0 and 1: one leaf
    assert _kinds(topo, same_leaf) == ["pcie_switch", "nic", "leaf", "nic", "pcie_switch", "gpu"]
    assert same_leaf[0] == ("n0/gpu0", "n0/pcie0")
    cross = topo.path(0, 9)  # rail 0 to rail 1: up to a spine and down
    assert _kinds(topo, cross) == [
        "pcie_switch", "nic", "leaf", "spine", "leaf", "nic", "pcie_switch", "gpu",
    ]  # fmt: skip
    assert topo.path_bandwidth_bytes_per_s(cross) == 50e9
    assert topo.path_bandwidth_bytes_per_s(cross, effective=True) == 47e9
    assert topo.path_latency_s(cross) == pytest.approx(4 * 0.5e-6 + 4 * 0.35e-6)


def test_three_tier_path_crosses_the_core():
    node = NodeSpec(name="one", gpu="h100-sxm", num_gpus=1, intra="pcie", num_pcie_switches=1,
                    nic="ib-ndr", nics_per_node=1, num_cpus=1)  # fmt: skip
    fabric = FabricSpec(name="k4", link="ib-ndr", radix=4, tiers=3, rail_optimized=False)
    topo = cluster_topology(node, 16, fabric)
    assert _kinds(topo, topo.path(0, 1))[2:-3] == ["leaf"]
    assert _kinds(topo, topo.path(0, 2))[2:-3] == ["leaf", "spine", "leaf"]
    assert _kinds(topo, topo.path(0, 15))[2:-3] == ["leaf", "spine", "core", "spine", "leaf"]


def test_paths_are_cached_and_valid_edges():
    topo = build_cluster("dgx-h100", num_nodes=4, fabric="ib-ndr")
    first = topo.path(2, 29, flow_key=5)
    assert topo.path(2, 29, flow_key=5) is first
    assert all(topo.graph.has_edge(*edge) for edge in first)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(first))
    assert first[0][0] == topo.gpus[2] and first[-1][1] == topo.gpus[29]


def test_ecmp_spreads_flows_evenly_over_spines():
    topo = build_cluster("dgx-h100", num_nodes=64, fabric="ib-ndr")
    spines = collections.Counter()
    for src, flow in itertools.product(range(0, 256, 8), range(64)):
        path = topo.path(src, 257, flow_key=flow)  # rail 0 -> rail 1: always via a spine
        (spine,) = [v for _, v in path if topo.graph.nodes[v]["kind"] == "spine"]
        spines[spine] += 1
    assert len(spines) == 32
    mean = sum(spines.values()) / 32
    assert max(spines.values()) < 1.5 * mean and min(spines.values()) > 0.5 * mean


def test_flow_key_changes_the_route_not_its_length():
    topo = build_cluster("dgx-h100", num_nodes=64, fabric="ib-ndr")
    routes = {topo.path(0, 9, flow_key=k) for k in range(32)}
    assert len(routes) > 8
    assert {len(r) for r in routes} == {8}


def test_stable_hash_is_process_independent():
    script = (
        "from topologies.presets import build_cluster;"
        "t = build_cluster('dgx-h100', 64, 'ib-ndr');"
        "print([t.path(s, 300 + s, k)[3] for s in range(8) for k in range(4)])"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("1", "2")
    }  # fmt: skip
    assert len(outputs) == 1
    assert stable_hash("a", 1) == stable_hash("a", 1) != stable_hash("a", 2)


def test_injection_bandwidth_per_tier():
    topo = build_cluster("dgx-h100", num_nodes=2, fabric="ib-ndr")
    assert topo.injection_bandwidth_bytes_per_s(0, "nvlink") == 450e9
    assert topo.injection_bandwidth_bytes_per_s(0, "nvlink", effective=True) == pytest.approx(
        370.8e9
    )
    assert topo.injection_bandwidth_bytes_per_s(0, "network") == 50e9
    assert topo.injection_bandwidth_bytes_per_s(0, "pcie") == 64e9
    pcie = build_cluster("pcie-h100", num_nodes=2, fabric="ib-ndr")
    assert pcie.injection_bandwidth_bytes_per_s(0, "network") == 25e9  # 2 GPUs per NIC
    assert pcie.injection_bandwidth_bytes_per_s(0, "nvlink") == 300e9
    assert build_cluster("dgx-h100").injection_bandwidth_bytes_per_s(0, "network") == 0.0
    with pytest.raises(ValueError, match="unknown tier 'ethernet'"):
        topo.injection_bandwidth_bytes_per_s(0, "ethernet")


def test_rank_accessors():
    topo = build_cluster("hgx-h200", num_nodes=2, fabric="ib-ndr")
    assert topo.num_gpus == 16 and topo.gpus_per_node == 8 and topo.num_nodes == 2
    assert (topo.node_index(11), topo.local_index(11)) == (1, 3)
    assert topo.gpu_spec(11).name == "h200"
    assert topo.gpus[11] == "n1/gpu3"
    with pytest.raises(ValueError, match="rank 16 out of range for 16 GPUs"):
        topo.path(0, 16)


def test_single_node_bisection_is_max_flow():
    # 4 GPUs x 450 GB/s through the NVSwitch + the PCIe detour limited by one UPI link (32).
    assert build_cluster("dgx-h100").bisection_bandwidth_bytes_per_s() == 4 * 450e9 + 32e9
    assert build_cluster("localhost", gpus_per_node=4).bisection_bandwidth_bytes_per_s() == 20e9
    assert build_cluster("localhost", gpus_per_node=1).bisection_bandwidth_bytes_per_s() == 0.0


def _max_flow_bisection(topo):
    graph = nx.DiGraph()
    for u, v, bw in topo.graph.edges(data="bandwidth_bytes_per_s"):
        graph.add_edge(u, v, capacity=bw)
    half = topo.num_gpus // 2
    graph.add_edges_from(("s", g) for g in topo.gpus[:half])
    graph.add_edges_from((g, "t") for g in topo.gpus[half:])
    return nx.maximum_flow_value(graph, "s", "t")


@pytest.mark.parametrize(("tiers", "ratio"), [(2, 1.0), (2, 2.0), (3, 1.0), (3, 2.0)])
def test_cluster_bisection_matches_max_flow(tiers, ratio):
    fabric = FabricSpec(name="small", link="ib-ndr", radix=8, tiers=tiers)
    # radix 8: 4 servers per scalable unit; 8 servers = 2 units, so the halves are whole leaves
    topo = cluster_topology(SMALL_NODE, 8, fabric, oversubscription=ratio)
    full = 16 / 2 * 50e9
    assert topo.bisection_bandwidth_bytes_per_s() == pytest.approx(full / ratio)
    assert _max_flow_bisection(topo) == pytest.approx(full / ratio)


def test_full_fat_tree_bisection_and_oversubscription_halves_it():
    full = build_cluster("dgx-h100", num_nodes=128, fabric="ib-ndr")
    half = build_cluster("dgx-h100", num_nodes=128, fabric="ib-ndr", oversubscription=2)
    assert full.bisection_bandwidth_bytes_per_s() == 1024 / 2 * 50e9
    assert half.bisection_bandwidth_bytes_per_s() == 1024 / 2 * 50e9 / 2
    assert full.bisection_bandwidth_bytes_per_s(effective=True) == pytest.approx(512 * 47e9)


def test_nvls_capability():
    assert build_cluster("dgx-h100").nvls_capable()
    assert build_cluster("hgx-h200").nvls_capable()
    assert not build_cluster("dgx-a100").nvls_capable()
    assert not build_cluster("pcie-h100").nvls_capable()
