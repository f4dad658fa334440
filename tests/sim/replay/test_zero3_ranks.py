"""DeepSpeed ZeRO-3 plans: the model as hooked modules, their work, and what the knobs change."""

from __future__ import annotations

import pytest

from schedules.actions import Collective, ComputeStep
from schedules.arithmetic import stage_params_per_gpu
from schedules.data_parallel.zero3 import ZERO3_PEAK_BUFFERS
from schedules.memory import stage_memory_bytes
from schedules.resolve import resolve_plan
from schedules.step import describe_step
from schedules.zero3_units import zero3_runtime_bytes
from sim.compute.compute_model import ComputeModel
from sim.replay.recipes import step_costs
from sim.replay.simulate import simulate_plan
from sim.replay.step_replay import build_programs
from sim.replay.zero3_ranks import zero3_submodules
from tests.sim.replay.test_plan_sim import plan_of
from topologies.hardware import GPUS

H100 = ComputeModel(GPUS["h100-sxm"])


def _compute_s(steps: tuple) -> float:
    return sum(s.duration_s for s in steps if isinstance(s, ComputeStep))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_modules_hold_the_whole_model_and_its_work(recompute: str) -> None:
    plan = resolve_plan(plan_of({"data_parallel": "zero3", "tp": 2, "recompute": recompute}), 8)
    costs = step_costs(plan, H100)
    subs = zero3_submodules(plan, costs)
    assert sum(s.num_params for s in subs) == pytest.approx(stage_params_per_gpu(plan, 0))
    # the model, embedding and rotary modules; per Llama layer 9 modules with parameters and 4
    # hooked without (the layer, self_attn, mlp, act_fn); final norm and head
    assert len(subs) == 3 + 8 * (9 + 4) + 2
    assert [s.name for s in subs[3:16]] == [
        "L0", "L0.input_norm", "L0.self_attn", "L0.q_proj", "L0.k_proj", "L0.v_proj",
        "L0.o_proj", "L0.post_attn_norm", "L0.mlp", "L0.gate_proj", "L0.mlp.act_fn",
        "L0.up_proj", "L0.down_proj",
    ]  # fmt: skip
    assert sum(_compute_s(s.forward) for s in subs if not s.name.startswith("L")) == (
        pytest.approx(costs.embed.forward_s + costs.head.forward_s)
    )
    layers = [s for s in subs if s.name.startswith("L")]
    forward = sum(_compute_s(s.forward) for s in layers)
    assert forward == pytest.approx(8 * costs.layer.forward_s)
    backward = sum(_compute_s(s.backward) for s in layers)
    expected = costs.layer.backward_input_s + costs.layer.backward_weight_s
    if recompute == "none":
        expected += costs.layer.recompute_s
    assert backward == pytest.approx(8 * expected)  # full: the recompute is a replayed forward


def test_zero3_is_not_fsdp_and_its_knobs_matter() -> None:
    zero3 = simulate_plan(plan_of({"data_parallel": "zero3"}, nodes=2, gbs=32))
    fsdp = simulate_plan(plan_of({"data_parallel": "fsdp"}, nodes=2, gbs=32))
    assert zero3.step_time_s != fsdp.step_time_s and zero3.memory_gib != fsdp.memory_gib
    legacy = simulate_plan(
        plan_of({"data_parallel": "zero3", "zero_fetch": "sync_per_weight"}, nodes=2, gbs=32)
    )
    assert legacy.step_time_s > zero3.step_time_s  # a device sync before every weight


def test_gradients_go_in_reduce_bucket_sized_reduce_scatters() -> None:
    plan = resolve_plan(plan_of({"data_parallel": "zero3", "zero_bucket_elems": 20_000_000}), 8)
    program = build_programs(describe_step(plan, gpus_per_node=8), H100)[0]
    scatters = [
        a for a in program.actions if isinstance(a, Collective) and a.op == "reduce_scatter"
    ]
    vocab_tensor = 32000 * 1024  # the LM head and the embedding go alone: a tensor is not split
    sizes = [a.size_bytes / 2 for a in scatters]
    assert all(size <= 20_000_000 or size == vocab_tensor for size in sizes)
    assert sizes.count(vocab_tensor) == 2 * 2
    # every gradient reduced once per micro-batch (two of them)
    assert sum(sizes) == pytest.approx(2 * stage_params_per_gpu(plan, 0))
    norms = [a.name for a in program.actions if isinstance(a, Collective) and a.op == "all_reduce"]
    assert norms == ["AR grad norm dp"]


def test_memory_counts_zero3s_own_buffers() -> None:
    plan = resolve_plan(plan_of({"data_parallel": "zero3"}), 8)
    runtime = zero3_runtime_bytes(plan, dp=8)
    memory = stage_memory_bytes(plan, 0)
    assert memory["buffers"] == sum(runtime[k] for k in ZERO3_PEAK_BUFFERS)
    assert runtime["ipg_bucket"] == 500_000_000 * 2  # reduce_bucket_size of bf16 gradients
    smaller = resolve_plan(plan_of({"data_parallel": "zero3", "zero_bucket_elems": 1000}), 8)
    assert stage_memory_bytes(smaller, 0)["buffers"] < memory["buffers"]


def test_zero2_and_zero3_are_refused_under_pipelining() -> None:
    with pytest.raises(ValueError, match="incompatible with pipeline parallelism"):
        resolve_plan(plan_of({"data_parallel": "zero3", "pp": 2}), 8)
