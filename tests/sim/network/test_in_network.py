"""In-network reduction (SHARP: CollNet, NVLS + SHARP) and the two-level algorithms."""

from __future__ import annotations

import pytest
import simpy

from sim.network.algorithms import choose, decompose, placement_of
from sim.network.analytical import available_algorithms, cost_terms
from sim.network.comm_model import CommModel
from sim.network.hierarchy import NVLS_EFFICIENCY, sharp_bytes
from topologies.config import load_cluster
from topologies.presets import build_cluster

GB = 1e9
S = float(1 << 30)


def _layout(nodes: int = 2, fabric: str = "ib-ndr-sharp-collnet"):
    topology = build_cluster("dgx-h100", nodes, fabric)
    return topology, placement_of(topology, range(topology.num_gpus))


def test_in_network_reduction_passes_the_rings_nic_limit():
    _, layout = _layout()
    n, nic, nvlink = 16, 47 * GB, 370.8 * GB
    ring = cost_terms("all_reduce", "ring", layout, S).bandwidth_time_s
    assert 2 * (n - 1) / n * S / ring == pytest.approx(8 * nic)  # ring busbw = 8 NICs: 376 GB/s
    nvls = cost_terms("all_reduce", "nvls", layout, S).bandwidth_time_s
    # Each NIC carries S/8 each way; NVLink S 9/8 each way at the NVLS all_reduce efficiency.
    expected = max(S / 8 / nic, S * 9 / 8 / (nvlink * NVLS_EFFICIENCY["all_reduce"]))
    assert nvls == pytest.approx(expected)
    busbw = 2 * (n - 1) / n * S / nvls
    assert busbw == pytest.approx(275 * GB * 30 / 16)  # 515.6 GB/s, NVLink-bound
    assert busbw > 8 * nic
    # CollNet: intra-node reduce-scatter + all-gather (the ring's 2(g-1)/g S) + S/8 per NIC.
    for algo in ("collnet_direct", "collnet_chain"):
        terms = cost_terms("all_reduce", algo, layout, S)
        assert terms.bandwidth_time_s == pytest.approx(max(S / 8 / nic, 1.75 * S / nvlink))
    assert cost_terms("all_reduce", "collnet_direct", layout, S).protocols[0].bandwidth_factor == (
        0.85  # tuning.cc: CollNetDirect busBw x0.85 on sm90
    )


def test_sharp_moves_gather_and_scatter_bytes_once():
    assert sharp_bytes("all_reduce", 8.0, 4) == (8.0, 8.0)
    assert sharp_bytes("all_gather", 8.0, 4) == (2.0, 6.0)
    assert sharp_bytes("reduce_scatter", 8.0, 4) == (6.0, 2.0)
    _, layout = _layout(4)
    ag = cost_terms("all_gather", "collnet_direct", layout, S).bandwidth_time_s
    assert ag == pytest.approx(max(S * 3 / 4 / 8 / (47 * GB), 7 / 8 * S / (370.8 * GB)))


def test_which_algorithms_a_fabric_allows():
    _, plain = _layout(2, "ib-ndr")
    assert available_algorithms("all_reduce", plain) == ("ring", "tree", "nvlstree", "hierarchical")
    _, sharp = _layout()
    assert set(available_algorithms("all_reduce", sharp)) >= {
        "nvls", "collnet_direct", "collnet_chain"
    }  # fmt: skip
    assert available_algorithms("all_gather", sharp) == (
        "ring", "nvls", "collnet_direct", "hierarchical"
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"switches that reduce \(SHARP\) with NCCL.s CollNet"):
        cost_terms("all_reduce", "collnet_chain", plain, S)
    # SHARP switches under NCCL's defaults (NCCL_COLLNET_ENABLE unset): what ib-ndr runs
    _, idle = _layout(2, "ib-ndr-sharp")
    assert available_algorithms("all_reduce", idle) == available_algorithms("all_reduce", plain)
    with pytest.raises(ValueError, match="NCCL_COLLNET_ENABLE=1"):
        cost_terms("all_reduce", "nvls", idle, S)
    # all_gather/reduce_scatter across nodes need one NIC (collnet head) per local rank.
    shared = load_cluster({
        "node": {"base": "dgx-h100", "nics_per_node": 4}, "num_nodes": 2,
        "fabric": "ib-ndr-sharp-collnet",
    })  # fmt: skip
    layout = placement_of(shared, range(16))
    with pytest.raises(ValueError, match="8 ranks per node share 4"):
        cost_terms("all_gather", "nvls", layout, S)
    assert "nvls" in available_algorithms("all_reduce", layout)


def test_auto_runs_nvls_with_sharp_and_never_without():
    _, sharp = _layout(8)
    assert choose("all_reduce", sharp, 1 << 30) == ("nvls", "simple")
    _, plain = _layout(8, "ib-ndr")
    for size in (1 << 10, 1 << 20, 1 << 26, 1 << 30, 1 << 34):
        assert choose("all_reduce", plain, size)[0] in ("ring", "tree", "nvlstree")


@pytest.mark.parametrize(
    ("op", "algo"),
    [("all_reduce", "collnet_direct"), ("all_reduce", "collnet_chain"), ("all_reduce", "nvls"),
     ("all_reduce", "nvlstree"), ("all_reduce", "tree"), ("all_gather", "nvls"),
     ("reduce_scatter", "collnet_direct")],
)  # fmt: skip
def test_flow_and_analytical_agree_for_the_two_level_algorithms(op, algo):
    topology, _ = _layout(4)
    for size in (1 << 16, 1 << 30):
        env = simpy.Environment()
        model = CommModel(env, topology, fidelity="flow")
        env.run(model.run(op, range(32), size, algo=algo))
        assert env.now == pytest.approx(model.estimate_s(op, range(32), size, algo=algo), rel=1e-9)


def test_the_reduction_tree_loads_each_fabric_link_once():
    # 4 servers x 2 GPUs, radix-4 leaves holding one server each (NICs in order): rail 0's NICs
    # sit on 4 leaves, so its reduction climbs to a spine.
    topology = load_cluster({
        "node": {"base": "dgx-h100", "num_gpus": 2, "nics_per_node": 2}, "num_nodes": 4,
        "fabric": {"base": "ib-ndr-sharp-collnet", "radix": 4, "rail_optimized": False, "tiers": 2},
    })  # fmt: skip
    groups = decompose("all_reduce", "nvls", topology, range(8), S)
    fabric = [g for g in groups if any(topology.graph.edges[p[0]]["kind"] == "network"
                                       for p in g.paths)]  # fmt: skip
    assert len(fabric) == 4  # up and down, per rail
    for group in fabric:
        edges = [p[0] for p in group.paths]
        assert len(edges) == len(set(edges))  # merged partial sums: each link once
        assert group.size_bytes == pytest.approx(S / 2)  # a node's S over its 2 NICs
    kinds = {topology.graph.nodes[v]["kind"] for g in fabric for ((_, v),) in g.paths}
    assert "spine" in kinds
