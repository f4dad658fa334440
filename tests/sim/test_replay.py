"""Replayed schedules against hand-computed timelines and closed forms (fake networks)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import simpy

from schedules.fsdp_program import FsdpRank, fsdp_program
from schedules.pipeline import pipeline_orders
from schedules.program import ChunkWork, ComputeStep, Program
from schedules.step_program import (
    GradSync,
    PipelineRank,
    pipeline_program,
)
from sim.engine import Engine, Timeline
from sim.plan_sim import breakdown_of
from tests.sim.test_engine import UnitComm


class ZeroComm:
    """Communication that takes no time."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env

    def run(self, op: str, ranks: Sequence[int], size_bytes: float) -> simpy.Event:
        return self.env.timeout(0.0)


def work(forward_s: float, backward_s: float, *, split: float = 0.0, buckets=(1.0,)) -> ChunkWork:
    """One chunk's recipe; ``split`` is the W share of the backward for zero-bubble passes."""
    return ChunkWork(
        forward=(ComputeStep(name="fwd", duration_s=forward_s),),
        backward=(ComputeStep(name="bwd", duration_s=backward_s),),
        backward_input=(ComputeStep(name="bwd", duration_s=backward_s - split),),
        backward_weight=(ComputeStep(name="wgrad", duration_s=split),),
        grad_buckets_bytes=tuple(buckets),
    )


def pipeline(schedule: str, p: int, m: int, chunk: ChunkWork, *, v: int = 1) -> list[Program]:
    orders = pipeline_orders(schedule, p, m, v)
    return [
        pipeline_program(
            PipelineRank(
                rank=r,
                order=orders[r],
                chunks=(chunk,) * v,
                stage=r,
                pp=p,
                prev_rank=(r - 1) % p,
                next_rank=(r + 1) % p,
                blocking_p2p=schedule != "interleaved",
            )
        )
        for r in range(p)
    ]


def run(programs: list[Program], comm_cls: type = ZeroComm) -> Timeline:
    env = simpy.Environment()
    return Engine(env, comm_cls(env), programs).run()


def passes(timeline: Timeline, rank: int) -> list[tuple[str, float, float]]:
    return [
        (s.name.split()[0], s.start_s, s.end_s)
        for s in timeline.spans
        if s.rank == rank and s.kind == "compute"
    ]


def test_1f1b_p2_m3_exact_timeline() -> None:
    timeline = run(pipeline("1f1b", 2, 3, work(1.0, 2.0)))
    assert passes(timeline, 0) == [
        ("F0", 0.0, 1.0), ("F1", 1.0, 2.0), ("B0", 4.0, 6.0),
        ("F2", 6.0, 7.0), ("B1", 7.0, 9.0), ("B2", 10.0, 12.0),
    ]  # fmt: skip
    assert passes(timeline, 1) == [
        ("F0", 1.0, 2.0), ("B0", 2.0, 4.0), ("F1", 4.0, 5.0),
        ("B1", 5.0, 7.0), ("F2", 7.0, 8.0), ("B2", 8.0, 10.0),
    ]  # fmt: skip
    assert timeline.step_time_s == 12.0


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("p", "m"), [(2, 3), (4, 8), (3, 7), (4, 2)])
def test_bubble_fraction_with_uniform_costs(schedule: str, p: int, m: int) -> None:
    timeline = run(pipeline(schedule, p, m, work(1.0, 2.0)))
    assert timeline.step_time_s == (m + p - 1) * 3.0
    for rank, times in timeline.ranks.items():
        assert times.compute_s == m * 3.0
        bubble_s = breakdown_of(timeline, rank).bubble_s
        assert bubble_s / timeline.step_time_s == pytest.approx((p - 1) / (m + p - 1))


def test_zb_h1_p2_fills_the_bubble_with_the_deferred_weight_pass() -> None:
    # F = Bi = W = 1: rank 1 sends its input gradient after Bi, so rank 0's B starts 1 earlier
    chunk = work(1.0, 2.0, split=1.0)
    timeline = run(pipeline("zb-h1", 2, 4, chunk))
    assert [name for name, _, _ in passes(timeline, 1)] == [
        "F0", "Bi0", "F1", "Bi1", "W0", "F2", "Bi2", "W1", "F3", "Bi3", "W2", "W3",
    ]  # fmt: skip
    assert passes(timeline, 0)[2] == ("B0", 3.0, 5.0)
    assert timeline.step_time_s == 4 * 3.0 + 1 * 2.0  # the paper's m(F+B) + (p-1)(F+B-W)
    assert run(pipeline("1f1b", 2, 4, chunk)).step_time_s == 15.0


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 12), (3, 5)])
def test_zb_h1_beats_1f1b_with_blocking_p2p(p: int, m: int) -> None:
    chunk = work(1.0, 2.0, split=1.0)
    zb = run(pipeline("zb-h1", p, m, chunk))
    assert zb.step_time_s < run(pipeline("1f1b", p, m, chunk)).step_time_s == (m + p - 1) * 3.0
    assert all(times.compute_s == m * 3.0 for times in zb.ranks.values())


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 4, 3)])
def test_interleaving_shrinks_the_bubble_by_v(p: int, m: int, v: int) -> None:
    # each chunk holds 1/v of the stage: bubble (p - 1)(F + B) / v
    timeline = run(pipeline("interleaved", p, m, work(1.0 / v, 2.0 / v), v=v))
    assert timeline.step_time_s == pytest.approx(m * 3.0 + (p - 1) * 3.0 / v)


