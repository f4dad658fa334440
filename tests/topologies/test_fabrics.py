"""Fat-tree builders: classic k-ary counts, leaf-spine, oversubscription, rails, capacity."""

import networkx as nx
import pytest

from topologies.fabrics import FABRIC_PRESETS, FabricSpec, fat_tree_graph


def _hosts(count, rails=1):
    return [(f"h{i}.{r}", i, r) for i in range(count) for r in range(rails)]


def _spec(radix, tiers=None, rail_optimized=False):
    return FabricSpec(name="t", link="ib-ndr", radix=radix, tiers=tiers,
                      rail_optimized=rail_optimized)  # fmt: skip


@pytest.mark.parametrize("k", [4, 6, 8])
def test_k_ary_fat_tree_counts(k):
    graph, layout = fat_tree_graph(_hosts(k**3 // 4), _spec(k, tiers=3))
    switches = [n for n, kind in graph.nodes(data="kind") if kind != "nic"]
    assert len(switches) == layout.num_switches == 5 * k * k // 4
    assert layout.num_pods == k and layout.num_cores == (k // 2) ** 2
    # every switch uses exactly k ports; every host one
    undirected = graph.to_undirected()
    assert {undirected.degree(s) for s in switches} == {k}
    assert {undirected.degree(h) for h, _, _ in _hosts(k**3 // 4)} == {1}
    assert nx.is_strongly_connected(graph)
    assert layout.bisection_bytes_per_s() == k**3 / 4 / 2 * 50e9


def test_leaf_spine_counts_and_full_bisection():
    graph, layout = fat_tree_graph(_hosts(64), _spec(16))
    assert (layout.num_tiers, layout.num_leaves, layout.num_spines) == (2, 8, 8)
    assert all(graph.has_edge(f"leaf{i}", f"spine{s}") for i in range(8) for s in range(8))
    assert layout.bisection_bytes_per_s() == 32 * 50e9
    assert layout.tier_oversubscription() == {"leaf": 1.0}


def test_oversubscription_takes_away_up_ports():
    _, layout = fat_tree_graph(_hosts(64), _spec(16), oversubscription=2.0)
    assert (layout.leaf_down_ports, layout.leaf_up_ports) == (8, 4)
    assert layout.oversubscription == 2.0
    assert layout.bisection_bytes_per_s() == 32 * 50e9 / 2
    _, three = fat_tree_graph(_hosts(64), _spec(16, tiers=3), oversubscription=4.0)
    assert three.tier_oversubscription() == {"leaf": 4.0, "spine": 1.0}
    assert three.requested_oversubscription == 4.0


def test_one_switch_when_everything_fits_on_a_leaf():
    graph, layout = fat_tree_graph(_hosts(4), _spec(8))
    assert (layout.num_tiers, layout.num_switches, layout.tier_oversubscription()) == (1, 1, {})
    assert graph.number_of_edges() == 8


def test_rail_optimised_wiring_puts_nic_i_on_leaf_i():
    graph, layout = fat_tree_graph(_hosts(8, rails=4), _spec(8, rail_optimized=True))
    # 4 servers per scalable unit (k/2), 4 rails: unit 0 -> leaves 0-3, unit 1 -> leaves 4-7
    assert layout.num_leaves == 8
    assert list(graph.successors("h1.2")) == ["leaf2"]
    assert list(graph.successors("h5.2")) == ["leaf6"]
    in_order, _ = fat_tree_graph(_hosts(8, rails=4), _spec(8))
    assert list(in_order.successors("h1.2")) == ["leaf1"]  # position 6 // 4 down ports


def test_capacity_error_says_the_capacity():
    with pytest.raises(ValueError, match="holds at most 32 NIC ports in 8 leaves; 40 NICs"):
        fat_tree_graph(_hosts(40), _spec(8, tiers=2))
    with pytest.raises(ValueError, match="holds at most 4 NIC ports"):
        fat_tree_graph(_hosts(5), _spec(8, tiers=1))
    with pytest.raises(ValueError, match="at most 128 NIC ports"):
        fat_tree_graph(_hosts(129), _spec(8))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"radix": 7}, "fabric.radix=7; must be an even integer"),
        ({"tiers": 4}, "fabric.tiers=4; valid: 1, 2, 3"),
        ({"link": "pcie-gen5"}, "fabric.link='pcie-gen5' is a pcie link"),
        ({"link": "ib-qdr"}, "unknown fabric.link 'ib-qdr'"),
        ({"sharp": "yes"}, "fabric.sharp='yes'; give true/false"),
        ({"tuner": "magic"}, "fabric.tuner='magic'; valid: nccl, aws-ofi-p5"),
        ({"transport": "myrinet"}, "fabric.transport='myrinet'; valid: ib, ofi, tcpx"),
        ({"plugin_latency_s": -1e-6}, r"fabric.plugin_latency_s=-1e-06; must be a number"),
        ({"step_latency_s": float("nan")}, "fabric.step_latency_s=nan; must be a number"),
        ({"simple_extra_latency_s": 2.0}, r"simple_extra_latency_s=2.0; must be .* in 0..1"),
        ({"message_gap_s": -60e-6}, r"fabric.message_gap_s=-6e-05; must be a number"),
        ({"channels": -1}, r"fabric.channels=-1; must be an integer in 0..64"),
        ({"channels": 65}, r"fabric.channels=65; must be an integer in 0..64"),
        ({"channels": True}, r"fabric.channels=True; must be an integer"),
    ],
)
def test_bad_fabric_specs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FabricSpec(**{"name": "x", "link": "ib-ndr", "radix": 8, **kwargs})


def test_bad_oversubscription_and_empty():
    with pytest.raises(ValueError, match=r"oversubscription=0\.5; must be a number >= 1"):
        fat_tree_graph(_hosts(4), _spec(8), oversubscription=0.5)
    with pytest.raises(ValueError, match="has no NICs"):
        fat_tree_graph([], _spec(8))


def test_presets():
    assert set(FABRIC_PRESETS) == {
        "ib-ndr", "ib-hdr", "roce-400g", "ib-ndr-sharp", "ib-ndr-sharp-collnet", "efa-p5",
        "efa-p4d", "gcp-a3-mega", "gcp-a3-high", "gcp-a3-ultra", "azure-ndr",
    }  # fmt: skip
    assert FABRIC_PRESETS["ib-ndr"].radix == 64
    assert [name for name, spec in FABRIC_PRESETS.items() if spec.sharp] == [
        "ib-ndr-sharp",
        "ib-ndr-sharp-collnet",
    ]
    collnet = [name for name, spec in FABRIC_PRESETS.items() if spec.collnet]
    assert collnet == ["ib-ndr-sharp-collnet"]
    efa = FABRIC_PRESETS["efa-p5"]  # aws-ofi-nccl: 75 us plugin latency, 75 (+3) us per message
    assert (efa.plugin_latency_s, efa.step_latency_s, efa.simple_extra_latency_s) == (
        75e-6, 75e-6, 3e-6,
    )  # fmt: skip
    assert (efa.transport, efa.tuner) == ("ofi", "aws-ofi-p5")
    assert FABRIC_PRESETS["gcp-a3-mega"].transport == "tcpx"
    ultra = FABRIC_PRESETS["gcp-a3-ultra"]  # gIB: IB verbs over RoCE, its own step latency
    assert (ultra.transport, ultra.step_latency_s, ultra.link) == ("ib", 32.4e-6, "gcp-roce-400g")
    assert FABRIC_PRESETS["roce-400g"].rail_optimized
    for spec in FABRIC_PRESETS.values():
        assert spec.source


def test_collnet_needs_sharp_switches_and_is_off_by_default():
    from topologies.fabrics import FabricSpec

    assert not FabricSpec(name="x", link="ib-ndr", radix=64, sharp=True).collnet
    with pytest.raises(ValueError, match=r"fabric\.collnet=true needs switches that reduce"):
        FabricSpec(name="x", link="ib-ndr", radix=64, collnet=True)
    with pytest.raises(ValueError, match=r"fabric\.collnet='yes'; give true/false"):
        FabricSpec(name="x", link="ib-ndr", radix=64, sharp=True, collnet="yes")  # type: ignore[arg-type]
