"""Megatron's block recompute (``recompute_num_layers``): only the first N layers of a chunk
rerun their forward; the others keep their activations. Closed forms on one GPU."""

from __future__ import annotations

from typing import Any

import pytest

from schedules.arithmetic import model_flops_per_step
from schedules.flops import hardware_flops_per_step, layers_forward_flops
from schedules.memory import activation_bytes
from schedules.plan import load_plan
from schedules.resolve import resolve_plan
from sim.compute.compute_model import ComputeModel
from sim.replay.recipes import kept_plan
from sim.replay.simulate import simulate_plan
from topologies.presets import build_cluster
from vocab.compute_calibration import ComputeCalibration

MODEL = {
    "name": "tiny", "num_layers": 4, "hidden_size": 1024, "num_heads": 16, "num_kv_heads": 4,
    "ffn_hidden_size": 2816, "vocab_size": 32000, "seq_len": 1024,
}  # fmt: skip
FREE = ComputeCalibration(host_s_per_launch=0.0)  # kernels only: the closed form


def plan_of(**parallel: Any) -> Any:
    raw = {
        "model": MODEL,
        "cluster": {"node": {"base": "dgx-h100", "num_gpus": 1}, "num_nodes": 1},
        "parallel": {"recompute": "full", **parallel},
        "training": {"micro_batch_size": 1, "global_batch_size": 2},
    }
    return resolve_plan(load_plan(raw), 1)


def test_only_the_first_layers_rerun_their_forward() -> None:
    plan = plan_of(recompute_num_layers=1)
    result = simulate_plan(plan, compute_calibration=FREE)
    compute = ComputeModel(build_cluster("dgx-h100").gpu_spec(0), FREE, distributed=False)
    full, kept = compute.layer_times(plan), compute.layer_times(kept_plan(plan))
    embed, head = compute.embedding_times(plan), compute.head_times(plan)
    per_microbatch = (
        full.forward_s + full.recompute_s + full.backward_s  # the recomputed layer
        + 3 * (kept.forward_s + kept.backward_s)  # three keep their activations
        + embed.forward_s + embed.backward_s + head.forward_s + head.backward_s
    )  # fmt: skip
    assert full.recompute_s == pytest.approx(full.forward_s)
    assert result.breakdown.compute_s == pytest.approx(2 * per_microbatch, rel=1e-9)
    every = simulate_plan(plan_of(), compute_calibration=FREE)
    assert result.breakdown.compute_s == pytest.approx(
        every.breakdown.compute_s - 2 * 3 * full.recompute_s, rel=1e-9
    )


def test_activations_and_hardware_flops_scale_with_the_recomputed_share() -> None:
    every, none = plan_of(), plan_of(recompute="none")
    acts = [activation_bytes(plan_of(recompute_num_layers=n), 0) for n in range(5)]
    assert acts[0] == pytest.approx(activation_bytes(none, 0))  # nothing recomputed
    assert acts[4] == pytest.approx(activation_bytes(every, 0))  # every layer: full recompute
    # each recomputed layer stores its input instead of everything: linear in N from N = 1
    # (from N = 1 the layer being recomputed also holds its activations once)
    steps = [acts[n + 1] - acts[n] for n in range(1, 4)]
    assert steps[0] < 0 and steps[1] == pytest.approx(steps[0]) == pytest.approx(steps[2])
    half = plan_of(recompute_num_layers=2)
    flops, _ = model_flops_per_step(half)
    rerun = layers_forward_flops(half.model, 2, causal=True)
    assert hardware_flops_per_step(half) == pytest.approx(flops + rerun / 2)
    assert hardware_flops_per_step(every) == pytest.approx(flops + rerun)


@pytest.mark.parametrize(
    ("parallel", "message"),
    [
        ({"recompute": "selective", "recompute_num_layers": 2}, "needs recompute full"),
        ({"recompute_num_layers": -1}, "needs recompute full and a count >= 0"),
        ({"recompute_num_layers": 2, "data_parallel": "fsdp"}, "block recompute"),
    ],
)
def test_block_recompute_is_refused_where_it_does_not_apply(
    parallel: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        plan_of(**parallel)
