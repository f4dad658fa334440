"""The replay engine: runs per-rank programs on SimPy streams and process-group FIFOs.

Each simulated GPU has a compute stream (its ``Compute`` actions, one after another), a host
thread (``Compute`` actions on ``stream="host"``: framework loops and device synchronisations the
GPU cannot run ahead of; a compute waiting for one is charged to ``host``, as if it were a group,
and its kernels are launched only from that host work's end; and the launches of the compute
stream's kernels, ``Compute.launch_s``, issued in program order ahead of the GPU, which cannot
start an action its host has not reached nor end it before its last launch) and one FIFO
per process group it belongs to (its ``Collective`` actions on that group, one at a time, in
issue order: NCCL's one queue per communicator). A collective starts when every simulated
member has issued it (its deps are done and it reached the head of the member's FIFO); its
duration comes from the network model ``comm.run(op, ranks, size_bytes)`` on the group's full
rank list, so concurrent collectives contend under ``flow`` fidelity. A ``Transfer`` starts when
both its sender and its receiver have posted it. Group members that are not simulated (folded
replicas) are not waited for. Everything is ordered by SimPy's event queue: deterministic.

Overlap interference: while any collective or transfer of a rank is in flight, its compute runs
``1 + overlap_slowdown`` times slower (NCCL's kernels hold SMs and HBM bandwidth that the GEMMs
would use; host copies and copy-engine transfers, ``Collective.sm_free``, take none); the compute
stream's progress is re-rated whenever that changes, and the extra time is reported per rank
(``RankTimes.overlap_slowdown_s``).

    timeline = Engine(env, comm, programs).run()
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import simpy
from simpy.events import URGENT

from schedules.actions import Action, Collective, Compute, Program, Transfer
from schedules.offload import HOST_OPS
from sim.replay.result import LazySpans, Span


class CommRunner(Protocol):
    """What the engine needs from a network model (``sim.network.comm_model.CommModel`` has it)."""

    def run(self, op: str, ranks: Sequence[int], size_bytes: float) -> simpy.Event:
        """Start the collective's traffic now; the event succeeds when it completes."""
        ...


