"""Uneven pipeline stages: Megatron's first/last counts, embedding and loss as layers, lists."""

from __future__ import annotations

import re
from typing import Any

import pytest

from schedules.memory import stage_memory_bytes
from schedules.params import layer_params_per_gpu, stage_params_per_gpu
from schedules.plan import ParallelConfig, load_plan
from schedules.resolve import resolve_plan
from schedules.stages import chunk_layers, rank_layers
from sim.replay.simulate import simulate_plan


def test_even_split_is_the_default() -> None:
    assert chunk_layers(ParallelConfig(pp=4), 32) == (8, 8, 8, 8)
    assert chunk_layers(ParallelConfig(pp=2, vpp=2, schedule="interleaved"), 8) == (2, 2, 2, 2)


def test_llama3_405b_embedding_and_loss_take_a_layer_each() -> None:
    # 126 layers + embedding + loss = 128 slots over 16 x 2 virtual stages = 4 each.
    parallel = ParallelConfig(
        pp=16, vpp=2, schedule="interleaved", embedding_as_layer=True, loss_as_layer=True
    )
    chunks = chunk_layers(parallel, 126)
    assert chunks[0] == 3 and chunks[-1] == 3 and set(chunks[1:-1]) == {4}
    assert rank_layers(parallel, 126) == (7, *[8] * 14, 7)


def test_megatron_first_and_last_stage_counts() -> None:
    parallel = ParallelConfig(pp=4, first_stage_layers=6, last_stage_layers=6)
    assert rank_layers(parallel, 30) == (6, 9, 9, 6)
    assert rank_layers(ParallelConfig(pp=3, last_stage_layers=2), 10) == (4, 4, 2)
    interleaved = ParallelConfig(pp=2, vpp=2, schedule="interleaved", first_stage_layers=2)
    assert chunk_layers(interleaved, 6) == (1, 2, 1, 2)  # rank 0: 1 + 1, rank 1: 2 + 2


def test_explicit_lists_per_rank_or_per_virtual_stage() -> None:
    assert rank_layers(ParallelConfig(pp=4, pipeline_layers=(7, 9, 9, 5)), 30) == (7, 9, 9, 5)
    per_chunk = ParallelConfig(pp=2, vpp=2, schedule="interleaved", pipeline_layers=(1, 2, 0, 1))
    assert chunk_layers(per_chunk, 4) == (1, 2, 0, 1)
    assert rank_layers(per_chunk, 4) == (1, 3)


PLAN: dict[str, Any] = {
    "model": {
        "name": "m", "num_layers": 30, "hidden_size": 1024, "num_heads": 8,
        "ffn_hidden_size": 4096, "vocab_size": 32000, "seq_len": 2048,
    },
    "cluster": {"node": "dgx-h100", "num_nodes": 1},
    "training": {"micro_batch_size": 1, "global_batch_size": 8},
}  # fmt: skip


def _plan(**parallel: Any) -> Any:
    return resolve_plan(load_plan({**PLAN, "parallel": {"pp": 4, **parallel}}), 8)


@pytest.mark.parametrize(
    ("parallel", "message"),
    [
        ({}, "model.num_layers=30 is not divisible by pp*vpp=4"),
        ({"pipeline_layers": [7, 9, 9]}, "has 3 entries; give one per pipeline rank (pp=4)"),
        ({"pipeline_layers": [7, 9, 9, 4]}, "sums to 29 layers, the model has 30"),
        ({"first_stage_layers": 5}, "25 layers do not split evenly over 3"),
        ({"pipeline_layers": [7, 9, 9, 5], "first_stage_layers": 7}, "do not combine it"),
        ({"first_stage_layers": 6, "last_stage_layers": 6, "loss_as_layer": True}, "even split"),
        ({"pipeline_layers": [7, -1, 9, 5]}, "must list integers >= 0"),
        ({"pipeline_layers": "7,9"}, "parallel.pipeline_layers must be"),
        ({"first_stage_layers": -2}, "parallel.first_stage_layers must be >= 0, got -2"),
    ],
)
def test_a_split_that_does_not_add_up_is_one_clear_error(
    parallel: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        _plan(**parallel)


def test_memory_and_parameters_follow_the_split() -> None:
    plan = _plan(first_stage_layers=6, last_stage_layers=6)
    per_layer = layer_params_per_gpu(plan.model, 1)
    middle = stage_params_per_gpu(plan, 1)
    assert middle == pytest.approx(9 * per_layer)
    assert stage_params_per_gpu(plan, 2) == middle
    weights = [stage_memory_bytes(plan, s)["weights"] for s in range(4)]
    assert weights[1] == pytest.approx(9 * per_layer * 2)  # bf16 weights, 9 layers
    # 1F1B: stage 1 keeps 3 micro-batches in flight of 9 layers, stage 3 one of 6.
    acts = [stage_memory_bytes(plan, s)["activations"] for s in range(4)]
    head = acts[3] - acts[1] / (3 * 9) * 6
    assert acts[1] / acts[2] == pytest.approx(3 / 2)
    assert head > 0


def test_a_heavier_last_stage_sets_a_longer_step() -> None:
    # The last stage also runs the LM head and the loss; loading it more lengthens every 1F1B
    # steady-state slot. (A heavy first stage is partly hidden behind its warm-up forwards.)
    balanced = simulate_plan(_plan(pipeline_layers=[8, 8, 7, 7]))
    skewed = simulate_plan(_plan(pipeline_layers=[6, 6, 6, 12]))
    assert skewed.step_time_s > 1.1 * balanced.step_time_s


def test_a_step_of_too_many_micro_batches_is_refused() -> None:
    raw = {**PLAN, "parallel": {"pp": 2}, "model": {**PLAN["model"], "num_layers": 2}}
    raw["training"] = {"micro_batch_size": 1, "global_batch_size": 2**63 - 1}
    with pytest.raises(ValueError, match="at most 65,536 are simulated"):
        resolve_plan(load_plan(raw), 2)
