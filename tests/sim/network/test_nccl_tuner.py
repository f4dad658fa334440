"""NCCL's tuner (graphs, tuning model, pick) against values computed by hand from tuning.cc."""

from __future__ import annotations

import dataclasses

import pytest

from sim.network import nccl_tables as T
from sim.network.algorithms import choose, placement_of
from sim.network.nccl_graph import comm_channels, graphs
from sim.network.nccl_tuner import pick, time_us, tune
from topologies.presets import build_cluster


def _hw(node: str = "dgx-h100", nodes: int = 1, fabric: str | None = None):
    topology = build_cluster(node, nodes, fabric)
    return placement_of(topology, range(topology.num_gpus)).hardware()


def _graph(hw, algo):
    g = graphs(hw)[algo]
    return g.num_channels, g.bw_intra_gbps, g.bw_inter_gbps


def test_graphs_follow_the_search_budgets():
    one = _hw()
    # 370.8 GB/s NVLink: 6 x 60 GB/s, doubled by ncclTopoDupChannels (60 >= 50) to 12 x 30.
    assert _graph(one, "ring") == (12, 30.0, 30.0)
    # NVLS: 8 channels, (8 + 1) x 40 <= 370.8; bwInter raised to the list's top, 60 < 2 x 40.
    assert _graph(one, "nvls") == (8, 40.0, 60.0)
    assert comm_channels(one) == 24  # ncclTopoPostset doubles the ring channels
    # A100: 240 GB/s = 6 x 40, doubled (compute capability 8.0 duplicates) to 12 x 20.
    assert _graph(_hw("dgx-a100"), "ring") == (12, 20.0, 20.0)
    # Across nodes: one channel per 50 GB/s NDR NIC at 48 GB/s, not doubled (Hopper, < 50, > 4).
    assert _graph(_hw(nodes=2, fabric="ib-ndr"), "ring") == (8, 48.0, 48.0)
    # HDR 25 GB/s: 24 GB/s channels, < 25 so not doubled; GCP's 200 Gb/s NICs likewise.
    assert _graph(_hw("dgx-a100", 4), "ring") == (8, 24.0, 24.0)
    assert _graph(_hw("a3-mega-h100", 2), "ring") == (8, 24.0, 24.0)
    # Trees: search.cc's second pass raises bwIntra a speed at a time while it is under twice
    # bwInter and the channels fit the NVLink budget (370.8 x 8/7 on H100, 240 x 8/7 on A100).
    assert _graph(_hw(nodes=2, fabric="ib-ndr"), "tree") == (8, 48.0, 48.0)  # 48: the top
    assert _graph(_hw("a3-mega-h100", 2), "tree") == (8, 48.0, 24.0)  # 8 x 48 = 384 fits
    assert _graph(_hw("dgx-a100", 4), "tree") == (8, 30.0, 24.0)  # 8 x 48 = 384 > 274
    assert _graph(_hw("p4d-a100", 2), "tree") == (4, 24.0, 12.0)
    assert _graph(one, "tree") == (12, 30.0, 30.0)  # 12 x 40 > 370.8: no raise on one node
    # A tree is searched on its own at the ring's channels and a listed speed: a 250 GB/s node
    # doubles its ring's 5 x 50 to 10 x 25, off Hopper's list; its tree takes 24, and 10 x 30
    # would not fit.
    odd = dataclasses.replace(one, intra_gbps=250.0)
    assert _graph(odd, "ring") == (10, 25.0, 25.0)
    assert _graph(odd, "tree") == (10, 24.0, 24.0)
    # CollNet graphs get the second pass too (the tuner reads their bwIntra on any node count):
    # B200 on NDR raises its chain and direct heads from 48 to 96; A100's direct heads to 48
    # (2 x 48 <= 240), its chain to 30, like its tree.
    b200 = _hw("dgx-b200", 4, "ib-ndr-sharp-collnet")
    assert _graph(b200, "collnet_chain") == _graph(b200, "collnet_direct") == (8, 96.0, 48.0)
    a100 = _hw("dgx-a100", 2, "ib-ndr-sharp-collnet")
    assert (_graph(a100, "collnet_direct"), _graph(a100, "collnet_chain")) == (
        (8, 48.0, 24.0), (8, 30.0, 24.0),
    )  # fmt: skip
    # ...which NCCL's tuner reads for trees on <= 2 nodes: p4d Tree/Simple busBw
    # min(4 x 24 x 0.92, 4 x 23.6) = 88.3, algbw 44.2, against Ring's 25.6 (12 x 4 / (30/16)).
    p4d = tune(_hw("p4d-a100", 2))
    assert p4d[("all_reduce", "tree", "simple")].algbw_gbps == pytest.approx(4 * 24 * 0.92 / 2)
    assert p4d[("all_reduce", "ring", "simple")].algbw_gbps == pytest.approx(48 * 16 / 30)
    # No SHARP, no CollNet graphs; SHARP: one head per NIC at 48 GB/s.
    assert _graph(_hw(nodes=2, fabric="ib-ndr"), "collnet_direct")[0] == 0
    assert _graph(_hw(nodes=2, fabric="ib-ndr-sharp-collnet"), "collnet_direct") == (8, 48.0, 48.0)