class ClosedFormRunner:
    """A ``CommRunner`` whose collectives take a fixed closed-form time, computed once per
    distinct (op, ranks, size): what ``CommModel.run`` does under ``analytical`` fidelity, without
    re-deriving the same estimate for every micro-batch (state: the memo)."""

    def __init__(self, env: simpy.Environment, estimate_s: Callable[..., float]) -> None:
        self.env = env
        self.estimate_s = estimate_s
        self._memo: dict[tuple[str, tuple[int, ...], float], float] = {}

    def run(self, op: str, ranks: Sequence[int], size_bytes: float, repeat: int = 1) -> simpy.Event:
        """A timeout of the collective's closed-form duration (``repeat`` calls back to back:
        one timeout of their sum, as nothing else shares the network under this model)."""
        return self.env.timeout(self.duration_s(op, ranks, size_bytes, repeat))

    def duration_s(
        self, op: str, ranks: Sequence[int], size_bytes: float, repeat: int = 1
    ) -> float:
        """How long ``repeat`` calls started now take, back to back."""
        return self.seconds(op, ranks, size_bytes) * repeat

    def seconds(self, op: str, ranks: Sequence[int], size_bytes: float) -> float:
        """The collective's closed-form duration (memoised)."""
        key = (op, tuple(ranks), size_bytes)
        seconds = self._memo.get(key)
        if seconds is None:
            seconds = self._memo[key] = self.estimate_s(op, key[1], size_bytes)
        return seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class RankTimes:
    """Where one simulated rank's time went."""

    end_s: float
    """When its last action finished."""
    compute_s: float
    """Busy time of the compute stream (optimizer excluded)."""
    optimizer_s: float
    """Optimizer compute plus waits on the post-step parameter gather."""
    exposed_comm_s: dict[str, float]
    """Per group: compute-stream idle time spent waiting for that group's communication
    (``host``: waiting for the rank's host thread)."""
    idle_s: float
    """Other compute-stream idle time (waiting for other stages: the pipeline bubble)."""
    overlap_slowdown_s: float = 0.0
    """Compute-stream time added by communication running beside the compute (in compute_s)."""
    kernel_s: float = 0.0
    """Compute-stream time of the forward and backward work at its modelled durations, before
    the overlap slowdown: what the compute model's time factor scales there. The optimizer's
    kernels are scaled too but left out (under offload its step is CPU time), so a share taken
    from this is a lower bound by the optimizer's part."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """Result of a replay: every span and per-rank accounting."""

    spans: Sequence[Span]
    """Compute, collective, transfer and wait spans, sorted by (rank, start, stream, name)
    (a replay's are built on first use: ``LazySpans``)."""
    ranks: Mapping[int, RankTimes]
    """Accounting per simulated rank (a replay's is built per rank on first use:
    ``LazyRanks``)."""

    def _ends(self) -> dict[int, float]:
        if isinstance(self.ranks, LazyRanks):
            return self.ranks.ends
        return {rank: times.end_s for rank, times in self.ranks.items()}

    @property
    def step_time_s(self) -> float:
        """Latest end over all simulated ranks."""
        return max(self._ends().values(), default=0.0)

    @property
    def critical_rank(self) -> int:
        """The rank that finishes last (lowest rank on ties)."""
        ends = self._ends()
        end = max(ends.values(), default=0.0)
        return min(rank for rank, end_s in ends.items() if end_s == end)


@dataclass(slots=True)
class _Meeting:
    """Rendezvous of the simulated members of one collective or transfer instance."""

    needed: int
    arrived: int = 0
    start_s: float = 0.0
    done: simpy.Event | None = None


@dataclass(slots=True)
class _Record:
    issue_s: float = 0.0
    start_s: float = 0.0
    end_s: float = 0.0
    slowed_s: float = 0.0
    host_wait_s: float = 0.0
    host_tail_s: float = 0.0


class LazyRanks(Mapping[int, RankTimes]):
    """A replay's per-rank accounting, each rank's built when first read (a report reads the
    critical rank's; the step time needs only every rank's end)."""

    def __init__(self, runs: Sequence[tuple[Program, list[_Record]]]) -> None:
        self._runs = {program.rank: (program, records) for program, records in runs}
        self._built: dict[int, RankTimes] = {}
        self.ends = {
            rank: max((r.end_s for r in records), default=0.0)
            for rank, (_, records) in self._runs.items()
        }
        """When each rank's last action finished (``RankTimes.end_s``)."""

    def __getitem__(self, rank: int) -> RankTimes:
        times = self._built.get(rank)
        if times is None:
            program, records = self._runs[rank]
            times = self._built[rank] = _account(program, records)[1]
        return times

    def __iter__(self) -> Iterator[int]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)


