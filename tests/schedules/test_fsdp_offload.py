"""FSDP CPU offload on step programs: hand-timed copies around each unit (1 byte takes 1 s)."""

from __future__ import annotations

import dataclasses

import pytest
import simpy

from schedules.actions import ChunkWork, ComputeStep, Program
from schedules.fsdp2_program import Fsdp2Rank, Fsdp2Unit, fsdp2_program
from schedules.fsdp_program import FsdpRank, FsdpUnits, fsdp_program
from schedules.offload import Offload, RankOffload
from sim.replay.engine import Engine, Timeline
from tests.sim.replay.test_engine import UnitComm, log


def host(*, fsdp2: bool = True, pin: bool = True, num_micro: int = 1) -> RankOffload:
    """Offload over a 2-way shard group, gradients reduced in bf16: a unit gathering 2 bytes
    copies its 1-byte bf16 shard's fp32 master (2 bytes) in; a 2-byte reduce-scatter input
    leaves a 0.5-element shard, 2 bytes as fp32, to copy out."""
    offload = Offload(zero_stage=0, optimizer="cpu", param="cpu", pin_memory=pin, fsdp2=fsdp2)
    return RankOffload(offload=offload, shards=2, grad_bytes=2.0, num_micro=num_micro, params=4.0)


def _unit(name: str) -> Fsdp2Unit:
    return Fsdp2Unit(
        name=name,
        param_bytes=2.0,
        grad_bytes=2.0,
        forward=(ComputeStep(name="c", duration_s=4.0),),
        backward=(ComputeStep(name="c", duration_s=8.0),),
    )