def test_one_h100_node_all_reduce_matches_tuning_cc():
    table = tune(_hw())
    entries = {k[1:]: (round(v.latency_us, 6), v.algbw_gbps) for k, v in table.items()
               if k[0] == "all_reduce"}  # fmt: skip
    # Ring: 6.6 + 14 x 0.6; busBw min(141, 0.5 x 360) = 141 -> algbw x 8/14.
    assert entries[("ring", "ll")] == pytest.approx((15.0, 141 * 8 / 14))
    # LL128: 14 + 14 x 1.9; min(0.92 x 360, 12 x 36.7).
    assert entries[("ring", "ll128")] == pytest.approx((40.6, 0.92 * 360 * 8 / 14))
    assert entries[("ring", "simple")] == pytest.approx((56.0, 360 * 8 / 14))
    # NVLS: latency 25 us (base not added); busBw 8 x min(40 x 0.85 x 7/8 x 2, 60) = 476.
    assert entries[("nvls", "simple")] == pytest.approx((25.0, 476 * 8 / 14))
    # Tree on one node: 6.8 + 2 x 7 x 0.6 and min(0.92 x 360, 12 x 38.7) / 3.8, x0.5.
    assert entries[("tree", "ll")] == pytest.approx((15.2, 0.92 * 360 / 3.8 * 0.5))
    assert ("nvlstree", "simple") not in entries or entries[("nvlstree", "simple")][1] == 0


def test_multi_node_latencies_and_bandwidths():
    two = tune(_hw(nodes=2, fabric="ib-ndr"))
    # NVLSTree on 2 nodes: 25 + 2 x 1 x 20.9; busBw 8 x min(59.5, 2 x 48, 57.7), x 16/30.
    nvlstree = two[("all_reduce", "nvlstree", "simple")]
    assert (nvlstree.latency_us, nvlstree.algbw_gbps) == pytest.approx((66.8, 8 * 57.7 * 16 / 30))
    # Ring/Simple on 8 nodes: 8.4 + 112 x max(3.4, 3 x 1.0 Intel overhead) + 14 x 14.
    eight = tune(_hw(nodes=8, fabric="ib-ndr"))
    assert eight[("all_reduce", "ring", "simple")].latency_us == pytest.approx(585.2)
    # AWS p5 (AMD, plugin latency 75 us): intra step max(3.4, 3 x 2.0), inter 14 + 2 x 75.
    p5 = tune(_hw("p5-h100", 4))
    assert p5[("all_reduce", "ring", "simple")].latency_us == pytest.approx(
        8.4 + 56 * 6.0 + 6 * 164.0
    )