@dataclass(slots=True)
class _State:
    finished: list[bool]
    records: list[_Record]
    waiters: dict[int, simpy.Event] = field(default_factory=dict)
    streams: dict[Hashable, list[int]] = field(default_factory=dict)
    host_fed: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Compute-stream actions that wait for host-thread work, and that work: the host launches
    them only once it is done (a device synchronisation, a host loop)."""


STALL_S = 100.0
"""Simulated seconds with no action ending after which a replay beside other traffic (a second
job's flows) is taken to be deadlocked: no kernel, collective or transfer of a training step
lasts that long."""


class Engine:
    """Runs programs to completion on a SimPy environment (state changes over simulated time)."""

    def __init__(
        self,
        env: simpy.Environment,
        comm: CommRunner,
        programs: Sequence[Program],
        *,
        overlap_slowdown: float = 0.0,
        finished: simpy.Event | None = None,
    ):
        """``finished``, when given, succeeds as the programs' last action ends (a second job's
        traffic, ``sim.replay.flowing_jobs.start_flowing_jobs``, stops there); with it, a replay in
        which no action ends for ``STALL_S`` of simulated time raises, since such traffic would
        otherwise keep a deadlocked replay running forever."""
        if not 0.0 <= overlap_slowdown <= 10.0:
            raise ValueError(f"overlap_slowdown must be in [0, 10], got {overlap_slowdown}")
        self.env = env
        self.comm = comm
        self.overlap_slowdown = overlap_slowdown
        self._in_flight: dict[int, int] = defaultdict(int)
        self._launched: dict[int, float] = defaultdict(float)
        self._changed: dict[int, simpy.Event] = {}
        self._busy: dict[int, list[tuple[float, bool]]] = defaultdict(list)
        self.programs = {program.rank: program for program in programs}
        if len(self.programs) != len(programs):
            raise ValueError("two programs for the same rank")
        self._meetings: dict[Hashable, _Meeting] = {}
        # the simulated members of each group's ranks (a group of 1,024 has 8 when folded)
        self._members: dict[tuple[int, ...], list[int]] = {}
        self._states = {rank: self._state(p) for rank, p in sorted(self.programs.items())}
        self._finished = finished
        self._unfinished = sum(len(p.actions) for p in programs)

    def _state(self, program: Program) -> _State:
        state = _State(
            finished=[False] * len(program.actions),
            records=[_Record() for _ in program.actions],
        )
        streams: dict[Hashable, list[int]] = defaultdict(list)
        for index, action in enumerate(program.actions):
            deps = action.deps
            if deps and (max(deps) >= index or min(deps) < 0):
                raise ValueError(f"rank {program.rank} action {index} depends on a later action")
            if isinstance(action, Compute):
                streams[action.stream].append(index)
                if action.stream == "compute" and deps:
                    host = tuple(d for d in deps if _on_host(program.actions[d]))
                    if host:
                        state.host_fed[index] = host
            elif isinstance(action, Collective):
                streams[(action.group, action.ranks)].append(index)
            else:
                streams[("p2p", index)].append(index)
        state.streams = dict(streams)
        return state

    def run(self) -> Timeline:
        """Simulate every program; raises RuntimeError if some action can never run."""
        if not self._unfinished and self._finished is not None:
            self._finished.succeed()
        if self._finished is not None and not self._finished.triggered:
            self.env.process(self._watch(self._finished))
        for rank, state in self._states.items():
            for key, indices in state.streams.items():
                if isinstance(key, tuple) and key[0] == "p2p":  # a transfer: callbacks, no process
                    start = self.env.event()
                    start.callbacks.append(partial(self._post, rank, indices[0], 0))
                    start._ok, start._value = True, None  # as SimPy's process Initialize
                    self.env.schedule(start, URGENT)
                else:
                    self.env.process(self._stream(rank, key, indices))
        self.env.run()
        stuck = [
            (rank, i)
            for rank, state in self._states.items()
            for i, finished in enumerate(state.finished)
            if not finished
        ]
        if stuck:
            rank, i = stuck[0]
            action = self.programs[rank].actions[i]
            raise RuntimeError(
                f"replay deadlock: {len(stuck)} actions never ran, first rank {rank} "
                f"action {i} ({action.name})"
            )
        return self._timeline()

    def _watch(self, finished: simpy.Event) -> Generator[Any, Any, None]:
        """Raise if no action ends for ``STALL_S`` of simulated time before ``finished``."""
        last = self._unfinished
        while True:
            yield self.env.timeout(STALL_S) | finished
            if finished.triggered:
                return
            if self._unfinished == last:
                raise RuntimeError(
                    f"replay deadlock: no action ended in {STALL_S:g} s of simulated time, "
                    f"{self._unfinished} never ran (other traffic kept the simulation going)"
                )
            last = self._unfinished

    def _stream(self, rank: int, key: Hashable, indices: list[int]) -> Generator[Any, Any, None]:
        state = self._states[rank]
        actions = self.programs[rank].actions
        seq = 0
        for index in indices:
            action = actions[index]
            for dep in action.deps:  # one at a time: the last one sets the start, as AllOf
                if not state.finished[dep]:
                    yield self._waiter(state, dep)
            record = state.records[index]
            record.issue_s = self.env.now
            if isinstance(action, Compute):
                on_gpu = action.stream == "compute"
                if on_gpu:  # the host launches in program order, ahead of the GPU
                    host_s = self._launched[rank]
                    fed = state.host_fed.get(index)
                    if fed:  # launched once the host work it waits for is done
                        host_s = max(host_s, *(state.records[d].end_s for d in fed))
                    self._launched[rank] = host_s + action.launch_s
                    if host_s > self.env.now:
                        record.host_wait_s = host_s - self.env.now
                        yield self.env.timeout(record.host_wait_s)
                record.start_s = self.env.now
                if action.duration_s > 0 and self.overlap_slowdown > 0 and on_gpu:
                    yield from self._compute(rank, action.duration_s)
                    ran_s = self.env.now - record.start_s
                    if ran_s > action.duration_s * (1 + 1e-12):
                        record.slowed_s = ran_s - action.duration_s
                elif action.duration_s > 0:
                    yield self.env.timeout(action.duration_s)
                behind = self._launched[rank] - self.env.now if on_gpu else 0.0
                if behind > 0:  # its last kernels were launched after the GPU got there
                    record.host_tail_s = behind
                    yield self.env.timeout(behind)
            elif (alone := self._alone(rank, action)) is not None:
                # the rank is the group's only simulated member: no rendezvous, one timer
                seq += 1
                record.start_s = self.env.now
                if alone:
                    self._comm_moved((rank,), +1)
                yield self.env.timeout(self._closed_form_s(action))
                if alone:
                    self._comm_moved((rank,), -1)
            else:
                meeting = self._arrive(action, key, seq)
                seq += 1
                assert meeting.done is not None
                yield meeting.done
                record.start_s = meeting.start_s
            self._finish(state, index)

    def _finish(self, state: _State, index: int) -> None:
        """Action ``index`` ends now: recorded, and whatever waits on it woken."""
        state.records[index].end_s = self.env.now
        state.finished[index] = True
        waiter = state.waiters.pop(index, None)
        if waiter is not None:
            waiter.succeed()
        self._unfinished -= 1
        if not self._unfinished and self._finished is not None:
            self._finished.succeed()

    def _post(self, rank: int, index: int, next_dep: int, _: Any = None) -> None:
        """A transfer's own stream, as callbacks: once its dependencies are done (one at a
        time, as ``_stream`` waits on them), it posts to its rendezvous and is recorded done
        with it. The callbacks sit where ``_stream``'s resumption would, so events run in the
        same order."""
        state = self._states[rank]
        action = self.programs[rank].actions[index]
        deps = action.deps
        for position in range(next_dep, len(deps)):
            if not state.finished[deps[position]]:
                waiter = self._waiter(state, deps[position])
                waiter.callbacks.append(partial(self._post, rank, index, position + 1))
                return
        record = state.records[index]
        record.issue_s = self.env.now
        meeting = self._arrive(action, ("p2p", index), 0)
        assert meeting.done is not None

        def done(_: simpy.Event) -> None:
            record.start_s = meeting.start_s
            self._finish(state, index)

        if meeting.done.callbacks is None:  # already processed
            done(meeting.done)
        else:
            meeting.done.callbacks.append(done)

    def _simulated(self, ranks: tuple[int, ...]) -> list[int]:
        """The simulated members of a group's ranks (looked up once per group)."""
        members = self._members.get(ranks)
        if members is None:
            members = self._members[ranks] = [r for r in ranks if r in self.programs]
        return members

    def _alone(self, rank: int, action: Action) -> bool | None:
        """For a collective whose only simulated member is ``rank``, timed in closed form:
        whether it slows the rank's compute while it runs (``_comm_moved``); None otherwise."""
        if not isinstance(action, Collective) or not isinstance(self.comm, ClosedFormRunner):
            return None
        if self._simulated(action.ranks) != [rank]:
            return None
        return self.overlap_slowdown > 0 and action.op not in HOST_OPS and not action.sm_free

    def _closed_form_s(self, action: Action) -> float:
        """Closed-form duration of a collective's ``repeat`` calls."""
        assert isinstance(action, Collective) and isinstance(self.comm, ClosedFormRunner)
        return self.comm.duration_s(action.op, action.ranks, action.size_bytes, action.repeat)

    def _compute(self, rank: int, duration_s: float) -> Generator[Any, Any, None]:
        """Run ``duration_s`` of work at the rate the rank's communication leaves it. Started
        while the rank communicates, the work is woken when that ends (``_changed``) and runs on
        faster; started idle, one timer runs at full rate and, when it fires, the work done is
        integrated over the communication that started and ended in between (``_busy``), the
        rest running on at the rate of the moment: no event per compute step that nothing slows.
        """
        slowed = 1.0 / (1.0 + self.overlap_slowdown)
        history = self._busy[rank]
        remaining = duration_s
        while True:
            start = self.env.now
            if self._in_flight[rank]:
                changed = self._changed.get(rank)
                if changed is None:
                    changed = self._changed[rank] = self.env.event()
                timer = self.env.timeout(remaining / slowed)
                yield timer | changed
                if timer.processed:
                    return
                remaining -= (self.env.now - start) * slowed
                continue
            seen = len(history)
            yield self.env.timeout(remaining)
            done, since, busy = 0.0, start, False
            for when, now_busy in history[seen:]:
                done += (when - since) * (slowed if busy else 1.0)
                since, busy = when, now_busy
            remaining -= done + (self.env.now - since) * (slowed if busy else 1.0)
            if remaining <= 1e-12 * max(duration_s, self.env.now):  # below the clock's grain
                return

    def _comm_moved(self, ranks: Sequence[int], delta: int) -> None:
        """A collective or transfer started (+1) or ended (-1) on these simulated ranks; a rank's
        change between idle and busy is logged for ``_compute``."""
        for rank in ranks:
            before = self._in_flight[rank]
            self._in_flight[rank] = before + delta
            if (before == 0) != (before + delta == 0):
                self._busy[rank].append((self.env.now, before == 0))
                if rank in self._changed:
                    self._changed.pop(rank).succeed()

    def _waiter(self, state: _State, index: int) -> simpy.Event:
        """The event that succeeds when action ``index`` finishes (created on first need)."""
        event = state.waiters.get(index)
        if event is None:
            event = state.waiters[index] = self.env.event()
        return event

    def _arrive(self, action: Action, key: Hashable, seq: int) -> _Meeting:
        if isinstance(action, Collective):
            members = self._simulated(action.ranks)
            meeting_key: Hashable = (key, seq)
        else:
            assert isinstance(action, Transfer)
            members = [r for r in (action.src, action.dst) if r in self.programs]
            meeting_key = ("p2p", action.src, action.dst, action.tag)
        meeting = self._meetings.get(meeting_key)
        if meeting is None:
            meeting = _Meeting(needed=len(members), done=self.env.event())
            self._meetings[meeting_key] = meeting
        meeting.arrived += 1
        if meeting.arrived == meeting.needed:
            meeting.start_s = self.env.now
            assert meeting.done is not None
            # not on the SMs: host copies, copy-engine transfers
            copy = isinstance(action, Collective) and (action.op in HOST_OPS or action.sm_free)
            if self.overlap_slowdown > 0 and not copy:
                self._comm_moved(members, +1)
                meeting.done.callbacks.append(lambda _: self._comm_moved(members, -1))
            if isinstance(action, Collective):
                self._chain(action.op, action.ranks, action.size_bytes, action.repeat, meeting.done)
            else:
                assert isinstance(action, Transfer)
                pair = (action.src, action.dst)
                self._chain("send_recv", pair, action.size_bytes, 1, meeting.done)
        return meeting

    def _chain(
        self, op: str, ranks: tuple[int, ...], size_bytes: float, repeat: int, done: simpy.Event
    ) -> None:
        """Run ``repeat`` back-to-back calls, then succeed ``done`` (callbacks, no process); a
        closed-form runner times them as one."""
        if isinstance(self.comm, ClosedFormRunner):
            event = self.comm.run(op, ranks, size_bytes, repeat)
            repeat = 1
        else:
            event = self.comm.run(op, ranks, size_bytes)

        def then(_: simpy.Event) -> None:
            if repeat > 1:
                self._chain(op, ranks, size_bytes, repeat - 1, done)
            else:
                done.succeed()

        if event.callbacks is None:  # already processed
            then(event)
        else:
            event.callbacks.append(then)

    def _timeline(self) -> Timeline:
        runs = [(self.programs[rank], state.records) for rank, state in self._states.items()]
        return Timeline(spans=LazySpans(partial(_all_spans, runs)), ranks=LazyRanks(runs))