def test_ddp_buckets_fire_in_ready_order_on_the_last_microbatch_only() -> None:
    spec = PipelineRank(
        rank=0,
        order=pipeline_orders("1f1b", 1, 2)[0],
        chunks=(work(1.0, 3.0, buckets=(1.0, 1.0, 1.0)),),
        groups={"dp": (0, 1)},
        sync=GradSync(op="all_reduce"),
    )
    timeline = run([pipeline_program(spec)], UnitComm)
    log = [(s.name, s.start_s, s.end_s) for s in timeline.spans if s.kind != "wait"]
    assert log == [
        ("F0 fwd", 0.0, 1.0),
        ("B0 bwd", 1.0, 4.0),
        ("F1 fwd", 4.0, 5.0),
        ("B1 bwd", 5.0, 6.0),
        ("B1 bwd", 6.0, 7.0),
        ("all_reduce c0 bucket 0", 6.0, 7.0),
        ("B1 bwd", 7.0, 8.0),
        ("all_reduce c0 bucket 1", 7.0, 8.0),
        ("all_reduce c0 bucket 2", 8.0, 9.0),
        ("optimizer", 9.0, 9.0),
    ]
    assert timeline.ranks[0].exposed_comm_s == {"dp": 1.0}


def test_zero2_blocks_on_each_bucket_every_microbatch() -> None:
    spec = PipelineRank(
        rank=0,
        order=pipeline_orders("1f1b", 1, 2)[0],
        chunks=(work(1.0, 2.0, buckets=(1.0, 1.0)),),
        groups={"dp": (0, 1)},
        sync=GradSync(op="all_reduce", every_microbatch=True, blocking=True),
    )
    timeline = run([pipeline_program(spec)], UnitComm)
    # per micro-batch: F 1 + B 2 + two blocking 1 s all-reduces = 5 s
    assert timeline.step_time_s == 10.0
    assert timeline.ranks[0].exposed_comm_s == {"dp": 4.0}


def test_fsdp_collectives_run_in_fifo_order_and_overlap_compute() -> None:
    spec = FsdpRank(
        rank=0,
        num_microbatches=1,
        num_units=3,
        layer=work(2.0, 4.0),
        unit_param_bytes=1.0,
        unit_grad_bytes=1.0,
        groups={"dp": (0, 1)},
    )
    timeline = run([fsdp_program(spec)], UnitComm)
    dp = [(s.name, s.start_s, s.end_s) for s in timeline.spans if s.stream == "dp"]
    assert [name for name, _, _ in dp] == [
        "AG u0 mb0", "AG u1 mb0", "AG u2 mb0",
        "AG u2 mb0 bwd", "AG u1 mb0 bwd", "RS u2 mb0", "AG u0 mb0 bwd", "RS u1 mb0", "RS u0 mb0",
    ]  # fmt: skip
    starts = [start for _, start, _ in dp]
    assert starts == sorted(starts)
    compute = passes(timeline, 0)
    # AG(u0) is exposed (1 s); AG(u1), AG(u2) hide behind F(u0), F(u1)
    assert compute[:3] == [("F0", 1.0, 3.0), ("F0", 3.0, 5.0), ("F0", 5.0, 7.0)]
    # AG(u2) waits F(u0) (limiter); backward AG(u2) 5-6, AG(u1) 6-7 hide under F(u2) 5-7;
    # RS(u2) 11-12 and AG(u0) 12-13 under B(u1) 11-15; RS(u1) 15-16, RS(u0) 19-20 exposed
    assert compute[3:] == [("B0", 7.0, 11.0), ("B0", 11.0, 15.0), ("B0", 15.0, 19.0)]
    assert [(s, e) for name, s, e in dp if name.startswith("AG u2")] == [(3.0, 4.0), (5.0, 6.0)]
    assert timeline.step_time_s == 20.0


def test_replay_is_deterministic() -> None:
    first = run(pipeline("interleaved", 4, 8, work(0.3, 0.7), v=2), UnitComm)
    second = run(pipeline("interleaved", 4, 8, work(0.3, 0.7), v=2), UnitComm)
    assert first == second
