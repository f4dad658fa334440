"""Closed forms of the alpha-beta model against hand-derived values."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.network.algorithms import placement_of
from sim.network.analytical import (
    CommParams,
    GroupPlacement,
    available_algorithms,
    cost_terms,
    double_tree_edges,
    double_tree_max_sends,
    nvls_bytes,
)
from tests.sim.helpers import IDEAL, star_topology
from topologies.presets import build_cluster

GB = 1e9


def _layout(**overrides: object) -> GroupPlacement:
    values = dict(
        num_ranks=16, num_nodes=2, ranks_per_node=8, intra_bandwidth_bytes_per_s=400 * GB,
        net_bandwidth_bytes_per_s=50 * GB, intra_hop_latency_s=1e-6, inter_hop_latency_s=5e-6,
        bisection_bandwidth_bytes_per_s=400 * GB, nvls=False,
    )  # fmt: skip
    values.update(overrides)
    return GroupPlacement(**values)  # type: ignore[arg-type]


def test_ring_all_reduce_on_a_uniform_switch_is_the_textbook_formula():
    n, size, bw, hop = 8, 1 << 30, 100 * GB, 0.5e-6
    layout = placement_of(star_topology(n, bw, hop), range(n))
    terms = cost_terms("all_reduce", "ring", layout, size)
    expected = 2 * (n - 1) / n * size / bw + 2 * (n - 1) * (2 * hop)
    assert terms.time_s(IDEAL, size) == pytest.approx(expected, rel=1e-12)
    assert terms.intra_steps == 14 and terms.inter_steps == 0


def test_ring_all_gather_and_broadcast_steps_and_bytes():
    layout = _layout(num_ranks=4, num_nodes=1, ranks_per_node=4)
    ag = cost_terms("all_gather", "ring", layout, 4e9)
    assert ag.bandwidth_time_s == pytest.approx(3e9 / (400 * GB))
    assert ag.intra_steps == 3
    bcast = cost_terms("broadcast", "ring", layout, 4e9)
    assert bcast.bandwidth_time_s == pytest.approx(4e9 / (400 * GB))


def test_multi_node_ring_is_bound_by_the_nodes_nics_or_nvlink():
    # 2 nodes x 8: each GPU's NIC carries 1/8 of the wire bytes, its NVLink the other 7/8.
    terms = cost_terms("all_reduce", "ring", _layout(), 1e9)
    wire = 2 * 15 / 16 * 1e9
    assert terms.bandwidth_time_s == pytest.approx(
        max(wire / 8 / (50 * GB), wire * 7 / 8 / (400 * GB))
    )
    assert (terms.intra_steps, terms.inter_steps) == (30 - 2, 2)


def test_nvls_bytes_follow_nccls_maintainer_and_reach_480_busbw_on_eight_h100():
    # NVIDIA/nccl#1083: reduce_scatter sends S, receives S/n; all_gather the reverse;
    # all_reduce S (n+1)/n each way (nccl-tests PR #239).
    assert nvls_bytes("all_reduce", 8.0, 8) == (9.0, 9.0)
    assert nvls_bytes("reduce_scatter", 8.0, 8) == (8.0, 1.0)
    assert nvls_bytes("all_gather", 8.0, 8) == (1.0, 8.0)
    layout = placement_of(build_cluster("dgx-h100"), range(8))
    terms = cost_terms("all_reduce", "nvls", layout, 8e9)
    algbw = 8e9 / terms.bandwidth_time_s
    # NCCL maintainer in NVIDIA/nccl-tests#212: "peak busBw of ~480GB/s (algbw ~275GB/s)".
    assert algbw == pytest.approx(275 * GB)
    assert algbw * 2 * 7 / 8 == pytest.approx(481.25 * GB)
    rs = cost_terms("reduce_scatter", "nvls", layout, 8e9).bandwidth_time_s
    # S up at 300 x 8/7 GB/s (NVIDIA/nccl#1506's all_gather): busbw 300 GB/s.
    assert 8e9 / rs * 7 / 8 == pytest.approx(300 * GB)


def test_double_binary_tree_sends_at_most_four_half_buffers_per_node():
    assert double_tree_edges(2) == (((0, 1),), ((1, 0),))
    for n in (3, 4, 5, 8, 16, 64, 128):
        first, second = double_tree_edges(n)
        assert len(first) == len(second) == n - 1
        assert {c for _, c in first} == set(range(1, n))  # every non-root has one parent
        assert double_tree_max_sends(n) <= 4


def test_nvlstree_beats_ring_on_two_nodes_because_only_one_gpu_share_crosses_the_network():
    layout = _layout(nvls=True)
    ring = cost_terms("all_reduce", "ring", layout, 1e9).bandwidth_time_s
    nvlstree = cost_terms("all_reduce", "nvlstree", layout, 1e9).bandwidth_time_s
    # NVLS inside the node moves S 9/8 each way at 0.834 of NVLink; each NIC carries S/8.
    nvls_eff = 275 * 9 / 8 / 370.8
    assert nvlstree == pytest.approx(max(1e9 / 8 / (50 * GB), 1e9 * 9 / 8 / (400 * GB * nvls_eff)))
    assert nvlstree < ring
    # NCCL's Tree chains the node's GPUs instead: the ring's 2(g-1)/g S on NVLink.
    tree = cost_terms("all_reduce", "tree", layout, 1e9).bandwidth_time_s
    assert tree == pytest.approx(max(1e9 / 8 / (50 * GB), 2 * 7 / 8 * 1e9 / (400 * GB)))


def test_direct_all_to_all_is_bound_by_nics_and_bisection():
    layout = _layout(bisection_bandwidth_bytes_per_s=100 * GB)
    terms = cost_terms("all_to_all", "direct", layout, 16e9)
    crossing = 16 * 16 / 4 * 1e9  # n^2/4 pairs x S/n per pair across the cut
    assert terms.bandwidth_time_s == pytest.approx(max(8e9 / (50 * GB), crossing / (100 * GB)))


def test_efficiency_curve_and_latency_terms():
    params = CommParams(
        base_latency_s=10e-6, intra_step_latency_s=1e-6, inter_step_latency_s=3e-6,
        efficiency_max=0.8, half_size_bytes=1024.0,
    )  # fmt: skip
    assert params.efficiency(1024) == pytest.approx(0.4)
    terms = cost_terms("all_reduce", "ring", _layout(), 1024)
    plain = replace(params, protocol="none")
    assert terms.latency_s(plain, 1024) == pytest.approx(10e-6 + 28 * 2e-6 + 2 * 8e-6)
    # NCCL's LL on 2 nodes (no arch given): baseLat 6.6 us, hwLat fully in the hop latencies.
    assert terms.split_s(params, 1024)[0] == "ll"
    # Multi-node rings pay NCCL's 1 us network overhead per intra step (getNetOverhead, Intel):
    # 1.0 - 0.6 us (the topology's hop) more on each of the 28 NVLink steps.
    overhead = 28 * 0.4e-6
    assert terms.latency_s(params, 1024) == pytest.approx(
        6.6e-6 + 10e-6 + 28 * 2e-6 + 2 * 8e-6 + overhead
    )


def test_protocols_follow_nccl_tables_on_one_h100_node():
    # 8 x H100, ring all_reduce, 14 NVLink steps (hop latency 0.6 us each in the topology):
    # LL 6.6 + 14 x 0.6 = 15.0 us, LL128 14 + 14 x 1.9 = 40.6 us, Simple 8.4 + 14 x 3.4 = 56 us.
    layout = placement_of(build_cluster("dgx-h100"), range(8))
    neutral = replace(IDEAL, protocol="auto")
    terms = cost_terms("all_reduce", "ring", layout, 1 << 30)
    for name, latency_us in (("ll", 15.0), ("ll128", 40.6), ("simple", 56.0)):
        forced = replace(neutral, protocol=name)
        assert terms.latency_s(forced, 1 << 30) == pytest.approx(latency_us * 1e-6)
    # 1 GiB: Simple, bandwidth (S + 512 KiB chunk) x 1.75 / 370.8 GB/s.
    name, _, bandwidth = terms.split_s(neutral, 1 << 30)
    assert name == "simple"
    assert bandwidth == pytest.approx(1.75 * ((1 << 30) + (1 << 19)) / 370.8e9)
    # 64 KiB: LL. NCCL launches 64 KiB / (512 threads x 8 B x 8 ranks) = 2 channels, each at
    # most its graph channel's 30 GB/s x 0.5 (LL): 30 GB/s busbw, under llMaxBw's 141 and half
    # the link's 185.4; start-up is one 64 KiB LL slot (512 KiB / 8 steps): x (1 + 64K / 64K).
    small = cost_terms("all_reduce", "ring", layout, 1 << 16)
    name, _, bandwidth = small.split_s(neutral, 1 << 16)
    assert name == "ll"
    assert bandwidth == pytest.approx(1.75 * (1 << 16) / 30e9 * 2)
    # From 24 x 32 KiB = 768 KiB every channel runs: llMaxBw caps LL at 141 GB/s.
    big = cost_terms("all_reduce", "ring", layout, 1 << 20)
    _, _, mid = big.split_s(replace(neutral, protocol="ll"), 1 << 20)
    assert mid == pytest.approx(1.75 * (1 << 20) / 141e9 * (1 + 1 / 16))


def test_unsupported_algorithms_are_clear_errors():
    a100 = placement_of(build_cluster("dgx-a100"), range(8))
    assert "nvls" not in available_algorithms("all_reduce", a100)
    with pytest.raises(ValueError, match=r"nvls.*NVLink SHARP"):
        cost_terms("all_reduce", "nvls", a100, 1e6)
    with pytest.raises(ValueError, match="does not implement all_to_all"):
        cost_terms("all_to_all", "ring", a100, 1e6)
    with pytest.raises(ValueError, match=">= 2 nodes"):
        cost_terms("all_reduce", "tree", a100, 1e6)
    with pytest.raises(ValueError, match=r"switches that reduce \(SHARP\) with NCCL.s CollNet"):
        cost_terms("all_reduce", "collnet_direct", _layout(), 1e6)


def test_nvlstree_fill_is_two_waves_of_the_sizes_chunk_at_the_steady_rate():
    # NCCL's NVLSTree chunk on 2 nodes (enqueue.cc calcCollChunking): 128 KiB from 64 MiB, 64 KiB
    # from 8 MiB; 16 channels x 8 heads move one chunk each per wave
    from sim.network import nccl_tables as T
    from sim.network.protocols import NVLSTREE_NUM_FILL_WAVES, protocols_for

    two = placement_of(build_cluster("dgx-h100", 2, "ib-ndr"), range(16)).hardware()
    (proto,) = protocols_for("all_reduce", "nvlstree", two)
    assert proto.num_fill_waves == NVLSTREE_NUM_FILL_WAVES == 2.0
    ops = T.NVLS_CHANNELS_SM90 * 8
    assert proto.chunk_ops == ops == 128
    rate_s = 1e-3  # one millisecond of steady transfer
    for size, chunk in ((64 * 2**20, 128 * 1024), (16 * 2**20, 64 * 1024)):
        assert proto.chunk(size) == chunk
        fill = rate_s / proto.bandwidth_factor * 2.0 * ops * chunk / size
        expected = rate_s / proto.bandwidth_factor * proto.chunk_factor(size) + fill
        assert proto.bandwidth_s(rate_s, 0.0, size) == pytest.approx(expected, rel=1e-12)
    # below one wave (128 chunks of 32 KiB at 4 MiB) the fill is the message's own time twice
    small = 2 * 2**20
    expected = rate_s / proto.bandwidth_factor * (proto.chunk_factor(small) + 2.0)
    assert proto.bandwidth_s(rate_s, 0.0, small) == pytest.approx(expected, rel=1e-12)
    one = placement_of(build_cluster("dgx-h100"), range(8)).hardware()
    assert all(p.num_fill_waves == 0.0 for p in protocols_for("all_reduce", "nvls", one))


def test_a_zero_byte_collective_has_no_fill_and_no_division():
    from sim.network.protocols import protocols_for

    two = placement_of(build_cluster("dgx-h100", 2, "ib-ndr"), range(16)).hardware()
    (proto,) = protocols_for("all_reduce", "nvlstree", two)
    assert proto.bandwidth_s(1e-3, 1.0, 0.0) == pytest.approx(
        1e-3 / proto.bandwidth_factor * proto.chunk_factor(0.0)
    )


def test_a_message_smaller_than_a_buffer_slot_fills_with_its_own_bytes():
    """The start-up is one buffer slot (512 KiB for Simple: 4 MiB / NCCL_STEPS) ahead of the
    steady rate, or the whole message where it is smaller: at most twice the steady time."""
    from sim.network.protocols import protocols_for

    two = placement_of(build_cluster("dgx-h100", 2, "ib-ndr"), range(16)).hardware()
    simple = next(p for p in protocols_for("all_gather", "ring", two) if p.name == "simple")
    assert simple.chunk_bytes == 512 * 1024
    rate_s = 1e-6
    # a 2 MiB message: the slot is a quarter of it
    assert simple.bandwidth_s(rate_s, 0.0, 2 * 2**20) == pytest.approx(rate_s * 1.25, rel=1e-12)
    # 4 KiB: the message itself, not a 512 KiB slot (which was 129 x its steady time)
    assert simple.bandwidth_s(rate_s, 0.0, 4096) == pytest.approx(rate_s * 2.0, rel=1e-12)


@pytest.mark.parametrize(
    ("node", "fabric", "nodes"),
    [("dgx-h100", None, 1), ("dgx-a100", None, 1), ("dgx-h100", "ib-ndr", 8),
     ("p5-h100", "efa-p5", 4), ("a3-mega-h100", "gcp-a3-mega", 2)],
)  # fmt: skip
def test_a_simple_collective_never_gets_faster_as_it_grows(node, fabric, nodes):
    """With its algorithm and the Simple protocol held, a bigger message never takes less time
    (8 B - 1 GiB, powers of two, every op and algorithm the layout runs)."""
    from sim.network.analytical import OP_ALGORITHMS
    from sim.network.calibration import DEFAULT_PARAMS

    topology = build_cluster(node, nodes, fabric)
    layout = placement_of(topology, range(topology.num_gpus))
    sizes = [2**k for k in range(3, 31)]
    checked = 0
    for op, algorithms in OP_ALGORITHMS.items():
        for algo in algorithms:
            try:
                terms = [cost_terms(op, algo, layout, s, "simple") for s in sizes]
            except ValueError:  # not run on this layout
                continue
            if not terms[0].protocols:
                continue
            times = [t.time_s(DEFAULT_PARAMS[algo], s) for t, s in zip(terms, sizes, strict=True)]
            pairs = zip(sizes[1:], times[:-1], times[1:], strict=True)
            falls = [(s, a, b) for s, a, b in pairs if b < a]
            assert not falls, (op, algo, falls[:3])
            checked += 1
    assert checked >= 4
