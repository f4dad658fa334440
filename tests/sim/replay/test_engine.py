"""The replay engine on tiny hand-timed programs (a fake network: 1 byte takes 1 second)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
import simpy

from schedules.actions import Collective, Compute, Program, Transfer
from sim.replay.engine import ClosedFormRunner, Engine, Timeline


class UnitComm:
    """A network where a message of ``size_bytes`` takes ``size_bytes`` seconds, any op."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.calls: list[tuple[float, str, tuple[int, ...]]] = []

    def run(self, op: str, ranks: Sequence[int], size_bytes: float) -> simpy.Event:
        self.calls.append((self.env.now, op, tuple(ranks)))
        return self.env.timeout(size_bytes)

    def estimate_s(self, op: str, ranks: Sequence[int], size_bytes: float) -> float:
        return size_bytes


def replay(*programs: Program) -> Timeline:
    env = simpy.Environment()
    return Engine(env, UnitComm(env), programs).run()


def log(timeline: Timeline, rank: int | None = None) -> list[tuple[str, float, float]]:
    return [
        (s.name, s.start_s, s.end_s)
        for s in timeline.spans
        if s.kind != "wait" and (rank is None or s.rank == rank)
    ]


def test_compute_stream_runs_in_program_order() -> None:
    program = Program(
        rank=0,
        actions=(Compute(name="a", duration_s=1.0), Compute(name="b", duration_s=2.0)),
    )
    assert log(replay(program)) == [("a", 0.0, 1.0), ("b", 1.0, 3.0)]


def test_same_group_serialises_and_other_groups_overlap() -> None:
    program = Program(
        rank=0,
        actions=(
            Collective(name="dp1", group="dp", ranks=(0, 1), op="all_reduce", size_bytes=2.0),
            Collective(name="dp2", group="dp", ranks=(0, 1), op="all_reduce", size_bytes=1.0),
            Collective(name="tp1", group="tp", ranks=(0, 2), op="all_reduce", size_bytes=1.0),
        ),
    )
    assert log(replay(program)) == [("dp1", 0.0, 2.0), ("tp1", 0.0, 1.0), ("dp2", 2.0, 3.0)]


def test_collective_waits_for_every_member_and_compute_waits_for_it() -> None:
    def program(rank: int, work_s: float) -> Program:
        return Program(
            rank=rank,
            actions=(
                Compute(name="work", duration_s=work_s),
                Collective(
                    name="ar", group="dp", ranks=(0, 1), op="all_reduce", size_bytes=1.0, deps=(0,)
                ),
                Compute(name="next", duration_s=1.0, deps=(1,)),
            ),
        )

    timeline = replay(program(0, 1.0), program(1, 3.0))
    assert log(timeline, 0) == [("work", 0.0, 1.0), ("ar", 3.0, 4.0), ("next", 4.0, 5.0)]
    assert log(timeline, 1) == [("work", 0.0, 3.0), ("ar", 3.0, 4.0), ("next", 4.0, 5.0)]
    # Rank 0 waited 3 s: 2 s for rank 1 (imbalance, charged to dp as issued at 1.0) + 1 s wire.
    assert timeline.ranks[0].exposed_comm_s == {"dp": 3.0}
    assert timeline.ranks[1].exposed_comm_s == {"dp": 1.0}
    assert timeline.step_time_s == 5.0


def test_transfer_starts_when_sender_is_ready_and_waiting_is_split() -> None:
    sender = Program(
        rank=0,
        actions=(
            Compute(name="F", duration_s=2.0),
            Transfer(name="send", src=0, dst=1, tag="x", size_bytes=0.5, deps=(0,)),
        ),
    )
    receiver = Program(
        rank=1,
        actions=(
            Transfer(name="recv", src=0, dst=1, tag="x", size_bytes=0.5),
            Compute(name="F", duration_s=1.0, deps=(0,)),
        ),
    )
    timeline = replay(sender, receiver)
    assert log(timeline, 1) == [("recv", 2.0, 2.5), ("F", 2.5, 3.5)]
    times = timeline.ranks[1]
    assert times.exposed_comm_s == {"pp": 0.5}
    assert times.idle_s == 2.0
    assert times.compute_s == 1.0


