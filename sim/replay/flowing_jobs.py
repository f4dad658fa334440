"""A second job given as its own collectives, run flow by flow under the flow model.

Each of its collectives over every GPU of its servers enters the flow network as the flow
model would run it (``CommModel.transfers``), kept to the NIC and fabric links, at its offset
and then at the first period boundary after the last one ended, sharing every link max-min with
this job's flows until this job's step ends (``docs/whatif.md``).

    runs = start_flowing_jobs(env, comm, jobs, stop=finished)
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from typing import Any

import simpy

from schedules.whatif import SecondJob
from sim.network.comm_model import CommModel
from sim.network.flow import Edge, FlowNetwork
from sim.replay.whatif import check_flow_period

JobFlows = list[tuple[tuple[tuple[Edge, ...], ...], float, float]]
"""A second job's flow groups on the network: (paths, bytes, the rate its links inside its
servers allow)."""


def job_flows(job: SecondJob, comm: CommModel) -> tuple[float, float, JobFlows]:
    """One of a second job's collectives over every GPU of its servers as the flow model would
    run it (``CommModel.transfers``: the algorithm NCCL's tuner picks, its flow groups and
    bytes, its latency): (latency, the seconds its flow groups inside its servers take alone,
    its groups on the NIC and fabric links). The job's traffic inside its servers is its own:
    groups with no network link only set how long the collective lasts at least (an NVLSTree's
    NVLink phases), and the others are capped at the rate their links inside the servers give
    them, so alone it takes as long as the whole collective."""
    topology = comm.topology
    ranks = [r for r in range(topology.num_gpus) if topology.node_index(r) in job.nodes]
    assert job.op is not None
    latency_s, transfers = comm.transfers(job.op, ranks, job.size_bytes)
    edges = topology.graph.edges
    kept: JobFlows = []
    inside_s = 0.0
    for paths, size in transfers:
        inside: dict[Edge, int] = {}
        network = []
        for path in paths:
            own = tuple(e for e in path if edges[e]["kind"] == "network")
            for e in path:
                if edges[e]["kind"] != "network":
                    inside[e] = inside.get(e, 0) + 1
            if own:
                network.append(own)
        cap = min(
            (edges[e]["effective_bandwidth_bytes_per_s"] / n for e, n in inside.items()),
            default=math.inf,
        )
        if network:
            kept.append((tuple(network), size, cap))
        elif math.isfinite(cap):
            inside_s = max(inside_s, size / cap)
    return latency_s, inside_s, kept


def start_flowing_jobs(
    env: simpy.Environment,
    comm: CommModel,
    jobs: Sequence[SecondJob],
    stop: simpy.Event,
) -> list[list[tuple[float, float]]]:
    """Under the flow model: run each second job's collectives on ``comm``'s network beside
    this job's flows (``job_flows``), from its offset and then at the first period boundary
    after the last one ended (a job does not run two at once), until ``stop`` (this job's step
    is over; one collective under way then runs to its end). Returns, per job, the (start, end)
    seconds of each collective as they happen."""
    assert comm.network is not None
    runs: list[list[tuple[float, float]]] = []
    for job in jobs:
        check_flow_period(
            job, "under the flow model its collectives run flow by flow, so they need"
        )
        done: list[tuple[float, float]] = []
        runs.append(done)
        env.process(_flowing(env, comm.network, job, job_flows(job, comm), done, stop))
    return runs


def _flowing(
    env: simpy.Environment,
    network: FlowNetwork,
    job: SecondJob,
    flows: tuple[float, float, JobFlows],
    done: list[tuple[float, float]],
    stop: simpy.Event,
) -> Generator[simpy.Event, Any, None]:
    assert job.period_s is not None
    latency_s, inside_s, transfers = flows
    start = job.offset_s
    while not stop.triggered:
        if start > env.now:
            yield env.timeout(start - env.now) | stop
            if stop.triggered:
                return
        began = env.now
        events = [
            network.transfer(p, size, latency_s=latency_s, max_rate_bytes_per_s=cap)
            for p, size, cap in transfers
        ]
        yield env.all_of([*events, env.timeout(latency_s + inside_s)])
        done.append((began, env.now))
        start = job.offset_s + math.ceil((env.now - job.offset_s) / job.period_s) * job.period_s
        if start <= began:
            start = began + job.period_s
