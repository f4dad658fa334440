"""Replayed schedules against hand-computed timelines and closed forms (fake networks)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import simpy

from schedules.actions import ChunkWork, ComputeStep, Program
from schedules.fsdp_program import FsdpRank, FsdpStages, FsdpUnits, fsdp_program
from schedules.grad_sync import GradSync
from schedules.pipeline_program import PipelineRank, pipeline_program
from schedules.pipeline_schedules import pipeline_orders
from sim.replay.engine import Engine, Timeline
from sim.replay.simulate import breakdown_of
from tests.sim.replay.test_engine import UnitComm


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


def test_scatter_gather_p2p_sends_a_tp_shard_and_all_gathers_it_on_the_receiver() -> None:
    # tp = 2, pp = 2, m = 1, p2p 4 bytes (1 byte = 1 s): each transfer moves 4 / 2 = 2 bytes,
    # the receiver then all-gathers the 4-byte activation over its TP group before the pass.
    # rank 0: F0 [0, 1], send F0 [1, 3]; rank 2: AG [3, 7], F0 [7, 8], B0 [8, 10];
    # send B0 [10, 12], rank 0: AG [12, 16], B0 [16, 18]
    orders = pipeline_orders("1f1b", 2, 1, 1)
    programs = [
        pipeline_program(
            PipelineRank(
                rank=2 * r, order=orders[r], chunks=(work(1.0, 2.0),), stage=r, pp=2,
                prev_rank=2 * (1 - r), next_rank=2 * (1 - r), p2p_bytes=4.0,
                groups={"tp": (2 * r, 2 * r + 1)}, scatter_gather_p2p=True,
            )
        )
        for r in range(2)
    ]  # fmt: skip
    timeline = run(programs, UnitComm)
    assert passes(timeline, 0) == [("F0", 0.0, 1.0), ("B0", 16.0, 18.0)]
    assert passes(timeline, 2) == [("F0", 7.0, 8.0), ("B0", 8.0, 10.0)]
    moved = [(s.name, s.start_s, s.end_s, s.size_bytes) for s in timeline.spans if s.rank == 0]
    assert ("send F0 0->2", 1.0, 3.0, 2.0) in moved
    assert ("recv B0 2->0", 10.0, 12.0, 2.0) in moved
    assert ("recv B0 all_gather", 12.0, 16.0, 4.0) in moved
    # the waits count as pipeline communication: the blocking send F0 [1, 3], then the
    # receive from its transfer's start [10, 16]; [3, 10] is stage 1 computing (bubble)
    assert timeline.ranks[0].exposed_comm_s == {"pp": 8.0}
    assert timeline.ranks[0].idle_s == 7.0
    # rank 2: F0 waits 1 -> 7 (6 s), the step's end waits for the blocking send B0 (2 s)
    assert timeline.ranks[2].exposed_comm_s == {"pp": 8.0}
    assert timeline.ranks[2].idle_s == 1.0
    assert timeline.step_time_s == 18.0


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
        units=FsdpUnits(
            num_units=3, layer=work(2.0, 4.0), unit_param_bytes=1.0, unit_grad_bytes=1.0
        ),
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


def fsdp_pipeline(
    *, reshard: bool = False, during: bool = False, before_send: bool = False
) -> Timeline:
    """pp=2, m=2 (1F1B), dp=2: ranks 0, 1 on stage 0 and 2, 3 on stage 1; 2 layer units per
    stage, F 1 s and B 2 s per unit, AG 0.5 s and RS 0.25 s (UnitComm: seconds = bytes)."""
    stages = FsdpStages(
        chunks=(
            FsdpUnits(
                num_units=2, layer=work(1.0, 2.0), unit_param_bytes=0.5, unit_grad_bytes=0.25
            ),
        ),
        reshard_after_forward=reshard,
        reduce_during_last_backward=during,
        reduce_before_send=before_send,
    )
    orders = pipeline_orders("1f1b", 2, 2)
    programs = [
        pipeline_program(
            PipelineRank(
                rank=r,
                order=orders[r // 2],
                chunks=(work(2.0, 4.0),),
                stage=r // 2,
                pp=2,
                prev_rank=(r + 2) % 4,
                next_rank=(r + 2) % 4,
                groups={"dp": (r - r % 2, r - r % 2 + 1)},
                fsdp=stages,
            )
        )
        for r in range(4)
    ]
    return run(programs, UnitComm)


def dp_log(timeline: Timeline, rank: int) -> list[tuple[str, float, float]]:
    return [
        (s.name, s.start_s, s.end_s) for s in timeline.spans if s.rank == rank and s.stream == "dp"
    ]


def test_fsdp_pipeline_gathers_once_and_reduces_after_the_last_backward() -> None:
    timeline = fsdp_pipeline()
    # stage 0: AG u0 exposed, AG u1 under F(u0); F1 and both B reuse the unsharded units
    assert dp_log(timeline, 0) == [
        ("AG u0 F0", 0.0, 0.5), ("AG u1 F0", 0.5, 1.0), ("RS u0 c0", 19.0, 19.25),
        ("RS u1 c0", 19.25, 19.5),
    ]  # fmt: skip
    assert passes(timeline, 0) == [
        ("F0", 0.5, 1.5), ("F0", 1.5, 2.5), ("F1", 2.5, 4.5), ("B0", 9.0, 13.0), ("B1", 15.0, 19.0)
    ]  # fmt: skip
    # stage 1: the root pre-forward makes the AG stream wait for the received activation (2.5)
    assert dp_log(timeline, 2) == [
        ("AG u0 F0", 2.5, 3.0), ("AG u1 F0", 3.0, 3.5), ("RS u0 c0", 15.0, 15.25),
        ("RS u1 c0", 15.25, 15.5),
    ]  # fmt: skip
    assert passes(timeline, 2)[:2] == [("F0", 3.0, 4.0), ("F0", 4.0, 5.0)]
    assert timeline.step_time_s == 19.5
    # AG u0 (0.5) + the optimizer's waits on RS u0 and RS u1 (0.25 each): each dep is
    # charged its own part of the gap, in the order they finished
    assert timeline.ranks[0].exposed_comm_s == {"dp": 1.0}


def test_fsdp_pipeline_reducing_before_the_send_holds_the_last_gradient_back() -> None:
    """torch before REDUCE_GRAD: the stage's post-backward runs inside its last backward, each
    unit's after the compute stream waited for the previous unit's reduce-scatter, so stage 1's
    last send leaves once RS u0 is done (15.25, not 15.0) and stage 0's last backward starts
    that much later."""
    timeline = fsdp_pipeline(before_send=True)
    assert dp_log(timeline, 2)[2:] == [("RS u0 c0", 15.0, 15.25), ("RS u1 c0", 15.25, 15.5)]
    assert passes(timeline, 2)[-2:] == [("B1", 11.0, 15.0), ("wait", 15.25, 15.25)]
    assert passes(timeline, 0)[-2:] == [("B1", 15.25, 19.25), ("wait", 19.5, 19.5)]
    assert dp_log(timeline, 0)[2:] == [("RS u0 c0", 19.25, 19.5), ("RS u1 c0", 19.5, 19.75)]
    assert timeline.step_time_s == 19.75  # 19.5 reducing after the send


def test_fsdp_pipeline_reshard_after_forward_gathers_again_before_the_next_use() -> None:
    timeline = fsdp_pipeline(reshard=True)
    names = [name for name, _, _ in dp_log(timeline, 0)]
    # stage 0 (F0 F1 B0 B1): F1 and B0 follow a forward (resharded); B1 follows B0 (kept)
    assert names == [
        "AG u0 F0", "AG u1 F0", "AG u0 F1", "AG u1 F1", "AG u1 B0", "AG u0 B0", "RS u0 c0",
        "RS u1 c0",
    ]  # fmt: skip
    # stage 1 (F0 B0 F1 B1): F1 follows B0, so it runs on the still unsharded units
    assert [name for name, _, _ in dp_log(timeline, 2)][:6] == [
        "AG u0 F0", "AG u1 F0", "AG u1 B0", "AG u0 B0", "AG u1 B1", "AG u0 B1"
    ]  # fmt: skip
    # B0 on stage 0 gathers after its gradient input arrives (9.5), AG u0 hides under B(u1)
    assert dp_log(timeline, 0)[4:6] == [("AG u1 B0", 9.5, 10.0), ("AG u0 B0", 10.0, 10.5)]
    assert timeline.step_time_s == 20.5


def test_fsdp_pipeline_can_reduce_each_unit_during_the_last_backward() -> None:
    timeline = fsdp_pipeline(during=True)
    assert dp_log(timeline, 0)[2:] == [("RS u1 c0 B1", 17.0, 17.25), ("RS u0 c0 B1", 19.0, 19.25)]
    assert dp_log(timeline, 2)[2:] == [("RS u1 c0 B1", 13.0, 13.25), ("RS u0 c0 B1", 15.0, 15.25)]
    assert timeline.step_time_s == 19.25
