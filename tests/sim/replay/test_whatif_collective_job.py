"""A second job given as its own collectives: an op of a size over its servers every period,
turned into a share of their NICs and bursts (``sim.replay.whatif.collective_jobs``)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import simpy

from schedules.whatif import COLLECTIVE_JOB_SHARE, parse_flags, parse_whatif
from sim.network.comm_model import CommModel
from sim.replay.simulate import plan_topology, simulate_plan
from sim.replay.whatif import collective_jobs

from .test_whatif import _plan, _with

GIB = 1 << 30


def _alone_s(plan, op: str, nodes: int, size: int) -> float:
    """One collective over every GPU of servers 0..nodes-1, alone on the plan's network."""
    topology = plan_topology(plan)
    ranks = list(range(nodes * topology.gpus_per_node))
    return CommModel(simpy.Environment(), topology).estimate_s(op, ranks, size)


def test_a_second_job_runs_any_collective_of_the_vocabulary_but_send_recv() -> None:
    from schedules.whatif import COLLECTIVE_JOB_OPS
    from vocab.collectives import OPS

    assert set(COLLECTIVE_JOB_OPS) == set(OPS) - {"send_recv"}


def test_a_collective_job_reads_alike_from_the_plan_and_the_flags() -> None:
    section = parse_whatif(
        {"second_job": [{"nodes": [0, 1, 2, 3], "op": "allreduce", "size_mib": 512,
                         "period_ms": 200, "offset_ms": 50}]}
    )  # fmt: skip
    flags = parse_flags(["second_job=0-3:all_reduce:512:200:50"])
    assert section == flags
    (job,) = section.second_job
    assert (job.op, job.size_bytes, job.period_s, job.offset_s) == (
        "all_reduce",
        1 << 29,
        0.2,
        0.05,
    )
    assert job.share == COLLECTIVE_JOB_SHARE == 0.5
    assert parse_whatif(section.to_dict()) == section
    assert section.describe() == [
        "a second job runs all_reduce of 512 MiB over server(s) 0-3 every 200 ms from 50 ms, "
        "at 50% of their NICs while it runs"
    ]


def test_its_busy_part_is_its_collective_at_half_the_nics() -> None:
    """busy = (time alone) / share / period; the step is the one the same share and bursts
    given by hand give, and the report says both."""
    plan = _plan(4, tp=8, pp=1, global_batch=32)
    alone = _alone_s(plan, "all_reduce", 4, GIB)
    period_ms = 40 * alone * 1e3
    job = _with(plan, f"second_job=0-3:all_reduce:1024:{period_ms!r}")
    resolved = collective_jobs(job.whatif, plan_topology(plan), _estimate(plan))
    (entry,) = resolved.second_job
    assert entry.collective_s == pytest.approx(alone, rel=1e-12)
    assert entry.busy == pytest.approx(alone / 0.5 / (period_ms / 1e3), rel=1e-12)
    assert entry.busy == pytest.approx(0.05)
    by_hand = parse_whatif(
        {"second_job": [{"nodes": [0, 1, 2, 3], "share": 0.5, "period_ms": period_ms,
                         "busy": entry.busy}]}
    )  # fmt: skip
    result = simulate_plan(job)
    assert (
        result.step_time_s == simulate_plan(dataclasses.replace(plan, whatif=by_hand)).step_time_s
    )
    (change,) = result.extra["whatif"]["changes"]
    assert change.endswith(": 50% of their NICs for 5% of the time")
    (bursts,) = result.extra["whatif"]["second_job_as_bursts"]
    assert bursts == {"nodes": [0, 1, 2, 3], "op": "all_reduce", "share": 0.5,
                      "busy": entry.busy, "collective_ms": alone * 1e3}  # fmt: skip


def _estimate(plan):
    return CommModel(simpy.Environment(), plan_topology(plan)).estimate_s


def test_a_collective_longer_than_half_its_period_holds_the_nics_throughout() -> None:
    plan = _plan(4, tp=8, pp=1, global_batch=32)
    alone = _alone_s(plan, "all_gather", 4, GIB)
    busy = _with(plan, f"second_job=0-3:all_gather:1024:{1.5 * alone * 1e3!r}")
    (entry,) = collective_jobs(busy.whatif, plan_topology(plan), _estimate(plan)).second_job
    assert entry.busy == 1.0 and not entry.bursty
    steady = simulate_plan(_with(plan, "second_job=0-3:0.5")).step_time_s
    assert simulate_plan(busy).step_time_s == steady


