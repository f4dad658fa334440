"""A compute calibration fitted to a measured step reproduces that step."""

from __future__ import annotations

import pytest

from schedules.arithmetic import stage_params_per_gpu
from schedules.kernels import gemm, layer_kernels
from schedules.plan import load_plan
from schedules.resolve import resolve_plan
from sim.compute.compute_model import (
    ComputeModel,
    default_efficiency,
    gemm_memsets,
    optimizer_launches,
)
from sim.replay.simulate import simulate_plan
from sim.replay.step_fit import (
    PASS_CLASSES,
    _kernels,
    _unprofiled_idle_share,
    calibration_from_step,
    known_launches,
    modelled_classes_s,
    modelled_launch_count,
)
from topologies.hardware import GPUS
from vocab.compute_calibration import STEP_SCHEMA, ComputeCalibration

H100 = GPUS["h100-sxm"]
PLAN = {
    "model": {
        "name": "m", "num_layers": 2, "hidden_size": 2048, "num_heads": 16, "num_kv_heads": 4,
        "ffn_hidden_size": 5632, "vocab_size": 32000, "seq_len": 2048,
    },
    "cluster": {"node": {"base": "dgx-h100", "num_gpus": 1}, "num_nodes": 1},
    "parallel": {"recompute": "none"},
    "training": {"micro_batch_size": 1, "global_batch_size": 2, "mixed_precision": "autocast"},
}  # fmt: skip
UNIFORM = {f"memory_{k}": default_efficiency(H100, "memory", "bf16") for k in PASS_CLASSES}
"""One memory efficiency for every class: what the fit rescales (the per-class defaults aside)."""


def _measurement(
    gemm: float,
    attention: float,
    memory: float,
    idle: float,
    *,
    num_kernels: int | None = None,
    optimizer_s: float = 0.0,
) -> dict:
    """A synthetic step: each class ``factor`` times slower than the default kernel curves."""
    plan = resolve_plan(load_plan(PLAN), 1)
    isolated = ComputeModel(H100, ComputeCalibration(in_step_slowdown=0.0, efficiency=UNIFORM))
    modelled = modelled_classes_s(plan, isolated, 2)
    classes = {
        "gemm": modelled["gemm"] * gemm,
        "attention": modelled["attention"] * attention,
        "elementwise": modelled["memory"] * memory * 0.75,
        "copy": modelled["memory"] * memory * 0.25,
        "optimizer": optimizer_s,
    }
    busy = sum(classes.values())
    profile: dict = {"classes_s": classes, "busy_s": busy, "idle_s": idle, "wall_s": busy + idle}
    if num_kernels is not None:
        profile["num_kernels"] = num_kernels
    return {
        "schema": STEP_SCHEMA, "gpu": "h100-sxm", "device": "NVIDIA H100 80GB HBM3",
        "plan": PLAN, "microbatches": 2, "measured_layers": 2, "dtype": "bf16",
        "timings_s": {"step": busy + idle}, "profile": profile,
    }  # fmt: skip


def test_each_class_is_rescaled_and_the_optimizer_keeps_its_measured_bytes() -> None:
    params = stage_params_per_gpu(resolve_plan(load_plan(PLAN), 1), 0)
    measurement = _measurement(gemm=1.25, attention=2.0, memory=1.6, idle=0.0, optimizer_s=0.01)
    calibration = calibration_from_step(measurement, H100)
    eff = calibration.efficiency
    assert eff["gemm"] == pytest.approx(default_efficiency(H100, "gemm", "bf16") / 1.25, rel=1e-3)
    assert eff["attention_forward"] == pytest.approx(
        default_efficiency(H100, "attention_forward", "bf16") / 2.0, rel=1e-3
    )
    memory = default_efficiency(H100, "memory", "bf16") / 1.6
    assert eff["memory"] == pytest.approx(memory, rel=1e-3)
    assert calibration.in_step_slowdown == 0.0  # a step already runs in-step
    assert calibration.time_scale == 1.0  # idle time is the host's, not a factor on kernels
    # 10 ms at the fitted memory rate, over the plan's parameters
    moved = 0.01 * H100.hbm_bandwidth_bytes_per_s * memory / params
    assert calibration.optimizer_bytes_per_param == pytest.approx(moved, rel=1e-6)
    assert calibration.host_s_per_launch is None  # GPU-bound: the launches were hidden


