"""Cluster YAML: presets, files, mappings, strictness, round trip."""

import pytest
import yaml

from topologies.config import cluster_mapping, dump_cluster, load_cluster, write_cluster
from topologies.presets import build_cluster


def _edges(topology):
    return sorted(topology.graph.edges(data=True), key=lambda e: (e[0], e[1]))


def test_preset_name_and_mapping():
    assert load_cluster("dgx-h100").num_gpus == 8
    topo = load_cluster({"node": "dgx-h100", "num_nodes": 4, "fabric": "ib-ndr"})
    assert topo.num_gpus == 32 and topo.fabric is not None


def test_yaml_file_with_custom_node_and_fabric(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "node:\n  base: dgx-h100\n  num_gpus: 4\n  nic: ib-xdr\n"
        "num_nodes: 6\n"
        "fabric: {kind: fat-tree, link: ib-xdr, radix: 8, tiers: 3, rail_optimized: false}\n"
        "oversubscription: 2\n"
    )
    topo = load_cluster(path)
    assert topo.num_gpus == 24 and topo.gpus_per_node == 4
    assert topo.node is not None and topo.node.nics_per_node == 4  # scaled with num_gpus
    # an 800 Gb/s NIC behind a PCIe Gen5 x16 slot is held to the slot's 64 GB/s
    assert topo.injection_bandwidth_bytes_per_s(0, "network") == 64e9
    assert topo.fabric is not None and topo.fabric.num_tiers == 3
    assert topo.fabric.tier_oversubscription() == {"leaf": 2.0, "spine": 1.0}
    assert load_cluster(str(path)).num_gpus == 24


def test_fully_described_node():
    node = {"gpu": "h100-pcie", "num_gpus": 4, "intra": "nvlink-bridge",
            "nvlink": "nvlink4-bridge", "nic": "roce-400g", "nics_per_node": 2}  # fmt: skip
    topo = load_cluster({"node": node, "num_nodes": 2, "fabric": "roce-400g"})
    assert topo.num_gpus == 8 and topo.gpu_spec(0).name == "h100-pcie"


@pytest.mark.parametrize(
    "cluster",
    [
        build_cluster("dgx-h100"),
        build_cluster("dgx-h100", num_nodes=8, fabric="ib-ndr", oversubscription=3),
        build_cluster("localhost", gpus_per_node=3),
        load_cluster(
            {
                "node": {"base": "pcie-h100", "nics_per_node": 8},
                "num_nodes": 3,
                "fabric": {"base": "ib-ndr", "radix": 16, "tiers": 3},
            }
        ),
        build_cluster("p5-h100", num_nodes=3),
        build_cluster("dgx-h100", num_nodes=2, fabric="ib-ndr", nccl_version="2.26.2+cuda12.8"),
        load_cluster(
            {
                "node": "nd-h100-v5",
                "num_nodes": 2,
                "fabric": {"base": "azure-ndr", "sharp": True, "step_latency_s": 5e-6},
            }
        ),
    ],
    ids=lambda t: t.name,
)
def test_round_trip(tmp_path, cluster):
    path = tmp_path / "c.yaml"
    write_cluster(cluster, path)
    again = load_cluster(path)
    assert dump_cluster(again) == dump_cluster(cluster) == yaml.safe_load(path.read_text())
    assert again.gpus == cluster.gpus and again.name == cluster.name
    assert _edges(again) == _edges(cluster)


def test_preset_dumps_as_names():
    topo = build_cluster("dgx-h100", num_nodes=2, fabric="ib-ndr")
    assert dump_cluster(topo) == {
        "node": "dgx-h100", "num_nodes": 2, "fabric": "ib-ndr", "oversubscription": 1.0,
    }  # fmt: skip


