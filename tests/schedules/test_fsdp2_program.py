"""FSDP2 (``fully_shard``) programs on hand-timed units (a fake network: 1 byte takes 1 second)."""

from __future__ import annotations

import simpy

from schedules.actions import Collective, ComputeStep
from schedules.fsdp2_program import Fsdp2Rank, Fsdp2Unit, fsdp2_program
from sim.replay.engine import Engine, Timeline
from tests.sim.replay.test_engine import UnitComm, log


def _unit(name: str, size: float, fwd: float, bwd: float, *, reshard: bool = True) -> Fsdp2Unit:
    return Fsdp2Unit(
        name=name,
        param_bytes=size,
        grad_bytes=size,
        forward=(ComputeStep(name="c", duration_s=fwd),),
        backward=(ComputeStep(name="c", duration_s=bwd),),
        reshard_after_forward=reshard,
    )


UNITS = (
    _unit("E", 1, 1, 1),
    _unit("L0", 2, 2, 4),
    _unit("L1", 2, 2, 4),
    _unit("H", 1, 1, 1, reshard=False),
)
"""torchtitan's wrapping in miniature: embedding, two layers, ``[norm, output]``."""


def _replay(spec: Fsdp2Rank) -> Timeline:
    env = simpy.Environment()
    return Engine(env, UnitComm(env), [fsdp2_program(spec)]).run()


def test_one_microbatch_timeline_by_hand() -> None:
    spec = Fsdp2Rank(rank=0, num_microbatches=1, units=UNITS, groups={"dp": (0, 1)})
    got = [span for span in log(_replay(spec)) if span[1] != span[2]]  # drop 0 s copy-outs
    assert got == [
        ("AG E mb0", 0.0, 1.0),
        ("F0 E c", 1.0, 2.0),
        ("AG L0 mb0", 1.0, 3.0),  # the second buffer: no copy-out to wait for
        ("F0 L0 c", 3.0, 5.0),
        ("AG L1 mb0", 3.0, 5.0),  # waited for E's copy-out (t=1), then the FIFO
        ("F0 L1 c", 5.0, 7.0),
        ("AG H mb0", 5.0, 6.0),
        ("F0 H c", 7.0, 8.0),
        ("AG L1 mb0 bwd", 7.0, 9.0),  # prefetched at H's pre-backward (H stays unsharded)
        ("B0 H c", 8.0, 9.0),
        ("B0 L1 c", 9.0, 13.0),
        ("RS H mb0", 9.0, 10.0),
        ("AG L0 mb0 bwd", 10.0, 12.0),  # after L1's copy-out, behind RS H on the FIFO
        ("B0 L0 c", 13.0, 17.0),
        ("RS L1 mb0", 13.0, 15.0),
        ("AG E mb0 bwd", 15.0, 16.0),
        ("B0 E c", 17.0, 18.0),
        ("RS L0 mb0", 17.0, 19.0),
        ("RS E mb0", 19.0, 20.0),
    ]


def test_post_backward_waits_for_the_previous_reduce_scatter() -> None:
    spec = Fsdp2Rank(rank=0, num_microbatches=1, units=UNITS, groups={"dp": (0, 1)})
    actions = fsdp2_program(spec).actions
    index = {a.name: i for i, a in enumerate(actions)}
    # post_backward(L1) makes the compute stream wait for RS(H) before its copy-in; H's own
    # copy-in (nothing reduced before it) waits for nothing but H's backward
    assert index["RS H mb0"] in actions[index["copy-in L1 mb0"]].deps
    assert index["RS L1 mb0"] in actions[index["copy-in L0 mb0"]].deps
    assert actions[index["copy-in H mb0"]].deps == ()  # after B(H) on the same stream
    assert actions[index["RS L1 mb0"]].deps == (index["copy-in L1 mb0"],)


def test_second_microbatch_gathers_again_and_hsdp_all_reduces_each_shard() -> None:
    groups = {"dp": (0, 1), "hsdp": (0, 2), "world": (0, 1, 2, 3)}
    spec = Fsdp2Rank(
        rank=0, num_microbatches=2, units=UNITS, groups=groups, grad_norm_group="world"
    )
    program = fsdp2_program(spec)
    comms = [(a.name, a.op, a.size_bytes) for a in program.actions if isinstance(a, Collective)]
    gathers = [name for name, op, _ in comms if op == "all_gather"]
    # mb1 gathers every unit again: H was resharded after its backward.
    assert gathers == [
        *("AG E mb0", "AG L0 mb0", "AG L1 mb0", "AG H mb0"),
        *("AG L1 mb0 bwd", "AG L0 mb0 bwd", "AG E mb0 bwd"),
        *("AG E mb1", "AG L0 mb1", "AG L1 mb1", "AG H mb1"),
        *("AG L1 mb1 bwd", "AG L0 mb1 bwd", "AG E mb1 bwd"),
    ]
    reduces = [(name, size) for name, op, size in comms if op == "all_reduce"]
    assert reduces[:2] == [("AR H mb0", 0.5), ("AR L1 mb0", 1.0)]  # the shard: size / 2
    assert reduces[-1] == ("AR grad norm", 8.0)
    assert len(reduces) == 2 * 4 + 1
    optimizer = program.actions[-1]
    assert optimizer.name == "optimizer"
    assert optimizer.deps[-1] == len(program.actions) - 2  # after the grad-norm all-reduce
    # finalize_backward: mb1's first compute waits for every reduction of mb0, all-reduces too
    actions = program.actions
    first_mb1 = next(i for i, a in enumerate(actions) if a.name.startswith("copy-out E mb1"))
    mb0 = [i for i, a in enumerate(actions) if isinstance(a, Collective) and "mb0" in a.name
           and a.op in ("reduce_scatter", "all_reduce")]  # fmt: skip
    assert set(mb0) <= set(actions[first_mb1].deps)
