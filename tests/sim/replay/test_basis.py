"""Every prediction says what it rests on, its bottleneck, and HFU next to MFU."""

from __future__ import annotations

import dataclasses

import pytest

from schedules.arithmetic import model_flops_per_step
from schedules.flops import hardware_flops_per_step
from schedules.resolve import resolve_plan
from sim.replay.basis import VALIDATED_ERROR, bottleneck
from sim.replay.result import Breakdown
from sim.replay.simulate import simulate_plan
from tests.sim.replay.test_plan_sim import plan_of
from vocab.compute_calibration import ComputeCalibration


def test_defaults_quote_the_measured_error_of_their_stack(monkeypatch) -> None:
    megatron = simulate_plan(plan_of({"data_parallel": "distributed_optimizer", "tp": 2}))
    assert megatron.basis["stack"] == "megatron"
    for stack, result in (("megatron", megatron), ("eager", simulate_plan(plan_of({"tp": 2})))):
        mape, runs = VALIDATED_ERROR[stack]
        assert result.basis["stack"] == stack
        assert f"off by {mape:.1%} (MAPE) on {runs} published runs" in result.basis["compute"]
        assert "in-step slowdown 18.7%" in result.basis["compute"]
        assert "fitted on the published hopper runs" in result.basis["compute"]
        assert result.basis["network"].startswith("defaults")
    h100 = plan_of({"tp": 2})
    a100 = dataclasses.replace(h100, cluster=dataclasses.replace(h100.cluster, node="dgx-a100"))
    assert (
        "in-step slowdown 10.7% (a factor for multi-GPU plans, fitted on the published ampere"
        in (simulate_plan(a100).basis["compute"])
    )
    monkeypatch.delitem(VALIDATED_ERROR, "eager")
    eager = simulate_plan(plan_of({"tp": 2}))
    assert "no published runs of this stack" in eager.basis["compute"]
    fitted = ComputeCalibration(time_scale=1.2, fitted_on="my 32-GPU run")
    calibrated = simulate_plan(plan_of({"tp": 2}), compute_calibration=fitted)
    assert calibrated.basis["compute"].startswith("calibrated (my 32-GPU run)")
    assert calibrated.to_json()["basis"] == calibrated.basis


def test_hfu_counts_the_recomputation() -> None:
    result = simulate_plan(plan_of({"tp": 2, "recompute": "full"}))
    plan = resolve_plan(plan_of({"tp": 2, "recompute": "full"}), 8)
    ratio = hardware_flops_per_step(plan) / model_flops_per_step(plan)[0]
    assert ratio > 1.2  # a second forward of every layer (not of the LM head)
    assert result.hfu == pytest.approx(result.mfu * ratio)
    assert result.to_json()["hfu"] == result.hfu


def test_the_bottleneck_is_the_largest_share_or_memory() -> None:
    breakdown = Breakdown(
        compute_s=4.0, exposed_comm_s={"dp": 5.0, "tp": 1.0}, bubble_s=0.5, optimizer_s=0.5
    )
    assert bottleneck(breakdown, 11.0, fits=True, pipeline=False) == (
        "exposed dp communication (45% of the step)"
    )
    assert bottleneck(breakdown, 11.0, fits=False, pipeline=False).startswith(
        "memory: the plan does not fit; then exposed dp"
    )
    idle = Breakdown(compute_s=1.0, exposed_comm_s={}, bubble_s=3.0)
    assert bottleneck(idle, 4.0, fits=True, pipeline=True) == "pipeline bubble (75% of the step)"
    assert bottleneck(idle, 4.0, fits=True, pipeline=False) == "waiting (idle) (75% of the step)"


def test_the_breakdown_shows_the_in_step_slowdowns_share_of_compute() -> None:
    # TP 2 with no overlap re-rating: every kernel is (1 + s) x its curve time, so the share the
    # breakdown reports is exactly what the factor added to the compute stream
    plan = plan_of({"tp": 2})
    without = simulate_plan(
        plan, compute_calibration=ComputeCalibration(in_step_slowdown=0.0, overlap_slowdown=0.0)
    )
    with_it = simulate_plan(
        plan, compute_calibration=ComputeCalibration(in_step_slowdown=0.25, overlap_slowdown=0.0)
    )
    assert without.breakdown.in_step_slowdown_s == 0.0
    added = with_it.breakdown.compute_s - without.breakdown.compute_s
    assert with_it.breakdown.in_step_slowdown_s == pytest.approx(added, rel=1e-9)
    assert with_it.breakdown.in_step_slowdown_s == pytest.approx(
        with_it.breakdown.compute_s * 0.25 / 1.25, rel=1e-9
    )
    assert with_it.to_json()["breakdown"]["in_step_slowdown_s"] == pytest.approx(added, rel=1e-9)
    default = simulate_plan(plan)  # multi-GPU defaults: the fitted 0.21
    assert default.breakdown.in_step_slowdown_s > 0.0


TINY = {
    "model": {
        "name": "tiny", "num_layers": 8, "hidden_size": 512, "num_heads": 8,
        "ffn_hidden_size": 1408, "vocab_size": 32000, "seq_len": 256,
    },
    "cluster": {"node": {"base": "dgx-h100", "num_gpus": 1}, "num_nodes": 1},
    "training": {"micro_batch_size": 1, "global_batch_size": 4},
}  # fmt: skip
"""A launch-bound step: 8 small layers, 256 tokens per micro-batch, on one H100."""


def test_a_host_bound_step_says_what_its_launch_cost_rests_on() -> None:
    from schedules.plan import load_plan
    from sim.output.report import headline_lines
    from topologies.hardware import GPUS

    result = simulate_plan(load_plan(TINY))
    share = result.breakdown.host_s / result.step_time_s
    assert share > 0.5  # the step waits on its host
    line = result.basis["host"]
    assert line.startswith("27.6 us per kernel launch (default: one sandboxed H100 machine's;")
    assert "2.30 launches per modelled kernel (the eager/bf16_weights loop's default)" in line
    assert line.endswith(f"the step waits on the host {share:.0%} of its time")
    rows = headline_lines(result, load_plan(TINY), gpu=GPUS["h100-sxm"])
    assert any(row.startswith("Host basis") and line in row for row in rows)
    calibrated = simulate_plan(
        load_plan(TINY),
        compute_calibration=ComputeCalibration(host_s_per_launch=18e-6, fitted_on="step.json"),
    )
    assert calibrated.basis["host"].startswith("18.0 us per kernel launch (calibrated: step.json)")
    assert (
        "launches per modelled kernel (the eager/bf16_weights loop's default)"
        in (calibrated.basis["host"])
    )  # each figure says where it comes from
    assert calibrated.step_time_s < result.step_time_s
    # a GPU-bound step: the launches hide behind the kernels, the report says nothing of them
    busy = {
        **TINY,
        "model": {**TINY["model"], "seq_len": 1024},
        "training": {"micro_batch_size": 16, "global_batch_size": 64},
    }
    assert "host" not in simulate_plan(load_plan(busy)).basis