def test_unsimulated_members_are_not_waited_for() -> None:
    program = Program(
        rank=0,
        actions=(
            Collective(name="ar", group="dp", ranks=(0, 4, 8), op="all_reduce", size_bytes=1.0),
        ),
    )
    env = simpy.Environment()
    comm = UnitComm(env)
    Engine(env, comm, [program]).run()
    assert comm.calls == [(0.0, "all_reduce", (0, 4, 8))]


def test_repeat_runs_back_to_back() -> None:
    program = Program(
        rank=0,
        actions=(
            Collective(
                name="ar", group="tp", ranks=(0, 1), op="all_reduce", size_bytes=1.0, repeat=3
            ),
        ),
    )
    timeline = replay(program)
    assert log(timeline) == [("ar", 0.0, 3.0)]
    assert timeline.spans[0].size_bytes == 3.0


def test_mismatched_programs_raise_deadlock() -> None:
    lonely = Program(
        rank=0,
        actions=(Transfer(name="recv", src=1, dst=0, tag="never", size_bytes=1.0),),
    )
    other = Program(rank=1, actions=(Compute(name="c", duration_s=1.0),))
    with pytest.raises(RuntimeError, match="deadlock"):
        replay(lonely, other)


def test_forward_dependency_is_rejected() -> None:
    bad = Program(rank=0, actions=(Compute(name="c", duration_s=1.0, deps=(0,)),))
    with pytest.raises(ValueError, match="later action"):
        replay(bad)


def test_optimizer_phase_wait_counts_as_optimizer() -> None:
    program = Program(
        rank=0,
        actions=(
            Compute(name="opt", duration_s=1.0, kind="optimizer"),
            Collective(
                name="AG params",
                group="dp",
                ranks=(0, 1),
                op="all_gather",
                size_bytes=2.0,
                deps=(0,),
                phase="optimizer",
            ),
            Compute(name="end", duration_s=0.0, kind="optimizer", deps=(1,)),
        ),
    )
    times = replay(program).ranks[0]
    assert times.optimizer_s == 3.0
    assert times.exposed_comm_s == {}
    assert times.end_s == 3.0


def test_closed_form_runner_estimates_each_distinct_collective_once() -> None:
    env = simpy.Environment()
    unit = UnitComm(env)
    estimates: list[tuple[str, tuple[int, ...], float]] = []

    def estimate_s(op: str, ranks: tuple[int, ...], size_bytes: float) -> float:
        estimates.append((op, ranks, size_bytes))
        return unit.estimate_s(op, ranks, size_bytes)

    program = Program(
        rank=0,
        actions=(
            Collective(name="a", group="tp", ranks=(0, 1), op="all_reduce", size_bytes=2.0),
            Collective(name="b", group="tp", ranks=(0, 1), op="all_reduce", size_bytes=2.0),
            Collective(name="c", group="dp", ranks=(0, 2), op="all_reduce", size_bytes=2.0),
            Collective(
                name="d", group="tp", ranks=(0, 1), op="all_reduce", size_bytes=1.0, repeat=3
            ),
        ),
    )
    timeline = Engine(env, ClosedFormRunner(env, estimate_s), [program]).run()
    assert log(timeline) == [("c", 0.0, 2.0), ("a", 0.0, 2.0), ("b", 2.0, 4.0), ("d", 4.0, 7.0)]
    assert estimates == [
        ("all_reduce", (0, 1), 2.0), ("all_reduce", (0, 2), 2.0), ("all_reduce", (0, 1), 1.0),
    ]  # fmt: skip


def test_compute_slows_while_communication_runs_beside_it() -> None:
    program = Program(
        rank=0,
        actions=(
            Compute(name="a", duration_s=4.0),
            Collective(name="ag", group="dp", ranks=(0, 1), op="all_gather", size_bytes=2.0),
            Compute(name="b", duration_s=1.0),
        ),
    )
    env = simpy.Environment()
    timeline = Engine(env, UnitComm(env), [program], overlap_slowdown=1.0).run()
    # a runs at half speed while ag is in flight (0-2 s: 1 s of work), then 3 s at full speed
    assert log(timeline) == [("a", 0.0, 5.0), ("ag", 0.0, 2.0), ("b", 5.0, 6.0)]
    times = timeline.ranks[0]
    assert times.overlap_slowdown_s == pytest.approx(1.0)
    assert times.compute_s == pytest.approx(6.0)  # 5 s of work + 1 s lost to the overlap


