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
    latency = model._priced("all_gather", RANKS, MIB, None)[2].latency_s(
        model.params("all_gather", "ring", model.layout(RANKS)), MIB
    )
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


def test_no_gap_on_a_fabric_without_one_nor_within_a_node():
    ib = CommModel(simpy.Environment(), build_cluster("dgx-h100", 2, "ib-ndr"))
    terms = ib._priced("all_gather", RANKS, MIB, "ring")[2]
    assert all(p.message_gap_s == 0 and p.gap_s(MIB, MIB) == 0 for p in terms.protocols)
    node = CommModel(simpy.Environment(), build_cluster("a3-high-h100", 1))
    terms = node._priced("all_gather", tuple(range(8)), MIB, "ring")[2]
    assert all(p.gap_s(MIB, MIB) == 0 for p in terms.protocols)


def test_tcpxo_adds_its_step_latency_once_per_network_crossing_of_a_ring():
    # a 2-node ring all_gather crosses the network once per chunk (NCCL: nNodes - 1 inter
    # steps), so its floor rises by exactly one step latency over a transport without one
    from topologies.fabrics import TCPXO_STEP_LATENCY_S

    mega = FABRIC_PRESETS["gcp-a3-mega"]
    node = NODE_PRESETS["a3-mega-h100"]
    times = []
    for fabric in (mega, dataclasses.replace(mega, step_latency_s=0.0)):
        model = CommModel(simpy.Environment(), cluster_topology(node, 2, fabric))
        assert model.choice("all_gather", RANKS, 4096, "ring") == ("ring", "ll")
        times.append(model.estimate_s("all_gather", RANKS, 4096, algo="ring"))
    path_s = 2.7e-6  # the network hop's latency, which the topology's path already holds
    assert times[0] - times[1] == pytest.approx(TCPXO_STEP_LATENCY_S - path_s, rel=1e-9)
