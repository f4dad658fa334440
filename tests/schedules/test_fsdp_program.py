"""FSDP1 step programs: forward prefetch through the rate limiter, and the grad-norm all-reduce."""

from __future__ import annotations

from dataclasses import replace

import pytest
import simpy

from schedules.actions import GRAD_NORM_BYTES, ChunkWork, Collective, Compute, ComputeStep, Program
from schedules.fsdp_program import FsdpRank, FsdpUnits, fsdp_program
from sim.replay.engine import Engine
from tests.sim.replay.test_engine import UnitComm

LAYER = ChunkWork(
    forward=(ComputeStep(name="fwd", duration_s=1.0),),
    backward=(ComputeStep(name="bwd", duration_s=2.0),),
)


def spec(num_units: int = 3, **overrides: object) -> FsdpRank:
    """Rank 0 of a 2-way shard group; one micro-batch; no embedding or head compute."""
    units = FsdpUnits(
        num_units=num_units,
        layer=LAYER,
        unit_param_bytes=1.0,
        unit_grad_bytes=1.0,
        root_param_bytes=1.0,
        root_grad_bytes=1.0,
    )
    base = FsdpRank(rank=0, num_microbatches=1, units=units, groups={"dp": (0, 1)})
    return replace(base, **overrides)  # type: ignore[arg-type]


def names(program: Program) -> list[str]:
    return [a.name for a in program.actions]


BACKWARD = [
    "AG u2 mb0 bwd",
    "AG u1 mb0 bwd", "B0 u2 bwd", "RS u2 mb0",
    "AG u0 mb0 bwd", "B0 u1 bwd", "RS u1 mb0",
    "B0 u0 bwd", "RS u0 mb0",
    "RS root mb0",
    "optimizer",
]  # fmt: skip


def test_without_forward_prefetch_each_unit_gathers_in_its_own_pre_forward() -> None:
    program = fsdp_program(spec())
    assert names(program) == [
        "AG root mb0",
        "AG u0 mb0", "F0 u0 fwd",
        "AG u1 mb0", "F0 u1 fwd",
        "AG u2 mb0", "F0 u2 fwd",
        *BACKWARD,
    ]  # fmt: skip
    index = {name: i for i, name in enumerate(names(program))}
    # Two free events pending (F u0, F u1): the limiter holds AG u2 until F u0 has run.
    assert program.actions[index["AG u2 mb0"]].deps == (index["F0 u0 fwd"],)


def test_forward_prefetch_issues_the_next_gather_before_the_current_forward() -> None:
    program = fsdp_program(spec(forward_prefetch=True))
    assert names(program) == [
        "AG root mb0", "AG u0 mb0",  # the root's pre-forward prefetches u0
        "AG u1 mb0", "F0 u0 fwd",
        "AG u2 mb0", "F0 u1 fwd",
        "F0 u2 fwd",  # nothing after u2 in the forward order
        *BACKWARD,
    ]  # fmt: skip
    # AG u2 is issued before F u1 frees anything: one event pending, no limiter wait.
    index = {name: i for i, name in enumerate(names(program))}
    assert program.actions[index["AG u2 mb0"]].deps == ()


def test_forward_prefetch_keeps_the_collective_order() -> None:
    def collectives(program: Program) -> list[str]:
        return [a.name for a in program.actions if isinstance(a, Collective)]

    expected = [
        "AG root mb0", "AG u0 mb0", "AG u1 mb0", "AG u2 mb0",
        "AG u2 mb0 bwd", "AG u1 mb0 bwd", "RS u2 mb0", "AG u0 mb0 bwd", "RS u1 mb0",
        "RS u0 mb0", "RS root mb0",
    ]  # fmt: skip
    assert collectives(fsdp_program(spec())) == expected
    assert collectives(fsdp_program(spec(forward_prefetch=True))) == expected


@pytest.mark.parametrize(("prefetch", "lag"), [(False, 2), (True, 3)])
def test_limiter_lets_forward_prefetch_run_one_more_gather_ahead(prefetch: bool, lag: int) -> None:
    program = fsdp_program(spec(num_units=6, forward_prefetch=prefetch))
    index = {name: i for i, name in enumerate(names(program))}
    for u in range(6):
        expected = (index[f"F0 u{u - lag} fwd"],) if u >= lag else ()
        assert program.actions[index[f"AG u{u} mb0"]].deps == expected