def test_in_network_algorithms_match_tuning_cc():
    sharp = tune(_hw(nodes=2, fabric="ib-ndr-sharp-collnet"))
    direct = sharp[("all_reduce", "collnet_direct", "simple")]
    # 2 (min(1, 7) x 3.7 + 7 x 0.4) + 31; busBw 8 x 48 / (f - (f-1)/2 = 1) x 0.85, x 0.5.
    assert (direct.latency_us, direct.algbw_gbps) == pytest.approx((44.0, 8 * 48 * 0.85 * 0.5))
    chain = sharp[("all_reduce", "collnet_chain", "simple")]
    assert (chain.latency_us, chain.algbw_gbps) == pytest.approx((2 * 7 * 2.8 + 30, 8 * 48 * 0.5))
    nvls = sharp[("all_reduce", "nvls", "simple")]  # NVLS + SHARP: 25 + 18
    assert (nvls.latency_us, nvls.algbw_gbps) == pytest.approx((43.0, 8 * 48 * 16 / 30))
    # all_gather by CollNetDirect: ppn x min(bwIntra, 0.9 bwInter), no conversion.
    ag = sharp[("all_gather", "collnet_direct", "simple")]
    assert ag.algbw_gbps == pytest.approx(8 * min(48, 0.9 * 48))
    plain = tune(_hw(nodes=2, fabric="ib-ndr"))
    assert plain[("all_reduce", "nvls", "simple")].algbw_gbps == 0  # no collnet, no NVLS+SHARP
    assert ("all_reduce", "collnet_direct", "simple") not in plain  # no CollNet graph


def test_time_applies_the_tree_correction_and_the_ring_plateau():
    hw = _hw(nodes=2, fabric="ib-ndr")
    tree = tune(hw)[("all_reduce", "tree", "ll")]
    # 4 KiB: log2(4096 >> 6) = 6 -> treeCorrectionFactor[LL][6] = 0.7.
    assert time_us("all_reduce", "tree", "ll", hw, 4096) == pytest.approx(
        tree.latency_us + 4096 / (1000 * tree.algbw_gbps * 0.7)
    )
    ring = tune(hw)[("all_reduce", "ring", "simple")]
    assert time_us("all_reduce", "ring", "simple", hw, 1 << 30) == pytest.approx(
        ring.latency_us * 1.4 + (1 << 30) / (1000 * ring.algbw_gbps)
    )
    assert T.tree_correction("simple", 1 << 40) == 1.0  # past 256 MiB: no correction


def test_blackwell_nvlstree_is_corrected_to_1_gib_on_x86_hosts_only():
    # tuning.cc ncclTopoGetAlgoTime (2.29.2 on): NVLSTree all_reduce bw x treeCorrectionFactor
    # for logSize < 24 with minCompCap >= 100 and an x86 host; Tree's own stops at 23
    assert T.tree_correction("simple", 768 << 20) == 1.0
    assert T.tree_correction("simple", 768 << 20, limit=24) == T.TREE_CORRECTION[2][23]
    size = 768 << 20
    assert not T.tuner_release("2.29.1").blackwell_nvlstree_correction  # from 2.29.2
    for node, corrected in (("dgx-b200", True), ("gb200-nvl72", False)):
        hw = _hw(node, 2, "ib-ndr")
        assert hw.cpu_arm is not corrected  # Grace hosts the GB200's GPUs
        entry = tune(hw)[("all_reduce", "nvlstree", "simple")]
        factor = T.TREE_CORRECTION[2][23] if corrected else 1.0
        expected = entry.latency_us + size / (1000.0 * entry.algbw_gbps * factor)
        assert time_us("all_reduce", "nvlstree", "simple", hw, size) == pytest.approx(expected)


def test_pick_crossovers():
    hw = _hw()
    # Ring/LL 15 + S/80.57 vs NVLS 25 + S/272 (us, KB): equal at 1.1448 MB.
    crossover = 10 / (1 / (141 * 8 / 14) - 1 / 272.0) * 1000
    assert pick("all_reduce", hw, crossover * 0.99) == ("ring", "ll")
    assert pick("all_reduce", hw, crossover * 1.01) == ("nvls", "simple")
    assert pick("all_reduce", hw, 1 << 30, allowed=("ring",)) == ("ring", "simple")
    assert pick("all_to_all", hw, 1 << 20) is None  # outside NCCL's model
    two = _hw(nodes=2, fabric="ib-ndr")
    assert pick("all_reduce", two, 1 << 30) == ("nvlstree", "simple")
    eight_sharp = _hw(nodes=8, fabric="ib-ndr-sharp-collnet")
    assert pick("all_reduce", eight_sharp, 1 << 30) == ("nvls", "simple")  # NVLS + SHARP