def test_a_launch_bound_step_fits_the_host_time_per_launch() -> None:
    plan = resolve_plan(load_plan(PLAN), 1)
    kernels = modelled_launch_count(plan, 2)
    gpu_only = _measurement(1, 1, 1, 0.0)
    busy = gpu_only["timings_s"]["step"]
    assert busy > 0
    # 5 launches per modelled kernel, plus the known ones (the eager rotary's 18 + 24, the
    # grouped-query repeat's 2 + 2 and cuBLAS's 4 memsets per layer and micro-batch, the head's
    # 2 memsets) and fused Adam's launches (one per 320 x 65536 params)
    fused = optimizer_launches(stage_params_per_gpu(plan, 0))
    assert fused == -(-stage_params_per_gpu(plan, 0) // (320 * 65536))
    known = known_launches(plan, 2)
    assert known == ((42 + 4 + 4) * plan.model.num_layers + 2) * 2
    launches = 5 * kernels + known
    measurement = _measurement(1, 1, 1, busy * 2.0, num_kernels=int(launches) + fused)  # idle 2/3
    calibration = calibration_from_step(measurement, H100)
    assert calibration.launches_per_kernel == pytest.approx(5.0)
    host = calibration.host_s_per_launch
    assert host is not None
    # launch-bound: the step is the host's launches, then what the GPU still runs after the
    # last launch (the optimizer step, which launches nothing here)
    step_s = measurement["timings_s"]["step"]
    assert 0.8 * step_s < host * launches < step_s
    result = simulate_plan(load_plan(PLAN), compute_calibration=calibration)
    assert result.step_time_s == pytest.approx(measurement["timings_s"]["step"], rel=1e-6)
    assert result.breakdown.host_s > 0.5 * result.step_time_s


def test_the_profilers_own_idle_time_is_not_read_as_host_time() -> None:
    """A profiled step twice as long as the unprofiled one, its kernels the same: the profile
    says 50 % idle, the measured step 4 % (1 - busy / step); no host cost is fitted from it."""
    plan = resolve_plan(load_plan(PLAN), 1)
    launches = 5 * modelled_launch_count(plan, 2) + known_launches(plan, 2)
    fused = optimizer_launches(stage_params_per_gpu(plan, 0))
    measurement = _measurement(1, 1, 1, 0.0, num_kernels=int(launches) + fused)
    busy = measurement["profile"]["busy_s"]
    measurement["timings_s"]["step"] = busy / 0.96
    measurement["profile"].update(idle_s=busy, wall_s=2 * busy)
    assert _unprofiled_idle_share(measurement["profile"], busy / 0.96) == pytest.approx(0.04)
    assert calibration_from_step(measurement, H100).host_s_per_launch is None
    # the same kernels in a measured step of busy / 0.7 (30 % idle): launch-bound, fitted
    measurement["timings_s"]["step"] = busy / 0.7
    assert calibration_from_step(measurement, H100).host_s_per_launch is not None
    assert _unprofiled_idle_share({"idle_s": 1.0, "wall_s": 2.0}, 1.0) == 0.0  # no busy time
    assert _unprofiled_idle_share({"busy_s": 1.2}, 1.0) == 0.0  # kernels overlapped: not < 0


def test_compiled_elementwise_and_copy_kernels_are_fitted_as_one_class() -> None:
    """Inductor names a fusion after every operator in it (``triton_poi_fused__to_copy_add_...``):
    under the compile stack the profile's elementwise and copy times are one class, fitted on
    their sum; eager keeps them apart."""
    compiled = {**PLAN, "training": {**PLAN["training"], "stack": "compile"}}
    measurement = _measurement(1, 1, 1, 0.0)
    measurement["plan"] = compiled
    classes = measurement["profile"]["classes_s"]
    classes["elementwise"], classes["copy"] = classes["elementwise"] * 0.5, classes["copy"] * 4.0
    measurement["profile"]["busy_s"] = sum(classes.values())
    plan = resolve_plan(load_plan(compiled), 1)
    isolated = ComputeModel(H100, ComputeCalibration(in_step_slowdown=0.0, efficiency=UNIFORM))
    modelled = modelled_classes_s(plan, isolated, 2)
    pooled = modelled["memory_elementwise"] + modelled["memory_copy"]
    expected = (
        default_efficiency(H100, "memory", "bf16")
        * pooled
        / (classes["elementwise"] + classes["copy"])
    )
    eff = calibration_from_step(measurement, H100).efficiency
    assert eff["memory_elementwise"] == pytest.approx(expected, rel=1e-9)
    assert eff["memory_copy"] == pytest.approx(expected, rel=1e-9)
    measurement["plan"] = PLAN  # eager: each from its own time
    eager_plan = resolve_plan(load_plan(PLAN), 1)
    eager_modelled = modelled_classes_s(eager_plan, isolated, 2)
    eager = calibration_from_step(measurement, H100).efficiency
    default = default_efficiency(H100, "memory", "bf16")
    assert eager["memory_copy"] == pytest.approx(
        min(1.5, default * eager_modelled["memory_copy"] / classes["copy"]), rel=1e-9
    )
    assert eager["memory_elementwise"] != pytest.approx(eager["memory_copy"])


def test_efficiency_never_exceeds_the_peak_and_other_gpus_are_refused() -> None:
    fast = calibration_from_step(_measurement(gemm=0.5, attention=1, memory=1, idle=0), H100)
    assert fast.efficiency["gemm"] == 1.0  # twice the default would be above the dense peak
    with pytest.raises(ValueError, match=r"measured on 'h100-sxm'.*not on this plan's 'a100"):
        calibration_from_step(_measurement(1, 1, 1, 0), GPUS["a100-sxm-80gb"])
    with pytest.raises(ValueError, match="schema 'x' is not 'commbench-step/1'"):
        calibration_from_step({"schema": "x"}, H100)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"timings_s": {"step": -1.0}}, "malformed step measurement"),
        ({"microbatches": 0}, "malformed step measurement"),
        ({"profile": {"classes_s": [1]}}, "malformed step measurement"),
        ({"timings_s": {"step": 1e6}}, "outside"),
        ({"dtype": "fp32"}, "measured in fp32"),
    ],
)
def test_malformed_or_foreign_measurements_are_refused(change: dict, message: str) -> None:
    measurement = {**_measurement(1, 1, 1, 0), **change}
    with pytest.raises(ValueError, match=message):
        calibration_from_step(measurement, H100)