def test_bigger_or_more_frequent_collectives_never_speed_the_step() -> None:
    """DP all-reduces across 16 servers: no job, then 64 MiB and 1 GiB every 100 ms, then 1 GiB
    every 10 ms, then the job holding half the NICs throughout."""
    plan = _plan(16, tp=8, pp=1, global_batch=64)
    free = simulate_plan(plan).step_time_s
    steps = [
        simulate_plan(_with(plan, flag)).step_time_s
        for flag in (
            "second_job=0-15:all_reduce:64:100",
            "second_job=0-15:all_reduce:1024:100",
            "second_job=0-15:all_reduce:1024:10",
            "second_job=0-15:0.5",
        )
    ]
    assert free <= steps[0] <= steps[1] <= steps[2] <= steps[3]
    assert free < steps[3]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"nodes": [3], "op": "all_reduce", "size_mib": 1, "period_ms": 10},
         "a collective over server 3 alone never leaves it"),
        ({"nodes": [0, 1], "op": "send_recv", "size_mib": 1, "period_ms": 10},
         ".op must be a collective over the servers' GPUs (all_reduce, all_gather, "
         "reduce_scatter, all_to_all, broadcast, reduce), got 'send_recv'"),
        ({"nodes": [0, 1], "op": "all_reduce", "size_mib": -1, "period_ms": 10},
         ".size_mib must be in (0, 1.07374e+09] (1 PiB), got -1"),
        ({"nodes": [0, 1], "op": "all_reduce", "size_mib": 1e308, "period_ms": 10},
         ".size_mib must be in (0, 1.07374e+09] (1 PiB), got 1e+308"),
        ({"nodes": [0, 1], "op": "all_reduce", "size_mib": "1M", "period_ms": 10},
         ".size_mib must be a finite number, got '1M'"),
        ({"nodes": [0, 1], "op": "all_reduce", "size_mib": 1}, "missing key period_ms"),
        ({"nodes": [0, 1], "op": "all_reduce", "size_mib": 1, "period_ms": 10, "busy": 0.5},
         "unknown key 'busy'"),
    ],
)  # fmt: skip
def test_a_bad_collective_job_names_the_key_and_value(raw, message) -> None:
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        parse_whatif({"second_job": [raw]})


def _rail_cluster():
    """Two DGX H100 on rail switches: NIC c of either server reaches NIC c of the other through
    rail leaf c alone (47 GB/s links), so rails never share a link."""
    from topologies.config import cluster_from_mapping

    fabric = {"base": "ib-ndr", "radix": 16, "rail_optimized": True}
    return cluster_from_mapping({"node": "dgx-h100", "num_nodes": 2, "fabric": fabric}, where="t")


def _send_with_jobs(topology, size: int, jobs) -> tuple[float, list]:
    """GPU 0 -> GPU 8 under the flow model, with ``jobs`` running flow by flow beside it: when
    it ends, and each job's (start, end) runs."""
    from sim.replay.flowing_jobs import start_flowing_jobs

    env = simpy.Environment()
    comm = CommModel(env, topology, fidelity="flow")
    end: list[float] = []

    def send():
        yield comm.run("send_recv", (0, 8), size)
        end.append(env.now)

    sent = env.process(send())
    runs = start_flowing_jobs(env, comm, jobs, stop=sent)
    env.run()
    return end[0], runs


def test_a_second_job_flow_by_flow_shares_the_nic_links_max_min() -> None:
    """A second job's 8 GiB all-gather over both servers runs as NCCL's tuner picks (a ring:
    one channel per rail, each carrying b = 15/16 x 8 GiB / 8, times the Simple protocol's
    start-up 1 + 512 KiB / 8 GiB), on the NICs and rail switches only, at R = 47 GB/s alone.
    Started at 1 ms, once this job's 16 GiB send from GPU 0 is moving on rail 0, the two share
    rail 0 (R/2 each) until the job's channel there ends: the job takes its latency + 2b/R, and
    the send ends b/R later than alone. Two such jobs together each take latency + 2b/R."""
    from schedules.whatif import SecondJob
    from sim.replay.flowing_jobs import job_flows

    topology = _rail_cluster()
    rate = topology.graph.edges["n0/nic0", "leaf0"]["effective_bandwidth_bytes_per_s"]
    assert rate == 47e9
    job = SecondJob(
        nodes=(0, 1), share=COLLECTIVE_JOB_SHARE, period_s=10.0, offset_s=1e-3,
        op="all_gather", size_bytes=8 * GIB, flow_by_flow=True,
    )  # fmt: skip
    comm = CommModel(simpy.Environment(), topology, fidelity="flow")
    latency, inside_s, transfers = job_flows(job, comm)
    per_rail = 15 / 16 * 8 * GIB / 8 * (1 + 512 * 1024 / (8 * GIB))
    assert [size for _, size, _ in transfers] == pytest.approx([per_rail] * 8, rel=1e-12)
    assert all(len(paths) == 2 for paths, _, _ in transfers)  # each rail, both ways
    assert inside_s == 0.0 and all(cap > rate for _, _, cap in transfers)  # NVLink is faster
    alone, _ = _send_with_jobs(topology, 16 * GIB, [])
    shared, ((run,),) = _send_with_jobs(topology, 16 * GIB, [job])
    assert run[0] == pytest.approx(1e-3, rel=1e-12)
    assert run[1] - run[0] == pytest.approx(latency + 2 * per_rail / rate, rel=1e-9)
    assert shared - alone == pytest.approx(per_rail / rate, rel=1e-9)
    at_once = dataclasses.replace(job, offset_s=0.0)
    _, runs = _send_with_jobs(topology, 0, [at_once, at_once])
    assert [r[0][1] - r[0][0] for r in runs] == pytest.approx([latency + 2 * per_rail / rate] * 2)


