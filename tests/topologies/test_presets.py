"""Cluster presets: every node type on every fabric, counts, defaults, bad input."""

import itertools

import pytest

from topologies.fabrics import FABRIC_PRESETS
from topologies.hardware import LINKS
from topologies.nodes import NODE_PRESETS
from topologies.presets import build_cluster


@pytest.mark.parametrize(
    ("node", "fabric"),
    itertools.product(sorted(set(NODE_PRESETS) - {"localhost"}), sorted(FABRIC_PRESETS)),
)
def test_any_node_on_any_fabric(node, fabric):
    topo = build_cluster(node, num_nodes=4, fabric=fabric, oversubscription=2)
    assert topo.num_gpus == 4 * NODE_PRESETS[node].num_gpus
    assert topo.fabric is not None
    # 32 NICs fit one radix-64 leaf unless rails spread them: one tier has no up-links.
    assert topo.fabric.oversubscription == (2.0 if topo.fabric.num_tiers > 1 else 1.0)
    path = topo.path(0, topo.num_gpus - 1)
    assert any(topo.graph.edges[e]["kind"] == "network" for e in path)


def test_dgx_h100_cluster_counts():
    topo = build_cluster("dgx-h100", num_nodes=128, fabric="ib-ndr")
    assert topo.num_gpus == 1024 and len(topo.nodes_of_kind("nic")) == 1024
    assert len(topo.nodes_of_kind("leaf")) == 32 and len(topo.nodes_of_kind("spine")) == 32
    assert topo.name == "128x dgx-h100 on ib-ndr"


def test_default_fabric_for_several_servers():
    topo = build_cluster("dgx-a100", num_nodes=2)
    assert topo.fabric is not None and topo.fabric.spec.name == "ib-hdr"
    assert build_cluster("dgx-a100").fabric is None


def test_localhost_processes():
    topo = build_cluster("localhost", gpus_per_node=4)
    assert topo.num_gpus == 4 and topo.gpu_spec(0).name == "cpu"
    path = topo.path(0, 3)
    assert [topo.graph.edges[e]["kind"] for e in path] == ["loopback", "loopback"]
    assert build_cluster("localhost").num_gpus == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node": "dgx-h1000"}, r"unknown node preset 'dgx-h1000' \(did you mean 'dgx-h100'"),
        ({"node": "dgx-h100", "fabric": "myrinet"}, "unknown fabric preset 'myrinet'"),
        ({"node": "dgx-h100", "num_nodes": 0}, "num_nodes=0; must be an integer >= 1"),
        ({"node": "dgx-h100", "oversubscription": 0.5}, "oversubscription=0.5"),
        ({"node": "localhost", "gpus_per_node": 0}, "gpus_per_node=0"),
        ({"node": "localhost", "num_nodes": 2}, "single host with no NICs"),
        ({"node": "localhost", "fabric": "ib-ndr"}, "has no NICs to join fabric 'ib-ndr'"),
        ({"node": "dgx-h100", "num_nodes": 4096, "fabric": "ib-hdr"}, "holds at most 16000"),
    ],
)
def test_bad_cluster_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_cluster(**kwargs)


def test_cloud_servers():
    p5 = build_cluster("p5-h100", num_nodes=2)
    assert p5.fabric is not None and p5.fabric.spec.name == "efa-p5"
    # 32 EFA cards of 100 Gb/s as one 4-lane port per GPU: 400 Gb/s, 3,200 Gb/s per server.
    assert p5.injection_bandwidth_bytes_per_s(0, "network") == 50e9
    assert 8 * 50e9 * 8 == 3200e9
    assert LINKS["efa-p5"].num_lanes == 4
    a3 = build_cluster("a3-mega-h100", num_nodes=2)
    assert a3.injection_bandwidth_bytes_per_s(0, "network") == 25e9  # 200 Gbps per GPU NIC
    azure = build_cluster("nd-h100-v5", num_nodes=2)
    assert azure.injection_bandwidth_bytes_per_s(0, "network") == 50e9  # 400 Gb/s NDR
    assert not azure.fabric.spec.rail_optimized  # "topology-agnostic" per Azure
    assert not p5.sharp_capable()
    assert build_cluster("dgx-h100", num_nodes=2, fabric="ib-ndr-sharp-collnet").sharp_capable()
    assert not build_cluster("dgx-h100").sharp_capable()


def test_gb200_nvl72_is_one_nvlink_domain_of_72():
    """A GB200 NVL72 rack as one server: 72 GPUs on one NVLink switch, one NDR NIC each, 36
    Grace sockets; any two of its GPUs meet over NVLink (GPU, switch, GPU), racks over IB."""
    topo = build_cluster("gb200-nvl72", num_nodes=2)
    assert topo.num_gpus == 144 and len(topo.nodes_of_kind("nic")) == 144
    assert len(topo.nodes_of_kind("cpu")) == 72
    spec = topo.gpu_spec(0)
    assert (spec.name, spec.family, spec.peak_flops_per_s["bf16"]) == ("gb200", "blackwell", 2.5e15)
    kinds = [topo.graph.edges[e]["kind"] for e in topo.path(0, 71)]
    assert kinds == ["nvlink", "nvlink"]
    assert "network" in [topo.graph.edges[e]["kind"] for e in topo.path(0, 72)]


def test_dgx_b200_is_blackwell_on_nvlink5():
    """DGX B200: 8 B200 (2.25 PFLOP/s dense bf16, 8 TB/s, 179 GiB as nvidia-smi reports), 18
    NVLink5 links at 50 GB/s per direction each, NCCL's 40.1 GB/s budget per link, NVLS."""
    topo = build_cluster("dgx-b200", num_nodes=2)
    spec = topo.gpu_spec(0)
    assert (spec.family, spec.peak_flops_per_s["bf16"], spec.hbm_bandwidth_bytes_per_s) == (
        "blackwell",
        2250e12,
        8.0e12,
    )
    assert spec.hbm_bytes == 179 * 2**30
    nvlink = LINKS["nvlink5"]
    assert nvlink.nominal_bandwidth_bytes_per_s == 900e9
    assert nvlink.effective_bandwidth_bytes_per_s == pytest.approx(18 * 40.1e9)
    assert topo.nvls_capable() and not topo.sharp_capable() and topo.num_gpus == 16