@pytest.mark.parametrize("alone", [False, True])
def test_a_copy_engine_collective_leaves_the_compute_beside_it_at_full_rate(alone: bool) -> None:
    # Transformer Engine's ring exchanges take no SMs (Collective.sm_free); alone, the rank is
    # its group's only simulated member (a folded group: one closed-form timer)
    ranks = (0, 7) if alone else (0, 1)
    program = Program(
        rank=0,
        actions=(
            Compute(name="a", duration_s=4.0),
            Collective(
                name="ag", group="tp", ranks=ranks, op="all_gather", size_bytes=2.0, sm_free=True
            ),
            Compute(name="b", duration_s=1.0),
        ),
    )
    env = simpy.Environment()
    comm = ClosedFormRunner(env, lambda op, ranks, size: size) if alone else UnitComm(env)
    timeline = Engine(env, comm, [program], overlap_slowdown=1.0).run()
    assert log(timeline) == [("a", 0.0, 4.0), ("ag", 0.0, 2.0), ("b", 4.0, 5.0)]
    assert timeline.ranks[0].overlap_slowdown_s == 0.0


def test_communication_starting_mid_compute_slows_only_the_rest() -> None:
    program = Program(
        rank=0,
        actions=(
            Compute(name="a", duration_s=1.0),
            Compute(name="b", duration_s=4.0),
            Collective(
                name="rs", group="dp", ranks=(0, 1), op="reduce_scatter", size_bytes=1.0, deps=(0,)
            ),
        ),
    )
    env = simpy.Environment()
    timeline = Engine(env, UnitComm(env), [program], overlap_slowdown=0.25).run()
    # b: 1 s of comm at rate 0.8 does 0.8 s of work, then 3.2 s alone: 1 + 1 + 3.2 = 5.2
    assert log(timeline) == [("a", 0.0, 1.0), ("b", 1.0, pytest.approx(5.2)), ("rs", 1.0, 2.0)]
    assert timeline.ranks[0].overlap_slowdown_s == pytest.approx(0.2)
    with pytest.raises(ValueError, match="overlap_slowdown must be in"):
        Engine(env, UnitComm(env), [program], overlap_slowdown=-0.1)


def test_host_thread_runs_beside_the_compute_and_its_waits_are_charged_to_the_host() -> None:
    # host loop 0-2 s beside compute 0-1 s; the collective waits for the loop (issued at 2 s,
    # 1 s on the wire); "after" waits for it: 2 s idle, 1 s charged to the host (the loop held
    # the collective back), the wire's 1 s to dp
    program = Program(
        rank=0,
        actions=(
            Compute(name="c", duration_s=1.0),
            Compute(name="loop", duration_s=2.0, kind="host", stream="host"),
            Collective(
                name="ar", group="dp", ranks=(0,), op="all_reduce", size_bytes=1.0, deps=(1,)
            ),
            Compute(name="after", duration_s=1.0, deps=(2,)),
        ),
    )
    env = simpy.Environment()
    timeline = Engine(env, UnitComm(env), [program], overlap_slowdown=0.5).run()
    assert log(timeline) == [("c", 0.0, 1.0), ("loop", 0.0, 2.0), ("ar", 2.0, 3.0),
                             ("after", 3.0, 4.0)]  # fmt: skip
    times = timeline.ranks[0]
    assert times.exposed_comm_s == {"dp": 1.0, "host": 1.0}
    assert times.compute_s == 2.0  # host work is not compute-stream time
    assert [s.stream for s in timeline.spans if s.name == "loop"] == ["host"]


def test_a_host_action_does_not_become_the_builders_last_compute() -> None:
    from schedules.actions import ProgramBuilder

    b = ProgramBuilder(rank=0, groups={})
    first = b.add(Compute(name="c", duration_s=1.0))
    b.add(Compute(name="loop", duration_s=1.0, kind="host", stream="host"))
    assert b.last_compute == first


