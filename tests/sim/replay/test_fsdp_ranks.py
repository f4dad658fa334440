"""FSDP plans without pipelining: FSDP1 and FSDP2 (torchtitan's units), HSDP, reduce dtypes."""

from __future__ import annotations

import pytest

from schedules.actions import Collective
from schedules.arithmetic import layer_params_per_gpu
from schedules.resolve import resolve_plan
from schedules.step import describe_step
from sim.compute.compute_model import ComputeModel
from sim.replay.fsdp_ranks import fsdp2_units
from sim.replay.recipes import step_costs
from sim.replay.simulate import simulate_plan
from sim.replay.step_replay import build_programs
from tests.sim.replay.test_plan_sim import MODEL, plan_of
from topologies.hardware import GPUS


def _collectives(parallel: dict[str, object]) -> list[Collective]:
    plan = resolve_plan(plan_of(parallel), 8)
    program = build_programs(describe_step(plan, gpus_per_node=8), ComputeModel(GPUS["h100-sxm"]))[
        0
    ]
    return [a for a in program.actions if isinstance(a, Collective)]


def test_fsdp2_is_read_as_fsdp_version_2() -> None:
    parallel = plan_of({"data_parallel": "fsdp2"}).parallel
    assert (parallel.data_parallel, parallel.fsdp_version, parallel.fsdp2) == ("fsdp", 2, True)
    assert parallel.reduce_dtype_bytes == 4  # torchtitan's mixed_precision_reduce
    fsdp1 = plan_of({"data_parallel": "fsdp"}).parallel
    assert (fsdp1.fsdp2, fsdp1.reduce_dtype_bytes) == (False, 2)
    with pytest.raises(ValueError, match=r"fsdp2 contradicts parallel\.fsdp_version=1"):
        plan_of({"data_parallel": "fsdp2", "fsdp_version": 1})


def test_fsdp2_reduces_in_fp32_per_layer_unit() -> None:
    layer = layer_params_per_gpu(plan_of({}).model, 1)
    comms = _collectives({"data_parallel": "fsdp2"})
    scatters = {c.name: c.size_bytes for c in comms if c.op == "reduce_scatter"}
    assert scatters["RS L3 mb0"] == pytest.approx(4 * layer)
    gathers = {c.name: c.size_bytes for c in comms if c.op == "all_gather"}
    assert gathers["AG L3 mb0"] == pytest.approx(2 * layer)
    bf16 = _collectives({"data_parallel": "fsdp2", "fsdp_reduce_dtype": "bf16"})
    assert {c.name: c.size_bytes for c in bf16 if c.op == "reduce_scatter"}[
        "RS L3 mb0"
    ] == pytest.approx(2 * layer)
    # 8 layers + embedding + [norm, output]; one micro-batch per rank (16 / 8 / 1 = 2): twice
    assert len(scatters) == 2 * (8 + 2)
    assert "AG head mb0 bwd" not in gathers  # [norm, output] is not resharded after forward
    assert "AG embed mb0 bwd" in gathers


def test_fsdp2_units_add_up_to_the_model() -> None:
    plan = resolve_plan(plan_of({"data_parallel": "fsdp2", "tp": 2}), 8)
    compute = ComputeModel(GPUS["h100-sxm"])
    units = fsdp2_units(describe_step(plan, gpus_per_node=8), step_costs(plan, compute), compute)
    h, v = MODEL["hidden_size"], MODEL["vocab_size"]
    assert [u.name for u in units] == ["embed", *(f"L{i}" for i in range(8)), "head"]
    assert units[0].param_bytes == pytest.approx(2 * v * h / 2)
    assert units[-1].param_bytes == pytest.approx(2 * (v * h / 2 + h))  # output shard + norm
    assert [u.reshard_after_forward for u in units] == [True] * 9 + [False]
    always = resolve_plan(
        plan_of({"data_parallel": "fsdp2", "tp": 2, "fsdp_reshard_after_forward": True}), 8
    )
    assert fsdp2_units(
        describe_step(always, gpus_per_node=8), step_costs(always, compute), compute
    )[-1].reshard_after_forward


def test_fsdp1_and_fsdp2_give_different_steps() -> None:
    one = simulate_plan(plan_of({"data_parallel": "fsdp"}, nodes=2, gbs=32))
    two = simulate_plan(plan_of({"data_parallel": "fsdp2"}, nodes=2, gbs=32))
    assert one.step_time_s != two.step_time_s
    assert one.memory_gib != two.memory_gib


def test_fsdp1_options_are_refused_with_fsdp2() -> None:
    with pytest.raises(ValueError, match="fsdp_limit_all_gathers=False is an FSDP1 option"):
        resolve_plan(plan_of({"data_parallel": "fsdp2", "fsdp_limit_all_gathers": False}), 8)
    with pytest.raises(ValueError, match="fsdp_version=1 cannot run under pipeline"):
        resolve_plan(plan_of({"data_parallel": "fsdp", "fsdp_version": 1, "pp": 2}), 8)
    with pytest.raises(ValueError, match="fsdp_reduce_dtype='fp16' is not one of fp32, bf16"):
        plan_of({"data_parallel": "fsdp2", "fsdp_reduce_dtype": "fp16"})


def test_hsdp_over_fsdp2_reduce_scatters_in_the_node_and_all_reduces_across() -> None:
    plan = resolve_plan(plan_of({"data_parallel": "hsdp", "fsdp_version": 2}, nodes=2, gbs=32), 16)
    program = build_programs(describe_step(plan, gpus_per_node=8), ComputeModel(GPUS["h100-sxm"]))[
        0
    ]
    comms = [a for a in program.actions if isinstance(a, Collective)]
    scatter = next(c for c in comms if c.name == "RS L3 mb0")
    across = next(c for c in comms if c.name == "AR L3 mb0")
    assert len(scatter.ranks) == 8 and len(across.ranks) == 2
    assert across.size_bytes == pytest.approx(scatter.size_bytes / 8)  # the fp32 shard
    assert comms[-1].name == "AR grad norm" and len(comms[-1].ranks) == 16
