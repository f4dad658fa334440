"""torch's ring attention replayed on a tiny CP layer (h 8, 2 heads, s 16) with hand-timed
kernels (fused attention at 256 FLOP/s, memory passes free) and a network moving 64 bytes a
second: each round's K/V transfer runs beside the previous round's attention."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import simpy

from schedules.actions import CommStep, ComputeStep, ProgramBuilder, Step
from schedules.kernels import Kernel
from schedules.plan import Plan, load_plan
from schedules.resolve import resolve_plan
from sim.compute.compute_model import ComputeModel
from sim.replay.engine import Engine, Timeline
from sim.replay.recipes import layer_recipes, ring_steps, step_costs
from topologies.hardware import GPUS
from vocab.compute_calibration import ComputeCalibration

TINY = {
    "name": "tiny", "num_layers": 2, "hidden_size": 8, "num_heads": 2, "num_kv_heads": 1,
    "ffn_hidden_size": 16, "vocab_size": 32, "seq_len": 16,
}  # fmt: skip


class FlopClock(ComputeModel):
    """Fused attention at 256 FLOP/s; memory-bound kernels and the gaps between kernels take no
    time."""

    def __init__(self) -> None:
        super().__init__(GPUS["h100-sxm"], ComputeCalibration(kernel_gap_s=0.0))

    def kernel_time_s(self, kernel: Kernel) -> float:
        return 0.0 if kernel.kind == "memory" else kernel.flops / 256.0


class ByteClock:
    """Any collective of ``size_bytes`` takes size_bytes / 64 seconds."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env

    def run(self, op: str, ranks: Sequence[int], size_bytes: float) -> simpy.Event:
        return self.env.timeout(size_bytes / 64.0)


def tiny_plan(cp: int, **parallel: Any) -> Plan:
    mapping = {
        "model": TINY,
        "cluster": {"node": "dgx-h100"},
        "parallel": {"cp": cp, "data_parallel": "fsdp2", **parallel},
        "training": {"micro_batch_size": 1, "global_batch_size": 1},
    }
    return resolve_plan(load_plan(mapping), cp)


def replay(plan: Plan, backward: bool = False) -> Timeline:
    """Every CP rank runs one layer's ring pass."""
    steps = ring_steps(plan, FlopClock())[1 if backward else 0]
    group = tuple(range(plan.parallel.cp))
    programs = []
    for rank in group:
        builder = ProgramBuilder(rank=rank, groups={"cp": group})
        builder.run_steps("L", steps)
        programs.append(builder.program())
    env = simpy.Environment()
    return Engine(env, ByteClock(env), programs).run()


def spans(timeline: Timeline) -> dict[str, tuple[float, float]]:
    return {
        s.name: (s.start_s, s.end_s) for s in timeline.spans if s.rank == 0 and s.kind != "wait"
    }


def test_alltoall_sends_round_i_plus_1_beside_round_i() -> None:
    # cp 4: E = 4 tokens x 8 = 32; each K/V block 4E = 128 B (2 s); each round 256 FLOPs (1 s)
    timeline = replay(tiny_plan(4, cp_rotate_method="alltoall"))
    assert spans(timeline) == {
        "L ring kv": (0.0, 0.0),
        "L kv send_recv 1": (0.0, 2.0),
        "L ring 0": (0.0, 1.0),
        "L ring 1 kv": (2.0, 2.0),
        "L kv send_recv 2": (2.0, 4.0),
        "L ring 1": (2.0, 3.0),
        "L ring 2 kv": (4.0, 4.0),
        "L kv send_recv 3": (4.0, 6.0),
        "L ring 2": (4.0, 5.0),
        "L ring 3": (6.0, 7.0),
    }
    assert timeline.ranks[0].exposed_comm_s == {"cp": 3.0}  # 1 s of each 2 s send


def test_allgather_hides_behind_round_0_only() -> None:
    timeline = replay(tiny_plan(4))  # the gather's output: 4 blocks, 512 B, 8 s
    assert spans(timeline) == {
        "L ring kv": (0.0, 0.0),
        "L kv all_gather": (0.0, 8.0),
        "L ring 0": (0.0, 1.0),
        "L ring 1": (8.0, 9.0),
        "L ring 2": (9.0, 10.0),
        "L ring 3": (10.0, 11.0),
    }
    assert timeline.ranks[0].exposed_comm_s == {"cp": 7.0}


def test_backward_sends_dkv_beside_the_next_round_and_waits_for_the_last() -> None:
    # cp 2: E = 64; K/V gather 2 x 256 B (8 s); fp32 dK/dV 512 B (8 s); a round's attention
    # backward 2.5 x 1024 FLOPs (10 s)
    timeline = replay(tiny_plan(2), backward=True)
    assert spans(timeline) == {
        "L ring bwd kv": (0.0, 0.0),
        "L kv all_gather": (0.0, 8.0),
        "L ring bwd 0": (0.0, 10.0),
        "L dkv send_recv 0": (10.0, 18.0),
        "L ring bwd 1": (10.0, 20.0),
        "L ring bwd 1 accumulate": (20.0, 20.0),
        "L dkv send_recv 1": (20.0, 28.0),
        "L ring bwd out": (28.0, 28.0),
    }
    assert timeline.ranks[0].exposed_comm_s == {"cp": 8.0}


def _compute_s(steps: tuple[Step, ...]) -> float:
    return sum(s.duration_s for s in steps if isinstance(s, ComputeStep))


def _exchanges(steps: tuple[Step, ...]) -> list[tuple[str, int]]:
    return [(s.name, s.repeat) for s in steps if isinstance(s, CommStep)]


def test_layer_recipes_place_the_ring_and_keep_the_layer_time() -> None:
    plan = tiny_plan(2, recompute="full")
    compute = ComputeModel(GPUS["h100-sxm"])
    costs = step_costs(plan, compute)
    recipes = layer_recipes(plan, costs, num_layers=3)
    layer = costs.layer
    assert abs(_compute_s(recipes["F"]) - 3 * layer.forward_s) < 1e-15
    backward = layer.backward_input_s + layer.backward_weight_s + layer.recompute_s
    assert abs(_compute_s(recipes["B"]) - 3 * backward) < 1e-15
    ring = [("kv all_gather", 3)]
    assert _exchanges(recipes["F"]) == ring
    # full recompute reruns the forward ring, then the backward ring runs
    assert _exchanges(recipes["B"]) == [
        *ring,
        *ring,
        ("dkv send_recv 0", 3),
        ("dkv send_recv 1", 3),
    ]
    assert _exchanges(recipes["W"]) == []