def test_the_host_launches_ahead_and_the_gpu_waits_when_it_is_behind() -> None:
    # a: launched 0-2, runs 0-1, its last kernels arrive at 2; b: launched 2-2.5, runs 2-3;
    # c: launched 2.5-3 while b runs, so it starts at 3 without waiting
    program = Program(
        rank=0,
        actions=(
            Compute(name="a", duration_s=1.0, launch_s=2.0),
            Compute(name="b", duration_s=1.0, launch_s=0.5),
            Compute(name="c", duration_s=1.0, launch_s=0.5),
        ),
    )
    timeline = replay(program)
    assert log(timeline) == [("a", 0.0, 2.0), ("b", 2.0, 3.0), ("c", 3.0, 4.0)]
    assert timeline.ranks[0].exposed_comm_s == {"host": 1.0}
    assert timeline.ranks[0].compute_s == 3.0


def test_a_launch_bound_step_takes_the_host_time() -> None:
    program = Program(
        rank=0,
        actions=(
            Compute(name="a", duration_s=1.0, launch_s=3.0),
            Compute(name="b", duration_s=1.0, launch_s=3.0),
            Compute(name="gap", duration_s=0.0),  # nothing to launch: starts when b's host is done
            Compute(name="c", duration_s=2.0, launch_s=1.0),
        ),
    )
    timeline = replay(program)
    assert log(timeline) == [("a", 0.0, 3.0), ("b", 3.0, 6.0), ("gap", 6.0, 6.0), ("c", 6.0, 8.0)]
    assert timeline.step_time_s == 8.0
    assert timeline.ranks[0].exposed_comm_s == {"host": 4.0}


def test_the_host_runs_ahead_while_the_gpu_waits_for_communication() -> None:
    # the host launched b at 1, long before the all-reduce it waits for ends at 5
    program = Program(
        rank=0,
        actions=(
            Collective(name="ar", group="dp", ranks=(0, 1), op="all_reduce", size_bytes=5.0),
            Compute(name="b", duration_s=1.0, launch_s=1.0, deps=(0,)),
        ),
    )
    timeline = replay(program)
    assert log(timeline) == [("ar", 0.0, 5.0), ("b", 5.0, 6.0)]
    assert timeline.ranks[0].exposed_comm_s == {"dp": 5.0}


def test_finished_fires_when_the_last_action_of_every_program_ends() -> None:
    """The ``finished`` event (a second job's traffic stops there) succeeds at the end of the
    last action, transfers and collectives included, not before; with nothing to run, at 0."""
    sender = Program(
        rank=0,
        actions=(
            Compute(name="F", duration_s=2.0),
            Transfer(name="send", src=0, dst=1, tag="x", size_bytes=0.5, deps=(0,)),
            Collective(name="dp", group="dp", ranks=(0, 1), op="all_reduce", size_bytes=1.0),
        ),
    )
    receiver = Program(
        rank=1,
        actions=(
            Transfer(name="recv", src=0, dst=1, tag="x", size_bytes=0.5),
            Compute(name="F", duration_s=1.0, deps=(0,)),
            Collective(name="dp", group="dp", ranks=(0, 1), op="all_reduce", size_bytes=1.0,
                       deps=(1,)),
        ),
    )  # fmt: skip
    env = simpy.Environment()
    finished = env.event()
    seen: list[float] = []
    finished.callbacks.append(lambda _event: seen.append(env.now))
    timeline = Engine(env, UnitComm(env), (sender, receiver), finished=finished).run()
    assert seen == [4.5] == [max(t.end_s for t in timeline.ranks.values())]
    empty = simpy.Environment()
    done = empty.event()
    Engine(empty, UnitComm(empty), (Program(rank=0, actions=()),), finished=done).run()
    assert done.triggered and empty.now == 0.0