def test_aws_region_tuner_picks_for_the_p5_points():
    # aws-ofi-nccl's regions (8 ranks per node, > 2 nodes); 2 nodes: NCCL's own tuner.
    topology = build_cluster("p5-h100", 8)
    layout = placement_of(topology, range(64))
    assert choose("all_reduce", layout, 32 << 20) == ("tree", "ll128")
    assert choose("all_reduce", layout, 1 << 30) == ("ring", "ll128")
    assert choose("all_reduce", layout, 8 << 30) == ("ring", "simple")
    assert choose("all_reduce", layout, 1 << 30, "ring") == ("ring", "ll128")
    two = placement_of(build_cluster("p5-h100", 2), range(16))
    assert choose("all_reduce", two, 1 << 30) == pick("all_reduce", two.hardware(), 1 << 30)


@pytest.mark.parametrize(
    ("release", "first", "tree_simple", "nvls_nvlink", "nvlstree_net", "ll_max_hopper"),
    [
        # (base, NVLink, PCI, NET) of Tree/Simple; from src/graph/tuning.cc at each tag
        ("2.9.9", "2.18.1", (0.0, 28.0, 28.0, 28.0), 23.0, 19.0, 87.7),
        ("2.17.1", "2.18.1", (0.0, 28.0, 28.0, 28.0), 23.0, 19.0, 87.7),
        ("2.18.5", "2.18.3", (0.0, 4.0, 6.0, 14.0), 23.0, 19.0, 87.7),
        ("2.20.5", "2.19.1", (0.0, 28.0, 28.0, 28.0), 23.0, 14.0, 87.7),
        ("2.21.5", "2.21.5", (0.0, 28.0, 28.0, 28.0), 25.0, 14.0, 141.0),
        ("2.26.2+cuda12.8", "2.23.4", (8.4, 4.0, 4.0, 14.0), 25.0, 14.0, 141.0),
        ("2.27.5", "2.27.3", (8.4, 4.0, 4.0, 14.0), 25.0, 14.0, 141.0),
        ("2.28.7", "2.28.3", (8.4, 4.0, 4.0, 14.0), 25.0, 14.0, 141.0),
        ("2.28.9", "2.28.9", (8.4, 4.0, 4.0, 14.0), 25.0, 20.9, 141.0),
        ("2.29.2", "2.29.2", (8.4, 4.0, 4.0, 14.0), 25.0, 20.9, 141.0),
        ("", "2.29.2", (8.4, 4.0, 4.0, 14.0), 25.0, 20.9, 141.0),
    ],
)
def test_each_nccl_release_reads_its_own_latency_tables(
    release, first, tree_simple, nvls_nvlink, nvlstree_net, ll_max_hopper
):
    rules = T.tuner_release(release)
    assert rules.release == first
    simple = T.PROTOCOLS.index("simple")
    rows = (rules.base, rules.nvlink, rules.pci, rules.net)
    assert tuple(row["tree"][simple] for row in rows) == tree_simple
    assert rules.nvlink["nvls"][simple] == nvls_nvlink
    assert rules.net["nvlstree"][simple] == nvlstree_net
    assert T.ll_max_gbps("hopper", 1, False, release) == ll_max_hopper
    assert T.ll_max_gbps("hopper", 2, False, release) == 39.0  # Intel row, every release
    version = T.nccl_release(release or T.DEFAULT_NCCL_VERSION)
    assert rules.ring_ll_quarter == (version < (2, 21, 0))
    assert rules.ppn1_tree_net == (version >= (2, 23, 0))
    assert (rules.nvls_bandwidth == "graph") == (version < (2, 28, 3))
    with pytest.raises(ValueError, match=r"nccl_version='2\.26'; expected a release"):
        T.tuner_release("2.26")


