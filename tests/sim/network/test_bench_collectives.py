"""Speed of the network model (pytest-benchmark; skipped by default, run with --benchmark-only)."""

from __future__ import annotations

import pytest
import simpy

from sim.network.comm_model import CommModel
from topologies.presets import build_cluster
from vocab.collectives import get


@pytest.fixture(scope="module")
def cluster_1024():
    return build_cluster("dgx-h100", 128, "ib-ndr")


def _flow(topology, op, num_ranks, size, algo):
    env = simpy.Environment()
    model = CommModel(env, topology, fidelity="flow")
    env.run(model.run(op, range(num_ranks), size, algo=algo))
    return env.now


def test_bench_flow_ring_all_reduce_1024_gpus(benchmark, cluster_1024):
    assert benchmark(_flow, cluster_1024, "all_reduce", 1024, 1 << 30, "ring") > 0


def test_bench_flow_all_to_all_128_gpus(benchmark):
    topology = build_cluster("dgx-h100", 16, "ib-ndr")
    assert benchmark(_flow, topology, "all_to_all", 128, 1 << 30, "direct") > 0


def test_bench_analytical_24_size_sweep_1024_gpus(benchmark, cluster_1024):
    def sweep() -> float:
        model = CommModel(simpy.Environment(), cluster_1024)
        ranks = range(1024)
        total = 0.0
        for k in range(10, 34):
            size = get("all_reduce").counts(1 << k, 4, 1024).size_bytes
            total += model.estimate_s("all_reduce", ranks, size)
        return total

    assert benchmark(sweep) > 0