def test_a_deadlock_beside_other_traffic_raises_instead_of_running_forever() -> None:
    """Two ranks issue two collectives in opposite orders: neither can start. Alone the replay
    stops and says so; with another endless process on the environment (a second job's
    traffic) and ``finished`` given, no action ends for ``STALL_S`` and it raises too."""
    from sim.replay.engine import STALL_S

    def programs():
        a = Collective(name="g", group="g", ranks=(0, 1), op="all_reduce", size_bytes=1.0)
        b = Collective(name="h", group="h", ranks=(0, 1), op="all_reduce", size_bytes=1.0)
        first = Program(rank=0, actions=(a, dataclasses.replace(b, deps=(0,))))
        second = Program(rank=1, actions=(b, dataclasses.replace(a, deps=(0,))))
        return first, second

    with pytest.raises(RuntimeError, match="replay deadlock"):
        replay(*programs())
    env = simpy.Environment()

    def traffic():
        while True:
            yield env.timeout(1.0)

    env.process(traffic())
    with pytest.raises(RuntimeError, match=f"no action ended in {STALL_S:g} s"):
        Engine(env, UnitComm(env), programs(), finished=env.event()).run()
    assert env.now == pytest.approx(STALL_S)


def test_each_ranks_accounting_is_built_when_first_read() -> None:
    """The step time and the critical rank come from the ranks' ends alone; a rank's split is
    built on first read, and is the same read eagerly (``Timeline`` over a plain dict)."""
    from sim.replay.engine import LazyRanks

    a = Program(rank=0, actions=(Compute(name="a", duration_s=2.0),))
    b = Program(
        rank=1,
        actions=(
            Compute(name="b", duration_s=1.0),
            Collective(
                name="ar", group="g", op="all_reduce", ranks=(1,), size_bytes=4.0, deps=(0,)
            ),
            Compute(name="c", duration_s=1.0, deps=(1,)),
        ),
    )
    timeline = replay(a, b)
    ranks = timeline.ranks
    assert isinstance(ranks, LazyRanks) and not ranks._built
    assert timeline.step_time_s == 6.0 and timeline.critical_rank == 1
    assert not ranks._built  # ends only
    assert ranks[1].exposed_comm_s == {"g": 4.0} and list(ranks._built) == [1]
    eager = Timeline(spans=timeline.spans, ranks={r: ranks[r] for r in ranks})
    assert (eager.step_time_s, eager.critical_rank) == (6.0, 1) and len(ranks) == 2


def test_host_work_holds_back_the_launches_after_it() -> None:
    # a runs 0-1; the host syncs on it and works 1-1.5 (a device synchronisation); b's kernels
    # are launched from 1.5 to 2.5 and it runs 1.5-1.7, ending with its last launch at 2.5.
    # Without the sync the host would have launched b at 0-1 and b would end at 1.7.
    program = Program(
        rank=0,
        actions=(
            Compute(name="a", duration_s=1.0),
            Compute(name="sync", duration_s=0.5, kind="host", stream="host", deps=(0,)),
            Compute(name="b", duration_s=0.2, launch_s=1.0, deps=(1,)),
        ),
    )
    timeline = replay(program)
    assert log(timeline) == [("a", 0.0, 1.0), ("sync", 1.0, 1.5), ("b", 1.5, 2.5)]
    assert timeline.step_time_s == pytest.approx(2.5)
    assert timeline.ranks[0].exposed_comm_s == pytest.approx({"host": 1.3})


def test_a_wait_before_host_work_is_charged_to_what_the_host_waited_for() -> None:
    # a runs 0-1; a counts gather 1-4 (unit network: 3 bytes take 3 s); the host syncs on both
    # and works 4-4.5; b waits 1-4.5: 3 s on the gather's group, 0.5 s on the host
    program = Program(
        rank=0,
        actions=(
            Compute(name="a", duration_s=1.0),
            Collective(
                name="counts",
                group="tpep",
                ranks=(0, 1),
                op="all_gather",
                size_bytes=3.0,
                deps=(0,),
            ),
            Compute(name="sync", duration_s=0.5, kind="host", stream="host", deps=(0, 1)),
            Compute(name="b", duration_s=1.0, deps=(2,)),
        ),
    )
    timeline = replay(program)
    assert log(timeline)[-1] == ("b", 4.5, 5.5)
    assert timeline.ranks[0].exposed_comm_s == pytest.approx({"tpep": 3.0, "host": 0.5})