def test_each_release_prices_what_its_tuner_priced():
    one_node = {v: _hw_release("dgx-h100", 1, None, v) for v in ("2.20.5", "2.21.5")}
    # Ring/LL on one H100 node: 12 channels x 30 GB/s, min(llMaxBw, busBw x factor) x 8 / 14:
    # up to 2.20 a quarter and Ampere's 87.7 cap, from 2.21 half and 141
    assert tune(one_node["2.20.5"])[("all_reduce", "ring", "ll")].algbw_gbps == pytest.approx(
        min(87.7, 360 / 4) * 8 / 14
    )
    assert tune(one_node["2.21.5"])[("all_reduce", "ring", "ll")].algbw_gbps == pytest.approx(
        min(141.0, 360 / 2) * 8 / 14
    )
    # Ring/LL where the cap does not bind: one A100 node, 12 channels x 20 GB/s
    a100 = {v: tune(_hw_release("dgx-a100", 1, None, v)) for v in ("2.20.5", "2.21.5")}
    ll = ("ring", "ll")
    assert a100["2.20.5"][("all_reduce", *ll)].algbw_gbps == pytest.approx(240 / 4 * 8 / 14)
    assert a100["2.20.5"][("all_gather", *ll)].algbw_gbps == pytest.approx(240 / 3 * 8 / 7)
    assert a100["2.20.5"][("broadcast", *ll)].algbw_gbps == pytest.approx(240 / 3)
    assert a100["2.21.5"][("all_gather", *ll)].algbw_gbps == pytest.approx(87.7 * 8 / 7)
    # Ring/LL128 with one rank per server: x0.7 up to 2.22, x0.92 (under the channels' cap) after
    pair = {
        v: placement_of(build_cluster("dgx-h100", 2, "ib-ndr", nccl_version=v), [0, 8])
        for v in ("2.22.3", "2.23.4")
    }
    ring = graphs(pair["2.22.3"].hardware())["ring"]
    bus = ring.num_channels * ring.bw_intra_gbps
    ll128 = {
        v: tune(p.hardware())[("all_reduce", "ring", "ll128")].algbw_gbps for v, p in pair.items()
    }
    assert ll128["2.22.3"] == pytest.approx(bus * 0.7)
    assert ll128["2.23.4"] == pytest.approx(min(bus * 0.92, ring.num_channels * 36.7))
    # NVLS all_gather on one H100 node (8 channels, bwIntra 40, bwInter 60): x5/6 up to 2.22,
    # the busbw itself from 2.23, 2.27's (ppn-1)/ppn rule
    nvls = {
        v: tune(_hw_release("dgx-h100", 1, None, v))[("all_gather", "nvls", "simple")].algbw_gbps
        for v in ("2.22.3", "2.26.2", "2.27.5")
    }
    assert nvls == {
        "2.22.3": pytest.approx(8 * 40 * 5 / 6),
        "2.26.2": pytest.approx(8 * 40),
        "2.27.5": pytest.approx(8 * min(40 * 7 / 8, 60 * 0.9)),
    }
    # one rank on each of 4 servers: Tree's NET latency from 2.23 only (Ring/LL: 6.6 base +
    # network steps of 2.7 us, then of Tree/LL's 5.0 us)
    spread = {
        v: placement_of(build_cluster("dgx-h100", 4, "ib-ndr", nccl_version=v), [0, 8, 16, 24])
        for v in ("2.22.3", "2.23.4")
    }
    ll = {v: tune(p.hardware())[("all_reduce", "ring", "ll")].latency_us for v, p in spread.items()}
    # 6 steps; up to 2.22 NCCL counts 2 nNodes = 8 network steps, so (6 - 8) intra steps at the
    # 1 us network overhead: its formula, negative term included
    assert ll == {
        "2.22.3": pytest.approx(6.6 + (6 - 8) * 1.0 + 8 * 2.7),
        "2.23.4": pytest.approx(6.6 + 6 * 5.0),
    }
    simple = tune(spread["2.22.3"].hardware())[("all_reduce", "ring", "simple")].latency_us
    # Ring's 14, not Tree/Simple's 28 of 2.22; and 2 nNodes network steps up to 2.22
    assert simple == pytest.approx(8.4 + (6 - 8) * 3.4 + 8 * 14.0)
    # NVLSTree on 4 NDR servers: 8 channels, min(40, 48 / 2) x 5/6 before 2.28.3
    four = _hw_release("dgx-h100", 4, "ib-ndr", "2.26.2")
    assert tune(four)[("all_reduce", "nvlstree", "simple")].algbw_gbps == pytest.approx(
        8 * min(40.0, 48.0 / 2) * 5 / 6
    )


def _hw_release(node: str, nodes: int, fabric: str | None, release: str):
    topology = build_cluster(node, nodes, fabric, nccl_version=release)
    return placement_of(topology, range(topology.num_gpus)).hardware()


