"""Server graphs: NVSwitch boxes, PCIe servers with bridges, localhost."""

import dataclasses
import itertools

import networkx as nx
import pytest

from topologies.nodes import NODE_PRESETS, NodeSpec, server_graph, with_gpus
from topologies.topology import count_by_kind


def _kinds(spec: NodeSpec) -> dict[str, int]:
    return count_by_kind(server_graph(spec))


def test_dgx_h100_structure():
    graph = server_graph(NODE_PRESETS["dgx-h100"])
    assert _kinds(NODE_PRESETS["dgx-h100"]) == {
        "gpu": 8, "nvswitch": 1, "pcie_switch": 4, "cpu": 2, "nic": 8,
        "leaf": 0, "spine": 0, "core": 0,
    }  # fmt: skip
    # 8 NVLink + 8 GPU-PCIe + 8 NIC-PCIe + 4 switch-CPU + 1 UPI full-duplex links
    assert graph.number_of_edges() == 2 * (8 + 8 + 8 + 4 + 1)
    assert all(graph.has_edge(v, u) for u, v in graph.edges)
    assert nx.is_strongly_connected(graph)
    nvlink = [d for _, _, d in graph.out_edges("gpu0", data=True) if d["kind"] == "nvlink"]
    assert [d["bandwidth_bytes_per_s"] for d in nvlink] == [450e9]


def test_every_gpu_pair_two_nvlink_hops_through_the_switch():
    graph = server_graph(NODE_PRESETS["dgx-h100"])
    nvlink = graph.edge_subgraph((u, v) for u, v, k in graph.edges(data="kind") if k == "nvlink")
    for a, b in itertools.permutations(range(8), 2):
        paths = list(nx.all_shortest_paths(nvlink, f"gpu{a}", f"gpu{b}"))
        assert paths == [[f"gpu{a}", "nvswitch", f"gpu{b}"]]
        assert nx.shortest_path_length(graph, f"gpu{a}", f"gpu{b}") == 2


def test_each_gpu_has_an_affine_nic_on_its_pcie_switch():
    graph = server_graph(NODE_PRESETS["dgx-h100"])
    nics = [graph.nodes[f"gpu{j}"]["nic"] for j in range(8)]
    assert sorted(nics) == [f"nic{k}" for k in range(8)]
    for j, nic in enumerate(nics):
        assert nx.shortest_path_length(graph, f"gpu{j}", nic) == 2


def test_pcie_server_bridges_pairs_and_shares_nics():
    spec = NODE_PRESETS["pcie-h100"]
    graph = server_graph(spec)
    assert _kinds(spec)["nvswitch"] == 0
    assert graph.edges["gpu0", "gpu1"]["kind"] == "nvlink"
    assert not graph.has_edge("gpu1", "gpu2")
    assert nx.shortest_path(graph, "gpu0", "gpu2") == ["gpu0", "pcie0", "cpu0", "pcie1", "gpu2"]
    assert [graph.nodes[f"gpu{j}"]["nic"] for j in range(8)] == [f"nic{j // 2}" for j in range(8)]
    assert graph.edges["cpu0", "cpu1"]["kind"] == "cpu_link"


def test_plain_pcie_server_routes_through_switch_then_cpus():
    spec = dataclasses.replace(NODE_PRESETS["pcie-h100"], intra="pcie", nvlink=None)
    graph = server_graph(spec)
    assert nx.shortest_path(graph, "gpu0", "gpu1") == ["gpu0", "pcie0", "gpu1"]
    assert len(nx.shortest_path(graph, "gpu0", "gpu7")) == 6  # via both CPU sockets


def test_localhost_is_processes_on_a_loopback_host():
    graph = server_graph(with_gpus(NODE_PRESETS["localhost"], 3))
    assert sorted(graph.nodes) == ["cpu0", "gpu0", "gpu1", "gpu2"]
    assert {d["kind"] for _, _, d in graph.edges(data=True)} == {"loopback"}
    assert graph.nodes["gpu0"]["spec"].name == "cpu"


def test_nic_without_switch_goes_to_nearest():
    spec = dataclasses.replace(NODE_PRESETS["pcie-h100"], nics_per_node=1)
    graph = server_graph(spec)
    assert {graph.nodes[f"gpu{j}"]["nic"] for j in range(8)} == {"nic0"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpu": "h300"}, "unknown node.gpu 'h300'"),
        ({"intra": "ethernet"}, "node.intra='ethernet'; valid: nvswitch"),
        ({"num_gpus": 0}, "node.num_gpus=0; must be an integer >= 1"),
        ({"num_gpus": 2.5}, "node.num_gpus=2.5"),
        (
            {"nic": "pcie-gen5"},
            "node.nic='pcie-gen5' is a pcie link; valid: efa-p4d, efa-p5, gcp-200g, "
            "gcp-roce-400g, ib-hdr",
        ),
        ({"nvswitch": None}, "needs node.nvswitch and node.nvlink"),
        ({"nics_per_node": 0}, "needs node.nics_per_node >= 1"),
        ({"nvswitch": "nvswitch-gen9"}, "unknown node.nvswitch 'nvswitch-gen9'"),
        ({"intra": "pcie"}, "node.nvswitch='nvswitch-gen3' needs node.intra='nvswitch'"),
    ],
)
def test_bad_node_specs(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        dataclasses.replace(NODE_PRESETS["dgx-h100"], **change)


def test_bridge_needs_even_gpus():
    with pytest.raises(ValueError, match=r"even node\.num_gpus"):
        dataclasses.replace(NODE_PRESETS["pcie-h100"], num_gpus=3)
