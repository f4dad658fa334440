"""The CommModel contract: events, estimates, contention between collectives, errors."""

from __future__ import annotations

import pytest
import simpy

from sim.network.comm_model import CommModel
from tests.sim.helpers import IDEAL, calibration_with
from topologies.config import load_cluster
from topologies.presets import build_cluster


def _one_gpu_servers(oversubscription: float):
    return load_cluster({
        "node": {"base": "dgx-h100", "num_gpus": 1, "nics_per_node": 1}, "num_nodes": 4,
        "fabric": {"base": "ib-ndr", "radix": 4, "rail_optimized": False, "tiers": 2},
        "oversubscription": oversubscription,
    })  # fmt: skip


def test_analytical_run_takes_the_estimate():
    env = simpy.Environment()
    model = CommModel(env, build_cluster("dgx-h100"))
    estimate = model.estimate_s("all_gather", range(8), 1 << 28)
    env.run(model.run("all_gather", range(8), 1 << 28))
    assert env.now == estimate > 0


def test_two_groups_crossing_the_same_spine_link_share_it():
    # Servers 0,1 on leaf 0 and 2,3 on leaf 1; at 2:1 the leaves have one spine link each.
    topology = _one_gpu_servers(2.0)
    calibration = calibration_with(IDEAL, "send_recv/direct/inter")
    alone_env = simpy.Environment()
    alone = CommModel(alone_env, topology, fidelity="flow", calibration=calibration)
    alone_env.run(alone.run("send_recv", (0, 2), 1e9))
    env = simpy.Environment()
    model = CommModel(env, topology, fidelity="flow", calibration=calibration)
    first, second = model.run("send_recv", (0, 2), 1e9), model.run("send_recv", (1, 3), 1e9)
    env.run(env.all_of([first, second]))
    latency = model.layout((0, 2)).inter_hop_latency_s
    assert alone_env.now - latency == pytest.approx(1e9 / 47e9, rel=1e-9)
    assert env.now - latency == pytest.approx(2 * 1e9 / 47e9, rel=1e-9)
    # The analytical model does not see the other group.
    assert model.estimate_s("send_recv", (0, 2), 1e9) == pytest.approx(alone_env.now)


def test_collectives_in_different_nodes_do_not_contend():
    topology = build_cluster("dgx-h100", 2, "ib-ndr")
    env = simpy.Environment()
    model = CommModel(env, topology, fidelity="flow")
    events = [
        model.run("all_reduce", range(8), 1 << 30),
        model.run("all_reduce", range(8, 16), 1 << 30),
    ]
    env.run(env.all_of(events))
    assert env.now == pytest.approx(model.estimate_s("all_reduce", range(8), 1 << 30), rel=1e-9)


def test_flow_runs_repeat_bit_for_bit():
    topology = build_cluster("dgx-h100", 4, "ib-ndr", oversubscription=2.0)

    def once() -> list[float]:
        env = simpy.Environment()
        model = CommModel(env, topology, fidelity="flow")
        ends: list[float] = []
        for ranks in (range(0, 32, 2), range(1, 32, 2)):
            event = model.run("all_to_all", ranks, 1 << 26)
            event.callbacks.append(lambda _e, env=env: ends.append(env.now))
        env.run()
        return ends

    assert once() == once()


def test_forced_algorithm_and_auto():
    model = CommModel(simpy.Environment(), build_cluster("dgx-h100"), algo="ring")
    assert model.algorithm("all_reduce", range(8), 8 << 30) == "ring"
    assert model.algorithm("all_reduce", range(8), 8 << 30, "auto") == "nvls"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.run("send_recv", (0,), 1.0), "send_recv takes"),
        (lambda m: m.run("broadcast", range(4), 1.0, root=4), "root 4 out of range"),
        (lambda m: m.run("all_reduce", range(8), 1.0, algo="nvls"), "NVLink SHARP"),
        (lambda m: m.run("all_reduce", range(8), 1.0, algo="magic"), "unknown algorithm"),
        (lambda m: m.run("all_reduce", (0, 0), 1.0), "distinct"),
        (lambda m: m.run("bogus", (0, 1), 1.0), "unknown op"),
    ],
)
def test_bad_calls_raise_value_errors_naming_the_problem(call, message):
    model = CommModel(simpy.Environment(), build_cluster("dgx-a100"), fidelity="flow")
    with pytest.raises(ValueError, match=message):
        call(model)


def test_unknown_fidelity_is_rejected():
    with pytest.raises(ValueError, match="fidelity"):
        CommModel(simpy.Environment(), build_cluster("dgx-a100"), fidelity="packet")


def test_send_recv_on_many_ranks_is_nccl_tests_ring_shift():
    # Every rank sends S to the next at once: each GPU's NVLink carries S, as one send alone.
    model = CommModel(simpy.Environment(), build_cluster("dgx-h100"), fidelity="flow")
    model.env.run(model.run("send_recv", range(8), 1 << 30))
    assert model.env.now == pytest.approx(model.estimate_s("send_recv", (0, 1), 1 << 30), rel=1e-9)