def fsdp2(**overrides: object) -> Fsdp2Rank:
    base = Fsdp2Rank(
        rank=0,
        num_microbatches=1,
        units=(_unit("A"), _unit("B")),
        groups={"dp": (0, 1)},
        optimizer_s=5.0,
        offload=host(),
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def _replay(program: Program) -> Timeline:
    env = simpy.Environment()
    return Engine(env, UnitComm(env), [program]).run()


def timed(program: Program) -> list[tuple[str, float, float]]:
    return [span for span in log(_replay(program)) if span[1] != span[2]]  # drop 0 s copies


def test_fsdp2_copies_in_before_each_all_gather_and_out_after_each_reduce_scatter() -> None:
    assert timed(fsdp2_program(fsdp2())) == [
        ("h2d A mb0", 0.0, 2.0),
        ("AG A mb0", 2.0, 4.0),  # waits for its shard on the GPU
        ("h2d B mb0", 2.0, 4.0),  # the copy-in stream: behind A's copy
        ("F0 A c", 4.0, 8.0),
        ("AG B mb0", 4.0, 6.0),
        ("F0 B c", 8.0, 12.0),
        ("h2d B mb0 bwd", 8.0, 10.0),  # gated by B's forward copy-out, as its all-gather
        ("AG B mb0 bwd", 10.0, 12.0),
        ("B0 B c", 12.0, 20.0),
        ("h2d A mb0 bwd", 12.0, 14.0),  # prefetched after B's backward copy-out
        ("AG A mb0 bwd", 14.0, 16.0),
        ("B0 A c", 20.0, 28.0),
        ("RS B mb0", 20.0, 22.0),
        ("d2h B mb0", 22.0, 24.0),  # the fp32 gradient shard, non-blocking
        ("RS A mb0", 28.0, 30.0),
        ("d2h A mb0", 30.0, 32.0),
        ("optimizer", 32.0, 37.0),  # on the CPU, once every shard is there
    ]


def test_fsdp2_pageable_copies_hold_the_host() -> None:
    # non_blocking only into pinned memory: A's backward is issued once B's copy is done
    got = timed(fsdp2_program(fsdp2(offload=host(pin=False))))
    assert got[-5:] == [
        ("d2h B mb0", 22.0, 24.0),
        ("B0 A c", 24.0, 32.0),
        ("RS A mb0", 32.0, 34.0),
        ("d2h A mb0", 34.0, 36.0),
        ("optimizer", 36.0, 41.0),
    ]


def test_fsdp2_later_microbatches_add_on_the_host_and_block() -> None:
    program = fsdp2_program(fsdp2(num_microbatches=2, offload=host(num_micro=2)))
    actions = program.actions
    index = {a.name: i for i, a in enumerate(actions)}
    # micro-batch 0: the next backward does not wait for the copy; micro-batch 1 adds the shard
    # into the CPU gradient (0.5 fp32 elements: 12 bytes each) and holds the host meanwhile
    assert "cpu_add B mb0" not in index
    assert index["d2h B mb0"] not in actions[index["B0 A c"]].deps
    add = actions[index["cpu_add B mb1"]]
    assert (add.op, add.size_bytes, add.deps) == ("cpu_add", 6.0, (index["d2h B mb1"],))
    assert index["cpu_add B mb1"] in actions[index["copy-out A mb1 bwd"]].deps
    # the next reduce-scatter queues behind the copy (the same stream)
    assert index["d2h B mb0"] in actions[index["RS A mb0"]].deps
    assert index["cpu_add A mb1"] in actions[index["optimizer"]].deps


def test_fsdp2_hsdp_copies_after_the_all_reduce_which_queues_behind_them() -> None:
    groups = {"dp": (0, 1), "hsdp": (0, 2)}
    actions = fsdp2_program(fsdp2(groups=groups)).actions
    index = {a.name: i for i, a in enumerate(actions)}
    assert actions[index["d2h B mb0"]].deps == (index["AR B mb0"],)
    assert index["d2h B mb0"] in actions[index["AR A mb0"]].deps
    assert index["d2h B mb0"] not in actions[index["RS A mb0"]].deps


def fsdp1(num_units: int = 3, **overrides: object) -> FsdpRank:
    layer = ChunkWork(
        forward=(ComputeStep(name="fwd", duration_s=1.0),),
        backward=(ComputeStep(name="bwd", duration_s=2.0),),
    )
    units = FsdpUnits(
        num_units=num_units,
        layer=layer,
        unit_param_bytes=2.0,
        unit_grad_bytes=2.0,
        root_param_bytes=2.0,
        root_grad_bytes=2.0,
    )
    base = FsdpRank(
        rank=0,
        num_microbatches=1,
        units=units,
        groups={"dp": (0, 1)},
        optimizer_s=1.0,
        offload=host(fsdp2=False),
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def test_fsdp1_copies_in_before_the_rate_limiter_holds_the_host() -> None:
    actions = fsdp_program(fsdp1()).actions
    index = {a.name: i for i, a in enumerate(actions)}

    def deps(name: str) -> tuple[int, ...]:
        return actions[index[name]].deps

    # pre_unshard issues the copy, then the limiter waits for F u0's free event
    assert deps("h2d u2 mb0") == ()
    assert deps("AG u2 mb0") == (index["F0 u0 fwd"], index["h2d u2 mb0"])
    # the host was held there: the next copy is issued after it; the backward's first
    # all-gather waits for F u1's free event, so the prefetch's copy comes after that one
    assert deps("h2d u2 mb0 bwd") == (index["F0 u0 fwd"],)
    assert deps("AG u2 mb0 bwd") == (index["F0 u1 fwd"], index["h2d u2 mb0 bwd"])
    assert deps("h2d u1 mb0 bwd") == (index["F0 u1 fwd"],)
    # the fp32 gradient shard goes to the host after the reduce-scatter, on its stream
    assert deps("d2h u2 mb0") == (index["RS u2 mb0"],)
    assert index["d2h u2 mb0"] in deps("RS u1 mb0")
    assert index["d2h root mb0"] in deps("optimizer")


def test_fsdp1_timeline_by_hand() -> None:
    assert timed(fsdp_program(fsdp1(num_units=2))) == [
        ("h2d root mb0", 0.0, 2.0),
        ("AG root mb0", 2.0, 4.0),
        ("h2d u0 mb0", 2.0, 4.0),
        ("AG u0 mb0", 4.0, 6.0),
        ("h2d u1 mb0", 4.0, 6.0),
        ("F0 u0 fwd", 6.0, 7.0),
        ("AG u1 mb0", 6.0, 8.0),
        ("h2d u1 mb0 bwd", 6.0, 8.0),  # the root stays gathered: no copy for it
        ("F0 u1 fwd", 8.0, 9.0),
        ("AG u1 mb0 bwd", 8.0, 10.0),
        ("h2d u0 mb0 bwd", 8.0, 10.0),  # BACKWARD_PRE prefetch
        ("B0 u1 bwd", 10.0, 12.0),
        ("AG u0 mb0 bwd", 10.0, 12.0),
        ("B0 u0 bwd", 12.0, 14.0),
        ("RS u1 mb0", 12.0, 14.0),
        ("d2h u1 mb0", 14.0, 16.0),
        ("RS u0 mb0", 16.0, 18.0),  # the post-backward stream: behind u1's copy
        ("d2h u0 mb0", 18.0, 20.0),
        ("RS root mb0", 20.0, 22.0),
        ("d2h root mb0", 22.0, 24.0),
        ("optimizer", 24.0, 25.0),
    ]


def test_fsdp1_offload_refuses_gradient_accumulation() -> None:
    with pytest.raises(ValueError, match="no_sync is not modelled") as error:
        fsdp1(num_microbatches=2)
    assert "\n" not in str(error.value)