def test_the_launches_known_per_kernel_follow_the_loop_and_the_shapes() -> None:
    # per layer: the eager rotary 18 + 24, the 16/4-head repeat 2 + 2, and cuBLAS's memsets
    # before the GEMMs whose output exceeds 2^23 elements (2,048 tokens: fc1 2048 x 11264 in the
    # forward; fc2's input gradient 2048 x 5632; fc1's and fc2's weight gradients), 4; the head
    # (vocabulary 32,000): the forward and the weight gradient, 2
    rope = resolve_plan(load_plan(PLAN), 1)
    assert known_launches(rope, 1) == (42 + 4 + 4) * 2 + 2
    # full recompute reruns the forward: its rotary, repeat and fc1 memset again
    full = resolve_plan(load_plan({**PLAN, "parallel": {"recompute": "full"}}), 1)
    assert known_launches(full, 1) == (42 + 4 + 4 + 18 + 2 + 1) * 2 + 2
    # selective reruns the attention core: its repeat
    selective = resolve_plan(load_plan({**PLAN, "parallel": {"recompute": "selective"}}), 1)
    assert known_launches(selective, 1) == (42 + 4 + 4 + 2) * 2 + 2
    learned = {**PLAN, "model": {**PLAN["model"], "position_embedding": "learned"}}
    assert known_launches(resolve_plan(load_plan(learned), 1), 1) == (4 + 4) * 2 + 2
    # 16 K/V heads: no repeat, but the QKV projection's output (2048 x 6144) and its weight
    # gradient now pass 2^23 elements: 2 more memsets
    mha = {**PLAN, "model": {**PLAN["model"], "num_kv_heads": 16}}
    assert known_launches(resolve_plan(load_plan(mha), 1), 1) == (42 + 4 + 2) * 2 + 2
    # compiled: Inductor's kernels, cuBLAS's memsets stay; bf16 weights: no autocast rotary
    compiled = {**PLAN, "training": {**PLAN["training"], "stack": "compile"}}
    assert known_launches(resolve_plan(load_plan(compiled), 1), 1) == 4 * 2 + 2
    bf16 = {**PLAN, "training": {**PLAN["training"], "mixed_precision": "bf16_weights"}}
    assert known_launches(resolve_plan(load_plan(bf16), 1), 1) == (4 + 4) * 2 + 2
    megatron = {
        **PLAN,
        "training": {k: v for k, v in PLAN["training"].items() if k != "mixed_precision"}
        | {"stack": "megatron"},
    }
    # Megatron: the unfused cross-entropy's small kernels over the targets, 12 + 6
    assert known_launches(resolve_plan(load_plan(megatron), 1), 1) == 12 + 6