def _all_spans(runs: Sequence[tuple[Program, list[_Record]]]) -> tuple[Span, ...]:
    """Every simulated rank's spans, waits included, in the ``Timeline`` order."""
    spans: list[Span] = []
    for program, records in runs:
        spans += _account(program, records, with_spans=True)[0]
    spans.sort(key=lambda s: (s.rank, s.start_s, s.stream, s.end_s, s.name))
    return tuple(spans)


def _span(rank: int, action: Action, record: _Record) -> Span:
    if isinstance(action, Compute):
        return Span(
            rank=rank,
            stream=action.stream,
            name=action.name,
            kind=action.kind,
            start_s=record.start_s,
            end_s=record.end_s,
        )
    if isinstance(action, Collective):
        return Span(
            rank=rank,
            stream=action.group,
            name=action.name,
            kind="collective",
            start_s=record.start_s,
            end_s=record.end_s,
            size_bytes=action.size_bytes * action.repeat,
            group=action.group,
            op=action.op,
        )
    return Span(
        rank=rank,
        stream="pp",
        name=action.name,
        kind="p2p",
        start_s=record.start_s,
        end_s=record.end_s,
        size_bytes=action.size_bytes,
        group="pp",
    )


def _on_host(action: Action) -> bool:
    """Whether ``action`` is host-thread work (``Compute`` on ``stream="host"``)."""
    return isinstance(action, Compute) and action.stream == "host"


