"""Fitting the compute model to a profiler trace: the measurement it builds, the GEMM match,
the one-GPU slice of a data-parallel plan, and the comparison rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from schedules.arithmetic import stage_params_per_gpu
from schedules.kernels import master_copy_bytes
from schedules.plan import Plan, load_plan
from schedules.resolve import resolve_plan
from sim.compute.compute_model import ComputeModel, optimizer_launches
from sim.replay.simulate import simulate_plan
from sim.replay.step_fit import known_launches, modelled_launch_count
from sim.replay.trace_compare import class_rows, collective_rows, phase_rows
from sim.replay.trace_fit import compute_slice, fit_trace, match_gemms, repeat_mismatch
from topologies.hardware import GPUS
from vocab.trace_summary import CollectiveKernels, read_step

TRACES = Path(__file__).resolve().parents[3] / "refdata" / "h100" / "traces"
H100 = GPUS["h100-sxm"]


@pytest.fixture(scope="module")
def small() -> tuple:
    step = read_step(TRACES / "trace_small-h1024-s1024-b4.json.gz")
    return step, load_plan(TRACES / "plan_small-h1024-s1024-b4.yaml")


def test_a_trace_becomes_a_step_measurement_and_a_calibration(small: tuple) -> None:
    step, plan = small
    fit = fit_trace(step, plan, H100, step_time_s=0.058, source_plan="small")
    assert fit.measurement["microbatches"] == 4 and fit.measurement["timings_s"]["step"] == 0.058
    assert fit.measurement["profile"]["num_kernels"] == step.num_kernels == 1776
    assert fit.step_time_from == "--step-time"
    assert "trace_small-h1024-s1024-b4.json.gz" in fit.calibration.fitted_on
    resolved = resolve_plan(plan, 1)
    fused = optimizer_launches(stage_params_per_gpu(resolved, 0))
    assert fused == 10  # the trace's FusedOptimizerTensorListMetadata launches
    # cuBLAS's memsets, as many as the trace's (104): the QKV and fc1 forward GEMMs and fc2's
    # input gradient of every layer (4,096 tokens: 12.6 M, 33.6 M and 16.8 M outputs, above
    # 2^23), and the head's forward and weight gradient, in 4 micro-batches
    assert known_launches(resolved, 4) == (3 * 8 + 2) * 4 == 104
    per_kernel = (1776 - fused - 104) / modelled_launch_count(resolved, 4)
    assert fit.calibration.launches_per_kernel == pytest.approx(per_kernel)
    assert fit.placed_share == 1.0
    assert (fit.gemms.num_matched, fit.gemms.num_shaped, fit.gemms.num_modelled) == (396, 396, 396)
    # without a step time the profiled wall time is fitted, and said so
    profiled = fit_trace(step, plan, H100)
    assert profiled.step_time_s == step.wall_s and "profiled" in profiled.step_time_from
    # ... and no host cost: the profiled wall holds the profiler's own host time (20.7 % idle
    # here, where the unprofiled step is 6.4 %); a launch-bound step time does fit one
    assert step.idle_s / step.wall_s > 0.2 and profiled.calibration.host_s_per_launch is None
    assert fit_trace(step, plan, H100, step_time_s=0.070).calibration.host_s_per_launch


def test_a_data_parallel_traces_communication_is_not_its_compute(small: tuple) -> None:
    """The step fitted is the traced one less the time only NCCL ran; the busy time is the
    rank's own kernels, not the collectives', or the idle share would read short."""
    step, plan = small
    alone = fit_trace(step, plan, H100, step_time_s=0.070)
    exposed = 0.020  # 20 ms of communication alone, on the GPU's busy time and the step's
    dp = dataclasses.replace(
        step,
        busy_s=step.busy_s + exposed,
        wall_s=step.wall_s + exposed,
        communication_only_s=step.communication_only_s + exposed,
    )
    fit = fit_trace(dp, plan, H100, step_time_s=0.070 + exposed)
    assert fit.measurement["profile"]["busy_s"] == pytest.approx(
        alone.measurement["profile"]["busy_s"]
    )
    assert fit.calibration.host_s_per_launch == pytest.approx(
        alone.calibration.host_s_per_launch, rel=1e-9
    )


def test_a_trace_of_another_model_matches_none_of_the_plans_gemms(small: tuple) -> None:
    step, _ = small
    other = resolve_plan(load_plan(TRACES / "plan_llama1b-s4096-b2.yaml"), 1)
    match = match_gemms(step, other)
    assert match.num_matched == 0 and match.rate == 0.0 and not match.matches


def _on_eight_gpus(plan: Plan) -> Plan:
    """The plan as DDP over a DGX H100, each rank still running 4 micro-batches."""
    cluster = dataclasses.replace(plan.cluster, node="dgx-h100")
    training = dataclasses.replace(plan.training, global_batch_size=128)
    return dataclasses.replace(plan, cluster=cluster, training=training)


def test_a_data_parallel_plan_is_fitted_on_its_one_gpu_slice(small: tuple) -> None:
    _, plan = small
    ddp = _on_eight_gpus(plan)
    one = compute_slice(ddp, 8)
    assert one.parallel.dp == 1 and one.training.global_batch_size == 16  # 4 micro-batches
    tp = dataclasses.replace(ddp, parallel=dataclasses.replace(ddp.parallel, tp=2))
    with pytest.raises(ValueError, match="tp=2"):
        compute_slice(tp, 8)


def test_the_comparison_rows_line_up_with_the_trace(small: tuple) -> None:
    step, plan = small
    fit = fit_trace(step, plan, H100, step_time_s=0.058)
    classes = class_rows(step, resolve_plan(plan, 1), H100, fit.calibration)
    by_name = {row.what: row for row in classes}
    assert by_name["gemm"].predicted_s == pytest.approx(step.classes_s["gemm"])  # fitted
    result = simulate_plan(plan, compute_calibration=fit.calibration)
    phases = {row.what: row for row in phase_rows(step, result, 0.058)}
    assert phases["step"].predicted_s == result.step_time_s and phases["step"].traced_s == 0.058
    # the passes' traced kernels with the trace's own gap before each, as the replay prices them
    assert 1e-6 < step.kernel_gap_s < 3e-6
    gaps = {p: step.phase_kernels[p] * step.kernel_gap_s for p in ("forward", "backward")}
    for phase, gap in gaps.items():
        assert phases[phase].traced_s == pytest.approx(step.phases_s[phase] + gap)
    idle = 0.058 - step.busy_s - sum(gaps.values())
    assert phases["idle (host, waits)"].traced_s == pytest.approx(max(idle, 0.0))
    # the traced optimizer phase is fused Adam alone; the prediction adds the bf16 / fp32
    # master copies (12 bytes per parameter) at the fit's copy rate
    resolved = resolve_plan(plan, 1)
    params = stage_params_per_gpu(resolved, 0)
    assert master_copy_bytes(resolved, params) == 12 * params
    copies_s = ComputeModel(H100, fit.calibration).memory_time_s(12 * params, "copy")
    traced = step.phases_s["optimizer"] + copies_s
    assert phases["optimizer"].predicted_s == pytest.approx(traced, rel=0.01)
    assert collective_rows(step, result) == []


def test_traced_collectives_sit_beside_the_simulated_ones(small: tuple) -> None:
    step, plan = small
    ddp = _on_eight_gpus(plan)
    result = simulate_plan(ddp)
    traced = dataclasses.replace(step, collectives={
        "all_reduce": CollectiveKernels(count=3, time_s=0.002, size_bytes=1e8)})  # fmt: skip
    (row,) = collective_rows(traced, result)
    simulated = [s for s in result.spans if s.rank == 0 and s.kind == "collective"]
    assert row.what == "all_reduce" and row.traced_count == 3
    assert row.predicted_count == len(simulated) > 0
    assert row.predicted_bytes == pytest.approx(sum(s.size_bytes for s in simulated))


def test_the_traced_attention_heads_say_whether_the_plan_should_repeat_k_and_v() -> None:
    step = read_step(TRACES / "trace_llama1b-s4096-b2.json.gz")
    assert step.attention_heads == (32, 8)  # SDPA given the 8 K/V heads (enable_gqa)
    plan = resolve_plan(load_plan(TRACES / "plan_llama1b-s4096-b2.yaml"), 1)
    assert plan.training.repeat_kv is False and repeat_mismatch(step, plan) is None
    repeating = dataclasses.replace(
        plan, training=dataclasses.replace(plan.training, repeat_kv=True)
    )
    line = repeat_mismatch(step, repeating)
    assert line is not None and "set training.repeat_kv: false" in line
    # a trace whose attention got K and V repeated to every head, against a plan without it
    repeated = dataclasses.replace(step, attention_heads=(32, 32))
    assert "set it true" in (repeat_mismatch(repeated, plan) or "")
    assert repeat_mismatch(dataclasses.replace(step, attention_heads=None), repeating) is None


def test_a_multi_head_trace_has_as_many_k_v_heads_as_queries(small: tuple) -> None:
    step, plan = small
    assert step.attention_heads == (16, 16)
    assert repeat_mismatch(step, resolve_plan(plan, 1)) is None  # no grouping: nothing to say