def test_the_grouped_query_repeat_launches_before_torchs_ring_too() -> None:
    cp = {
        **PLAN,
        "cluster": {"node": {"base": "dgx-h100", "num_gpus": 2}, "num_nodes": 1},
        "parallel": {"recompute": "none", "cp": 2},
        "training": {**PLAN["training"], "global_batch_size": 1},
    }
    mha = {**cp, "model": {**PLAN["model"], "num_kv_heads": 16}}

    def extra(raw: dict) -> tuple[float, float]:
        kernels = layer_kernels(resolve_plan(load_plan(raw), 2))
        return tuple(  # type: ignore[return-value]
            sum(k.extra_launches for k in phase)
            for phase in (kernels.forward, kernels.backward_input)
        )

    (forward, backward), (mha_forward, mha_backward) = extra(cp), extra(mha)
    assert (forward - mha_forward, backward - mha_backward) == (2, 2)


def test_autocast_casts_each_biased_linears_bias_both_ways() -> None:
    biased = {**PLAN, "model": {**PLAN["model"], "linear_bias": True}}
    kernels = {k.name: k for k in _kernels(resolve_plan(load_plan(biased), 1))}
    assert kernels["weight_cast"].extra_launches == kernels["grad_cast"].extra_launches == 4
    plain = {k.name: k for k in _kernels(resolve_plan(load_plan(PLAN), 1))}
    assert plain["weight_cast"].extra_launches == plain["grad_cast"].extra_launches == 0


@pytest.mark.parametrize(
    ("m", "n", "k", "dtype", "loop", "memsets"),
    [
        (4096, 2048, 1024, "bf16", "eager", 0),  # 2^23 outputs exactly: none
        (4096, 2056, 1024, "bf16", "eager", 1),  # just above
        (8192, 8192, 128256, "bf16", "compile/bf16_weights", 1),
        (8192, 8191, 1024, "bf16", "eager", 0),  # unaligned: CUTLASS, not counted
        (8192, 8192, 1024, "fp8", "eager", 0),  # not measured
        (8192, 8192, 1024, "bf16", "megatron", 0),
    ],
)
def test_cublas_memsets_before_large_aligned_bf16_gemms(
    m: int, n: int, k: int, dtype: str, loop: str, memsets: int
) -> None:
    assert gemm_memsets(gemm("g", m, n, k, dtype), loop) == memsets


def test_the_profiles_gap_between_kernels_is_carried() -> None:
    """A profile's measured gap becomes the calibration's (a file without one, or a GPU profile
    that found no short gap, keeps the default; the CPU's default is none)."""
    measurement = _measurement(1.1, 1.2, 1.3, 0.0)
    assert calibration_from_step(measurement, H100).kernel_gap_s is None
    measurement["profile"]["kernel_gap_s"] = 2.5e-6
    calibration = calibration_from_step(measurement, H100)
    assert calibration.kernel_gap_s == 2.5e-6
    assert ComputeModel(H100, calibration).kernel_gap_s == 2.5e-6
    measurement["profile"]["kernel_gap_s"] = 0.0  # a GPU profile with no short gap: none measured
    assert calibration_from_step(measurement, H100).kernel_gap_s is None
    assert ComputeModel(GPUS["cpu"]).kernel_gap_s == 0.0  # the CPU's operators: back to back
    assert ComputeModel(H100).kernel_gap_s == 1.5e-6