def test_under_the_flow_model_a_collective_job_runs_its_own_flows_in_the_step() -> None:
    """A plan on two servers with a second job's all-reduce every 20 ms: under the flow model
    its collectives run flow by flow (recorded, one per period at most), the step grows, and the
    report says so; under the analytical model it stays a share and bursts."""
    plan = _with(_plan(2, tp=8, pp=1, global_batch=16), "second_job=0-1:all_reduce:1024:20")
    topology = _rail_cluster()
    base = simulate_plan(_with(plan), topology=topology, fidelity="flow")
    flowing = simulate_plan(plan, topology=topology, fidelity="flow")
    assert flowing.step_time_s > base.step_time_s
    info = flowing.extra["whatif"]
    (job,) = info["second_job_flows"]
    runs = job["runs_ms"]
    assert runs and "second_job_as_bursts" not in info
    starts = [a for a, _ in runs]
    assert starts[0] == 0.0
    assert all(b - a >= 20.0 - 1e-9 for a, b in itertools.pairwise(starts))
    assert all(b > a for a, b in runs) and runs[-1][0] < flowing.step_time_s * 1e3
    assert "flow by flow" in info["changes"][0]
    analytical = simulate_plan(plan, topology=topology)
    assert "second_job_as_bursts" in analytical.extra["whatif"]


@pytest.mark.parametrize(
    ("node", "fabric", "nodes", "op", "size"),
    [("dgx-h100", "ib-ndr", 2, "all_reduce", GIB), ("dgx-h100", "ib-ndr", 2, "all_reduce", 1 << 20),
     ("p5-h100", "efa-p5", 2, "all_reduce", GIB), ("dgx-a100", "ib-hdr", 2, "all_to_all", 1 << 28),
     ("dgx-h100", "ib-ndr", 4, "broadcast", 1 << 26)],
)  # fmt: skip
def test_a_job_alone_takes_as_long_as_its_whole_collective(node, fabric, nodes, op, size) -> None:
    """Kept to the NIC and fabric links, a job's collective still lasts as long alone as the
    flow model's whole collective: its groups inside the servers (NVLSTree's NVLink phases, a
    tree's chains) set a floor and cap the rate of the groups that cross servers."""
    from schedules.whatif import SecondJob
    from sim.replay.flowing_jobs import start_flowing_jobs
    from topologies.presets import build_cluster

    topology = build_cluster(node, nodes, fabric)
    ranks = list(range(topology.num_gpus))
    env = simpy.Environment()
    env.run(CommModel(env, topology, fidelity="flow").run(op, ranks, size))
    whole = env.now
    env = simpy.Environment()
    stop = env.event()

    def step():
        yield env.timeout(1.0)
        stop.succeed()

    env.process(step())
    job = SecondJob(
        nodes=tuple(range(nodes)), share=COLLECTIVE_JOB_SHARE, period_s=10.0, op=op,
        size_bytes=size, flow_by_flow=True,
    )  # fmt: skip
    (runs,) = start_flowing_jobs(env, CommModel(env, topology, fidelity="flow"), [job], stop)
    env.run()
    ((start, end),) = runs
    assert end - start == pytest.approx(whole, rel=1e-9)


def test_a_flowing_job_needs_a_period_of_a_millisecond() -> None:
    plan = _with(_plan(2, tp=8, pp=1, global_batch=16), "second_job=0-1:all_reduce:64:0.5")
    with pytest.raises(ValueError, match=r"period_ms 0\.5: under the flow model"):
        simulate_plan(plan, topology=_rail_cluster(), fidelity="flow")