def test_without_the_limiter_forward_prefetch_changes_only_the_issue_order() -> None:
    plain = fsdp_program(spec(limit_all_gathers=False))
    prefetched = fsdp_program(spec(limit_all_gathers=False, forward_prefetch=True))
    assert names(plain) != names(prefetched)
    assert sorted(timeline(plain)) == sorted(timeline(prefetched))


def test_a_root_without_parameters_prefetches_nothing() -> None:
    rootless = replace(spec().units, root_param_bytes=0.0, root_grad_bytes=0.0)
    program = fsdp_program(spec(units=rootless, forward_prefetch=True))
    assert names(program)[:3] == ["AG u0 mb0", "AG u1 mb0", "F0 u0 fwd"]


def test_grad_norm_all_reduce_waits_for_every_reduction_and_gates_the_optimizer() -> None:
    groups = {"dp": (0, 1), "hsdp": (0, 2), "world": (0, 1, 2, 3)}
    program = fsdp_program(spec(groups=groups, grad_norm_group="world"))
    assert names(program)[9:] == [
        "B0 u2 bwd", "RS u2 mb0", "AR u2 mb0",  # 9, 10, 11
        "AG u0 mb0 bwd", "B0 u1 bwd", "RS u1 mb0", "AR u1 mb0",  # 12 .. 15
        "B0 u0 bwd", "RS u0 mb0", "AR u0 mb0", "RS root mb0", "AR root mb0",  # 16 .. 20
        "AR grad norm", "optimizer",  # 21, 22
    ]  # fmt: skip
    norm, optimizer = program.actions[21:]
    assert isinstance(norm, Collective)
    assert (norm.group, norm.ranks, norm.op) == ("world", (0, 1, 2, 3), "all_reduce")
    assert (norm.size_bytes, norm.phase) == (GRAD_NORM_BYTES, "optimizer")
    # The last backward compute (16) and every RS / AR of the micro-batch.
    assert norm.deps == (10, 11, 14, 15, 16, 17, 18, 19, 20)
    assert isinstance(optimizer, Compute)
    assert optimizer.deps == (10, 11, 14, 15, 17, 18, 19, 20, 21)


def test_no_grad_norm_all_reduce_by_default_and_unknown_group_is_rejected() -> None:
    assert "AR grad norm" not in names(fsdp_program(spec()))
    with pytest.raises(ValueError, match=r"'world'.*\['dp'\]"):
        spec(grad_norm_group="world")


def timeline(program: Program) -> list[tuple[str, float, float]]:
    """(name, start, end) of rank 0's spans; rank 1 of the shard group is not simulated."""
    env = simpy.Environment()
    spans = Engine(env, UnitComm(env), [program]).run().spans
    return [(s.name, s.start_s, s.end_s) for s in spans if s.kind != "wait"]


@pytest.mark.parametrize(
    ("prefetch", "ag_u2", "forward_u2"),
    [
        # F u0 ends at 6 -> AG u2 6..8 -> F u2 8..9
        (False, (6.0, 8.0), (8.0, 9.0)),
        # AG u2 follows AG u1 on the FIFO at 5 -> 5..7 -> F u2 7..8, one second earlier
        (True, (5.0, 7.0), (7.0, 8.0)),
    ],
)
def test_forward_prefetch_hides_a_gather_when_the_compute_stream_lags(
    prefetch: bool, ag_u2: tuple[float, float], forward_u2: tuple[float, float]
) -> None:
    # AG: 2 s per unit, 1 s for the root; F: 1 s per unit after a 4 s embedding forward, which
    # keeps the compute stream behind the gathers so the limiter's wait on F u0 binds.
    units = replace(
        spec().units,
        unit_param_bytes=2.0,
        embed=ChunkWork(forward=(ComputeStep(name="fwd", duration_s=4.0),), backward=()),
    )
    spans = timeline(fsdp_program(spec(units=units, forward_prefetch=prefetch)))
    forward = [s for s in spans if s[0].startswith(("F0", "AG")) and not s[0].endswith("bwd")]
    assert sorted(forward) == sorted(
        [
            ("AG root mb0", 0.0, 1.0),
            ("AG u0 mb0", 1.0, 3.0),
            ("AG u1 mb0", 3.0, 5.0),
            ("F0 embed fwd", 1.0, 5.0),
            ("F0 u0 fwd", 5.0, 6.0),
            ("AG u2 mb0", *ag_u2),
            ("F0 u1 fwd", 6.0, 7.0),
            ("F0 u2 fwd", *forward_u2),
        ]
    )