def _wait_owner(
    action: Action, record: _Record, since_s: float, ready_s: float
) -> tuple[str, float]:
    """Which bucket a compute wait on ``action`` belongs to, and from when it counts: a
    collective from when its dependencies were done (``ready_s``; time queued behind earlier
    calls of its group is waiting on that group too)."""
    if isinstance(action, Collective):
        owner = "optimizer" if action.phase == "optimizer" else action.group
        return owner, max(since_s, min(ready_s, record.issue_s))
    if isinstance(action, Transfer):
        return "pp", max(since_s, record.start_s)
    if action.stream == "host":
        # the host thread was behind: what delayed it is its share, but for the collectives it
        # waited for (``_feeding_copies``), charged first as they ended first
        return "host", since_s
    return "", record.end_s


def _account(
    program: Program, records: list[_Record], *, with_spans: bool = False
) -> tuple[list[Span], RankTimes]:
    """The split of one rank's compute-stream time, and with ``with_spans`` its spans."""
    rank, actions = program.rank, program.actions
    spans = [_span(rank, a, r) for a, r in zip(actions, records, strict=True)] if with_spans else []
    exposed: dict[str, float] = defaultdict(float)
    busy = {"compute": 0.0, "optimizer": 0.0}
    idle = slowed = kernel = 0.0
    free_s = 0.0
    for action, record in zip(actions, records, strict=True):
        if not isinstance(action, Compute) or action.stream != "compute":
            continue
        gap = record.start_s - free_s
        if gap > 0:
            waited = _charge_wait(action, actions, records, free_s, record.start_s, exposed)
            launching = min(record.host_wait_s, gap - waited)  # its host was behind
            if launching > 0:
                exposed["host"] += launching
                waited += launching
            idle += gap - waited
            if waited > 0 and with_spans:
                spans.append(
                    Span(
                        rank=rank,
                        stream="compute",
                        name="wait",
                        kind="wait",
                        start_s=record.start_s - waited,
                        end_s=record.start_s,
                    )
                )
        busy["optimizer" if action.kind == "optimizer" else "compute"] += (
            action.duration_s + record.slowed_s
        )
        slowed += record.slowed_s
        if action.kind != "optimizer":
            kernel += action.duration_s
        if record.host_tail_s > 0:
            exposed["host"] += record.host_tail_s
        free_s = record.end_s
    end_s = max((r.end_s for r in records), default=0.0)
    optimizer_s = busy["optimizer"] + exposed.pop("optimizer", 0.0)
    times = RankTimes(
        end_s=end_s,
        compute_s=busy["compute"],
        optimizer_s=optimizer_s,
        exposed_comm_s=dict(sorted(exposed.items())),
        idle_s=idle,
        overlap_slowdown_s=slowed,
        kernel_s=kernel,
    )
    return spans, times


