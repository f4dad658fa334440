"""A transport's least time per network message (``FabricSpec.message_gap_s``) and the channels
a cloud's environment pins (``FabricSpec.channels``): GPUDirect-TCPX on GCP A3 High.

A multi-node Ring/Simple moves, in each of its n - 1 steps (all_reduce: 2(n - 1)), bus_bytes /
steps per channel, in messages of NCCL's step (4 MiB / 8 = 512 KiB); each takes at least the
gap, so the network part of the time is max(byte rate, steps x messages x gap).
"""

from __future__ import annotations

import dataclasses

import pytest
import simpy

from sim.network.comm_model import CommModel
from sim.network.nccl_graph import comm_channels
from topologies.fabrics import FABRIC_PRESETS, TCPX_MESSAGE_GAP_S
from topologies.presets import NODE_PRESETS, build_cluster, cluster_topology

MIB = 1 << 20
RANKS = tuple(range(16))


def _model(channels: int = 0) -> CommModel:
    if channels:
        fabric = dataclasses.replace(FABRIC_PRESETS["gcp-a3-high"], channels=channels)
        topology = cluster_topology(NODE_PRESETS["a3-high-h100"], 2, fabric)
    else:
        topology = build_cluster("a3-high-h100", 2)
    return CommModel(simpy.Environment(), topology)


def test_the_preset_pins_googles_twelve_channels():
    model = _model()
    assert comm_channels(model.layout(RANKS).hardware()) == 12
    assert comm_channels(_model(8).layout(RANKS).hardware()) == 8
    # a fabric that pins nothing keeps NCCL's own count
    ib = CommModel(simpy.Environment(), build_cluster("dgx-h100", 2, "ib-ndr"))
    assert comm_channels(ib.layout(RANKS).hardware()) == 16


def test_small_rings_pay_one_gap_per_step():
    model = _model()
    gap = TCPX_MESSAGE_GAP_S
    # 1 and 8 MiB: one message per channel and step (8 MiB / 16 ranks / 12 channels < 512 KiB)
    one, eight = (model.estimate_s("all_gather", RANKS, s * MIB) for s in (1, 8))
    assert one == pytest.approx(eight, rel=1e-12)
    # against the same fabric without the gap: its latency plus 15 gaps (the floor replaces
    # the bandwidth term)
    plain = dataclasses.replace(FABRIC_PRESETS["gcp-a3-high"], message_gap_s=0.0)
    free = CommModel(simpy.Environment(), cluster_topology(NODE_PRESETS["a3-high-h100"], 2, plain))
    _, params, terms = free._priced("all_gather", RANKS, MIB, None)
    latency = terms.latency_s(params, MIB)
    assert one - latency == pytest.approx(15 * gap, rel=1e-9)
    reduce = model.estimate_s("all_reduce", RANKS, MIB)
    assert reduce > 30 * gap  # twice the steps


def test_each_further_message_adds_a_gap_per_step():
    # 8 channels: 64 MiB is one 512 KiB message per channel and step, 128 MiB two, 256 MiB four
    model = _model(8)
    times = {s: model.estimate_s("all_gather", RANKS, s * MIB) for s in (64, 128, 256)}
    assert times[128] - times[64] == pytest.approx(15 * TCPX_MESSAGE_GAP_S, rel=1e-9)
    assert times[256] - times[128] == pytest.approx(30 * TCPX_MESSAGE_GAP_S, rel=1e-9)
    # the plateau is 8 channels x 512 KiB per gap, below the NICs' rate
    busbw = 256 * MIB * 15 / 16 / times[256]
    assert busbw == pytest.approx(8 * 512 * 1024 / TCPX_MESSAGE_GAP_S, rel=0.02)


def test_reduce_scatter_pays_one_gap_per_step_and_other_protocols_none():
    model = _model()
    one = model.estimate_s("reduce_scatter", RANKS, MIB)
    algo, _, terms = model._priced("reduce_scatter", RANKS, MIB, None)
    (simple,) = terms.protocols  # the preset: Ring and Simple only
    bandwidth = simple.bandwidth_s(terms.bandwidth_time_s, terms.bus_bytes, MIB)
    assert algo == "ring" and simple.gap_s(terms.bus_bytes, MIB) == 15 * TCPX_MESSAGE_GAP_S
    assert one >= 15 * TCPX_MESSAGE_GAP_S > bandwidth
    # LL, LL128 and Tree on the same transport get no gap (measured on Ring/Simple only)
    every = dataclasses.replace(FABRIC_PRESETS["gcp-a3-high"], protocols=(), algorithms=())
    free = CommModel(simpy.Environment(), cluster_topology(NODE_PRESETS["a3-high-h100"], 2, every))
    for algo in ("ring", "tree"):
        for proto in free._priced("all_reduce", RANKS, MIB, algo)[2].protocols:
            gapped = algo == "ring" and proto.name == "simple"
            assert (proto.gap_s(MIB, MIB) > 0) == gapped, (algo, proto.name)


def test_the_gap_is_time_not_bytes_under_the_flow_model():
    # two concurrent 1 MiB all_gathers on the flow model: the gap does not load the links, so
    # each takes what it takes alone (the bytes are a sliver of the NICs' rate)
    topology = build_cluster("a3-high-h100", 2)
    alone = CommModel(simpy.Environment(), topology).estimate_s("all_gather", RANKS, MIB)
    env = simpy.Environment()
    flow = CommModel(env, topology, fidelity="flow")
    env.run(env.all_of([flow.run("all_gather", RANKS, MIB) for _ in range(2)]))
    assert env.now == pytest.approx(alone, rel=0.02)


def test_no_gap_on_a_fabric_without_one_nor_within_a_node():
    ib = CommModel(simpy.Environment(), build_cluster("dgx-h100", 2, "ib-ndr"))
    terms = ib._priced("all_gather", RANKS, MIB, "ring")[2]
    assert all(p.message_gap_s == 0 and p.gap_s(MIB, MIB) == 0 for p in terms.protocols)
    node = CommModel(simpy.Environment(), build_cluster("a3-high-h100", 1))
    terms = node._priced("all_gather", tuple(range(8)), MIB, "ring")[2]
    assert all(p.gap_s(MIB, MIB) == 0 for p in terms.protocols)


def test_points_the_gap_sets_are_left_out_of_calibration_fits():
    # A3 High's small sizes are gap-bound: they carry nothing of the latencies and efficiency
    # a calibration fits, so make_samples drops them (the 512 MiB plateau of 8 channels stays
    # gap-bound too; the 12-channel all_reduce plateau is NIC-bound and kept)
    from refdata import COLLECTIVES_DIR
    from sim.network.fitting import gap_bound, make_samples
    from sim.validation.collectives import load_clusters

    (a3,) = [c for c in load_clusters(COLLECTIVES_DIR) if c.name == "gcp-a3-h100"]
    kept = [s for records, factory in a3.groups() for s in make_samples(records, factory)]
    assert kept and not any(gap_bound(s.terms, s.record.size_bytes) for s in kept)
    assert len(kept) < len(a3.records())
    sizes = {s.record.size_bytes for s in kept if s.record.op == "all_reduce"}
    assert 8 << 30 in sizes and 1 << 20 not in sizes