def test_the_nccl_release_is_part_of_the_cluster():
    # NCCL prints 2.26.2+cuda12.8; the cluster keeps the release, and the same cluster under
    # another release is another topology (the network model reads the release's tables)
    older = load_cluster({"node": "dgx-h100", "nccl_version": "2.26.2+cuda12.8"})
    assert older.nccl_version == "2.26.2"
    assert dump_cluster(older)["nccl_version"] == "2.26.2"
    assert build_cluster("dgx-h100").nccl_version == ""
    assert build_cluster("dgx-h100") is not older


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"node": "dgx-h100", "num_node": 2},
         "cluster: unknown key 'num_node'; valid keys: node, num_nodes, fabric, oversubscription, "
         "nccl_version"),
        ({"num_nodes": 2}, "cluster: missing key 'node'"),
        ({"node": {"base": "dgx-h100", "gpus": 4}}, "cluster.node: unknown key 'gpus'; valid"),
        ({"node": {"gpu": "h100-sxm"}}, "cluster.node: missing key\\(s\\) num_gpus, intra"),
        ({"node": {"base": "dgx-h200"}}, "unknown cluster.node.base preset 'dgx-h200'"),
        ({"node": {"base": "dgx-h100", "num_gpus": -1}}, "node.num_gpus=-1"),
        ({"node": 8}, "cluster.node=8; give a preset name or a mapping"),
        ({"node": "dgx-h100", "fabric": {"radix": 8}}, "cluster.fabric: missing key\\(s\\) link"),
        ({"node": "dgx-h100", "fabric": {"base": "ib-ndr", "sharp": "maybe"}},
         "cluster.fabric: fabric.sharp='maybe'; give true/false"),
        ({"node": "dgx-h100", "fabric": {"base": "ib-ndr", "kind": "torus"}},
         "cluster.fabric.kind='torus'; valid: fat-tree"),
        ({"node": "dgx-h100", "fabric": {"base": "ib-ndr", "ports": 8}},
         "cluster.fabric: unknown key 'ports'"),
        ({"node": "dgx-h100", "fabric": {"base": "ib-ndr", "rail_optimized": "yes"}},
         "rail_optimized='yes'; give true/false"),
        ({"node": "dgx-h100", "num_nodes": "4"}, "cluster.num_nodes='4'; must be an integer"),
        ({"node": "dgx-h100", "oversubscription": "2:1"}, "cluster.oversubscription='2:1'"),
        ({"node": "dgx-h100", "nccl_version": 2.26},
         "cluster: nccl_version=2.26; expected a release such as 2.26.2"),
        ({"node": "dgx-h100", "nccl_version": "latest"}, "cluster: nccl_version='latest'"),
        ({"node": "dgx-h100", "num_nodes": 100, "fabric": {"base": "ib-ndr", "radix": 8}},
         "cluster: fabric 'ib-ndr' \\(radix 8, 3 tier\\(s\\)\\) holds at most 128 NIC ports"),
    ],
)  # fmt: skip
def test_strict_loading(data, message):
    with pytest.raises(ValueError, match=message):
        load_cluster(data)


def test_bad_sources(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cluster file not found: nope\.yaml"):
        load_cluster("nope.yaml")
    with pytest.raises(ValueError, match="unknown cluster 'dgx'; give a node preset"):
        load_cluster("dgx")
    bad = tmp_path / "list.yaml"
    bad.write_text("- dgx-h100\n")
    with pytest.raises(ValueError, match="expected a mapping with keys node"):
        cluster_mapping(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("node: dgx-h100\nnum_nodes: 2\nfabirc: ib-ndr\n")
    with pytest.raises(ValueError, match=r"typo\.yaml: unknown key 'fabirc'"):
        load_cluster(typo)


def test_malformed_yaml_error_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("node: [dgx-h100\n")
    with pytest.raises(yaml.YAMLError) as error:
        load_cluster(str(path))
    assert "broken.yaml" in str(error.value)


def test_the_nccl_release_reaches_every_way_a_cluster_is_chosen(tmp_path):
    import argparse

    from schedules.plan import load_plan
    from schedules.whatif import parse_flags
    from sim.inputs.topology import add_topology_arguments, topology_factory
    from sim.replay.simulate import plan_topology
    from sim.replay.whatif import degraded_topology

    parser = argparse.ArgumentParser()
    add_topology_arguments(parser)
    flags = parser.parse_args(["--topology", "dgx-h100", "--nodes", "2", "--fabric", "ib-ndr"])
    assert topology_factory(flags)(2, 8).nccl_version == ""
    flags.nccl_version = "2.21.5"
    assert topology_factory(flags)(2, 8).nccl_version == "2.21.5"
    raw = {
        "model": "llama3-8b",
        "cluster": {"node": "dgx-h100", "num_nodes": 2, "fabric": "ib-ndr",
                    "nccl_version": "2.26.2"},
        "parallel": {"data_parallel": "fsdp"},
        "training": {"micro_batch_size": 1, "global_batch_size": 16},
    }  # fmt: skip
    cluster = plan_topology(load_plan(raw))
    assert cluster.nccl_version == "2.26.2"
    slow = degraded_topology(cluster, parse_flags(["nic=3:0.5"]))
    assert slow is not cluster and slow.nccl_version == "2.26.2"  # a what-if keeps the release
    (tmp_path / "c.yaml").write_text("node: dgx-h100\n")
    beside = {**raw, "cluster": {"file": "c.yaml", "nccl_version": "2.26.2"}}
    with pytest.raises(ValueError, match="the cluster file names its own nccl_version"):
        load_plan(beside)