def _charge_wait(
    action: Compute,
    actions: Sequence[Action],
    records: list[_Record],
    free_s: float,
    start_s: float,
    exposed: dict[str, float],
) -> float:
    """Charge the idle gap before ``action`` to what it waited for; returns time charged.

    The deps are taken in the order they finished: each is charged the part of the gap from
    when it began to hold the compute back (``_wait_owner``) to its end, beyond what earlier
    deps were charged, so a pass blocked first by an all-to-all and then by a receive charges
    each its own share. Host copies a collective waited for (offload: a shard copied to the GPU
    before its all-gather), and what a waited-for copy waited for (the reduce-scatter before a
    gradient's copy to the host), join the deps: each is charged its own part of the wait."""
    charged, cursor = 0.0, free_s
    fed = (c for d in action.deps for c in _feeding_copies(actions, records, d, free_s))
    deps = {*action.deps, *fed}
    for dep in sorted(deps, key=lambda d: (records[d].end_s, -d)):
        end_s = min(records[dep].end_s, start_s)
        if end_s <= cursor:
            continue
        source = dep
        releaser = actions[dep]
        if isinstance(releaser, Collective) and releaser.phase == "p2p" and releaser.deps:
            source = releaser.deps[0]  # a scatter-gather receive: count from its transfer
        ready_s = max((records[d].end_s for d in actions[source].deps), default=0.0)
        owner, since_s = _wait_owner(actions[source], records[source], free_s, ready_s)
        begin_s = max(cursor, since_s)
        if owner and end_s > begin_s:
            exposed[owner] += end_s - begin_s
            charged += end_s - begin_s
        cursor = max(cursor, end_s)
    return charged


def _feeding_copies(
    actions: Sequence[Action], records: list[_Record], index: int, free_s: float
) -> list[int]:
    """Host copies (``HOST_OPS``) and host-thread work that collective (or host work) ``index``
    waited for, the collectives and copies before them in such chains (a gradient's copy after
    its reduce-scatter), and the collectives host work waited for, as far back as they still
    ended after ``free_s``."""
    found: list[int] = []
    todo = [index]
    while todo:
        at = todo.pop()
        action = actions[at]
        host = _on_host(action) and at == index  # host work the compute waits for itself
        if not isinstance(action, Collective) and not host:
            continue
        for dep in action.deps:
            feeder = actions[dep]
            if records[dep].end_s <= free_s:
                continue
            if host:  # what host work waited for before it began (a sync on a gather)
                if isinstance(feeder, Collective):
                    found.append(dep)
                continue
            if _on_host(feeder):
                found.append(dep)  # host loops before a collective: charged to the host
                continue
            if not isinstance(feeder, Collective):
                continue
            if feeder.op in HOST_OPS or (isinstance(action, Collective) and action.op in HOST_OPS):
                found.append(dep)
                todo.append(dep)
    return found