def test_nccl_2_26_picks_nvlstree_at_4_mib_on_four_servers_where_2_30_keeps_tree():
    # NVLSTree's latency on 4 servers: 25 us (NVLink) + 2 log2(4) x the NET step: 14 us up to
    # 2.28.7, 20.9 us since 2.28.9; the public 4-server table of NCCL 2.26.2 (ib-ndr-h100-xe9680)
    # runs 4 MiB at NVLSTree's rate.
    old = placement_of(build_cluster("dgx-h100", 4, "ib-ndr", nccl_version="2.26.2"), range(32))
    new = placement_of(build_cluster("dgx-h100", 4, "ib-ndr"), range(32))
    assert tune(old.hardware())[("all_reduce", "nvlstree", "simple")].latency_us == pytest.approx(
        25 + 4 * 14.0
    )
    assert tune(new.hardware())[("all_reduce", "nvlstree", "simple")].latency_us == pytest.approx(
        25 + 4 * 20.9
    )
    assert choose("all_reduce", old, 4 << 20) == ("nvlstree", "simple")
    assert choose("all_reduce", new, 4 << 20) == ("tree", "ll128")
    # and Ring from 256 MiB, where NVLSTree's bandwidth (160 GB/s before 2.28.3) falls behind
    assert choose("all_reduce", old, 256 << 20) == ("ring", "simple")
    assert (
        choose("all_reduce", old, 8 << 30)
        == choose("all_reduce", new, 8 << 30)
        == ("ring", "simple")
    )


@pytest.mark.parametrize(
    ("node", "fabric", "algos", "protos"),
    [
        ("a3-high-h100", "gcp-a3-high", {"ring"}, {"simple"}),  # Google's TCPX environment
        ("p4d-a100", "efa-p4d", None, {"simple"}),  # aws-ofi-nccl on EFA send-recv
    ],
)
def test_a_fabric_that_restricts_nccl_algo_or_proto_is_obeyed(node, fabric, algos, protos) -> None:
    from sim.network.algorithms import choose, placement_of
    from topologies.presets import build_cluster

    topology = build_cluster(node, 2, fabric)
    layout = placement_of(topology, range(16))
    for size in (1 << 10, 1 << 20, 1 << 26, 1 << 32):
        algo, proto = choose("all_reduce", layout, size)
        assert proto in protos, (size, proto)
        assert algos is None or algo in algos, (size, algo)
    one = placement_of(build_cluster(node, 1), range(8))  # within a server: NCCL's own choice
    assert choose("all_reduce", one, 1 << 16)[1] != "simple"


def test_nvls_tuning_follows_nccl():
    """ncclNvlsTuning (nvls.cc): 16 CTAs on Hopper, NVLSTree's largest chunk 128 KiB below 4
    nodes and 64 KiB from 4; on Blackwell 24 CTAs in one NVLink domain, and across nodes
    ncclNvlsTreeSm100Tuning with 8 local ranks and NDR (a 48 GB/s GPU-to-NIC path: the NIC's
    50 capped by PCIe Gen5's 48): 2 nodes 32 CTAs and a 64 KiB tree chunk (PXB, < 96 GB/s),
    3 or more 24 CTAs and 64 KiB."""
    from sim.network.protocols import _nvls_chunking, nvls_tuning

    kib = 1024
    assert nvls_tuning(_hw()) == (16, 128 * kib, 128 * kib)
    assert nvls_tuning(_hw(nodes=2, fabric="ib-ndr")) == (16, 128 * kib, 128 * kib)
    assert nvls_tuning(_hw(nodes=4, fabric="ib-ndr")) == (16, 128 * kib, 64 * kib)
    assert nvls_tuning(_hw("dgx-b200")) == (24, 128 * kib, 128 * kib)
    two = _hw("dgx-b200", 2, "ib-ndr")
    assert (two.arch, two.nic_path_gbps) == ("blackwell", 48.0)
    assert nvls_tuning(two) == (32, 128 * kib, 64 * kib)
    assert nvls_tuning(_hw("dgx-b200", 3, "ib-ndr")) == (24, 128 * kib, 64 * kib)
    assert _nvls_chunking("nvlstree", two)[:2] == (32 * 8, 64 * kib)
    assert _nvls_chunking("nvls", _hw("dgx-b200"))[:2] == (24 * 8, 128 * kib)
