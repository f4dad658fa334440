"""The compute model: roofline limits, shape efficiency, layer times, calibration round trip."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules.flops import layer_flops
from schedules.kernels import (
    elementwise_forward_bytes,
    head_vocab_per_gpu,
    kernel_stack,
    layer_kernels,
    memory,
    weight_cast_bytes,
    weight_gemm_shapes,
)
from schedules.params import layer_params_per_gpu
from schedules.plan import ClusterConfig, ParallelConfig, Plan, TrainingConfig
from sim.compute.compute_model import (
    CAST_EFFICIENCY,
    ELEMENTWISE_EFFICIENCY,
    FLASH2_BACKWARD_ON_HOPPER,
    FLASH2_ON_HOPPER,
    IN_STEP_SLOWDOWN,
    IN_STEP_SLOWDOWN_ELSEWHERE,
    KERNEL_GAP_S,
    LAUNCHES_PER_KERNEL,
    MOVE_EFFICIENCY,
    ROWWISE_SCALED_MM,
    UNALIGNED_GEMM,
    ComputeModel,
    attention_head_dim_factor,
    gemm_alignment,
    known_launches,
)
from tests.model_configs import LLAMA3_70B
from topologies.hardware import GPUS
from vocab.compute_calibration import (
    ComputeCalibration,
    KernelFit,
    fit_kernel,
    load_compute_calibration,
    save_compute_calibration,
)

H100 = GPUS["h100-sxm"]
A100 = GPUS["a100-sxm-80gb"]
REPO = Path(__file__).resolve().parents[3]
ISOLATED = ComputeCalibration(in_step_slowdown=0.0)
"""The kernel curves as they are, without the in-step slowdown."""


def plan(**parallel: object) -> Plan:
    """The Llama plan with some parallel keys (unresolved is fine for compute)."""
    precision = str(parallel.pop("precision", "bf16"))
    flash = bool(parallel.pop("flash_attention", True))
    stack = str(parallel.pop("stack", "megatron"))
    return Plan(
        model=LLAMA3_70B,
        cluster=ClusterConfig(node="dgx-h100"),
        parallel=ParallelConfig(**parallel),  # type: ignore[arg-type]
        training=TrainingConfig(
            micro_batch_size=1,
            global_batch_size=64,
            precision=precision,
            flash_attention=flash,
            stack=stack,
        ),
    )


def test_large_gemm_reaches_published_fraction_of_peak() -> None:
    n = 8192
    h100 = ComputeModel(H100, ISOLATED)
    achieved = 2 * n**3 / h100.gemm_time_s(n, n, n) / H100.peak_flops_per_s["bf16"]
    assert achieved == pytest.approx(0.82 * (n / (n + 128)) ** 3)
    assert 0.75 <= achieved <= 0.80
    a100 = ComputeModel(A100, ISOLATED)
    achieved_a100 = 2 * n**3 / a100.gemm_time_s(n, n, n) / A100.peak_flops_per_s["bf16"]
    assert 0.80 <= achieved_a100 <= 0.85


def test_skinny_gemm_is_memory_bound() -> None:
    model = ComputeModel(H100, ISOLATED)
    m, n, k = 1, 8192, 8192
    operand_bytes = 2 * (m * k + k * n) + 2 * m * n
    expected = operand_bytes / (H100.hbm_bandwidth_bytes_per_s * 0.80)
    assert model.gemm_time_s(m, n, k) == pytest.approx(expected)


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 2048).map(lambda x: 8 * x),
    n=st.integers(1, 2048).map(lambda x: 8 * x),
    k=st.integers(1, 2048).map(lambda x: 8 * x),
    grow=st.integers(1, 512).map(lambda x: 8 * x),
    axis=st.integers(0, 2),
)
def test_gemm_time_grows_and_never_beats_peak(m: int, n: int, k: int, grow: int, axis: int) -> None:
    """Among aligned shapes (multiples of 8 bf16 elements) a bigger GEMM never takes less."""
    model = ComputeModel(H100)
    time_s = model.gemm_time_s(m, n, k)
    assert 2 * m * n * k / time_s <= H100.peak_flops_per_s["bf16"]
    bigger = [m, n, k]
    bigger[axis] += grow
    assert model.gemm_time_s(bigger[0], bigger[1], bigger[2]) >= time_s


def test_fp8_speeds_up_only_the_gemms() -> None:
    model = ComputeModel(H100)
    bf16 = model.layer_times(plan(tp=4))
    fp8 = model.layer_times(plan(tp=4, precision="fp8"))
    assert fp8.forward_s < bf16.forward_s
    assert fp8.backward_weight_s < bf16.backward_weight_s
    # The selective recompute is the attention core, which stays in bf16.
    selective_bf16 = model.layer_times(plan(tp=4, recompute="selective"))
    selective_fp8 = model.layer_times(plan(tp=4, recompute="selective", precision="fp8"))
    assert selective_fp8.recompute_s == selective_bf16.recompute_s > 0


def test_rowwise_forward_gemms_run_at_the_cutlass_kernel_speed() -> None:
    """torchao's rowwise recipe on the same plan: the forward GEMMs take 1 / ROWWISE_SCALED_MM
    of tensorwise's time (pytorch/pytorch#147971), the backward GEMMs the same (cuBLAS)."""
    model = ComputeModel(H100, ISOLATED)
    base = plan(tp=4, precision="fp8", stack="compile")
    tensorwise, rowwise = (
        layer_kernels(
            dataclasses.replace(
                base, training=dataclasses.replace(base.training, float8_recipe=recipe)
            )
        )
        for recipe in ("tensorwise", "rowwise")
    )
    for name in ("qkv", "proj", "fc1", "fc2"):
        (tw,) = (k for k in tensorwise.forward if k.name == name)
        (rw,) = (k for k in rowwise.forward if k.name == name)
        assert model.kernel_time_s(rw) == pytest.approx(model.kernel_time_s(tw) / 0.90)
        dgrad = f"{name}_dgrad"
        (tw_d,) = (k for k in tensorwise.backward_input if k.name == dgrad)
        (rw_d,) = (k for k in rowwise.backward_input if k.name == dgrad)
        assert model.kernel_time_s(rw_d) == model.kernel_time_s(tw_d)
    assert ROWWISE_SCALED_MM == 0.90
    assert model.price(rowwise.forward) > model.price(tensorwise.forward)


def test_layer_times_structure() -> None:
    model = ComputeModel(H100)
    base = plan(tp=4, sequence_parallel=True)
    times = model.layer_times(base)
    wgrad = sum(model.gemm_time_s(k, n, m) for m, n, k in weight_gemm_shapes(base))
    gaps = model.launch_count(layer_kernels(base).backward_weight, "megatron") * KERNEL_GAP_S
    assert times.backward_weight_s == pytest.approx(wgrad + gaps * model.time_factor)
    assert times.recompute_s == 0.0
    full = model.layer_times(
        dataclasses.replace(base, parallel=ParallelConfig(tp=4, recompute="full"))
    )
    assert full.recompute_s == full.forward_s
    attention_fwd = model.attention_time_s(
        batch=1, num_heads=16, seq_q=8192, seq_kv=8192, head_dim=128, causal=True
    )
    selective_plan = plan(tp=4, recompute="selective")
    selective = model.layer_times(selective_plan)
    core = layer_kernels(selective_plan).recompute
    core_gaps = model.launch_count(core, "megatron") * KERNEL_GAP_S * model.time_factor
    assert selective.recompute_s == pytest.approx(attention_fwd + core_gaps)
    # Model-FLOP throughput of the layer is a sensible fraction of the bf16 peak.
    flops = layer_flops(LLAMA3_70B, 1, tp=4)
    rate = flops.forward / times.forward_s / H100.peak_flops_per_s["bf16"]
    assert 0.5 < rate < 0.8


def test_every_launch_leaves_the_gpu_the_measured_gap() -> None:
    """Each launch costs the GPU 1.5 us before the kernel runs (``KERNEL_GAP_S``): Megatron's
    2.61 launches per modelled kernel and cuBLAS's memsets; a calibration's measured gap
    replaces it."""
    model = ComputeModel(H100, ISOLATED)
    base = plan(tp=4)
    wgrad = layer_kernels(base).backward_weight
    assert len(wgrad) == 4  # QKV, projection, fc1, fc2
    memsets = sum(known_launches(k, "megatron") for k in wgrad)
    launches = 4 * LAUNCHES_PER_KERNEL["megatron"] + memsets
    assert model.launch_count(wgrad, "megatron") == pytest.approx(launches)
    expected = model.price(wgrad) + launches * 1.5e-6
    assert model.layer_times(base).backward_weight_s == pytest.approx(expected)
    assert KERNEL_GAP_S == 1.5e-6
    measured = ComputeModel(H100, ComputeCalibration(in_step_slowdown=0.0, kernel_gap_s=3e-6))
    assert measured.layer_times(base).backward_weight_s == pytest.approx(
        model.price(wgrad) + launches * 3e-6
    )
    slowed = ComputeModel(H100, ComputeCalibration(in_step_slowdown=0.25))  # scales both alike
    assert slowed.layer_times(base).backward_weight_s == pytest.approx(1.25 * expected)
    none = ComputeModel(H100, ComputeCalibration(in_step_slowdown=0.0, kernel_gap_s=0.0))
    assert none.layer_times(base).backward_weight_s == pytest.approx(model.price(wgrad))
    with pytest.raises(ValueError, match=re.escape("kernel_gap_s must be a number in [0, 0.0001]")):
        ComputeCalibration(kernel_gap_s=0.5)


def test_the_h200_runs_elementwise_kernels_at_its_measured_share() -> None:
    """On the H200 the elementwise class runs at 0.678 of 4.8 TB/s (the H100's default scaled
    by the two GPUs' probe ratio); its loss kernels keep the default, its casts their own."""
    h200 = ComputeModel(GPUS["h200"], ISOLATED)
    assert ELEMENTWISE_EFFICIENCY == {"h200": 0.678}
    assert h200.memory_time_s(1e9, "elementwise") == pytest.approx(1e9 / (4.8e12 * 0.678))
    assert h200.memory_time_s(1e9, "loss") == pytest.approx(1e9 / (4.8e12 * 0.80))
    assert h200.memory_time_s(1e9, "copy") == pytest.approx(1e9 / (4.8e12 * 0.51))
    h100 = ComputeModel(H100, ISOLATED)
    assert h100.memory_time_s(1e9, "elementwise") == pytest.approx(1e9 / (3.35e12 * 0.80))


def test_more_tensor_parallelism_means_less_time_per_gpu() -> None:
    model = ComputeModel(H100)
    times = [model.layer_times(plan(tp=t)).forward_s for t in (1, 2, 4, 8)]
    assert times == sorted(times, reverse=True)
    assert times[0] / times[3] > 6  # near-linear: GEMMs stay large


def test_eager_attention_is_slower_than_fused() -> None:
    model = ComputeModel(H100)
    fused = model.layer_times(plan(tp=8))
    eager = model.layer_times(plan(tp=8, flash_attention=False))
    assert eager.forward_s > fused.forward_s


def test_head_embedding_and_optimizer_times() -> None:
    model = ComputeModel(H100, ISOLATED)
    head = model.head_times(plan(tp=4))
    assert head_vocab_per_gpu(plan(tp=4)) == 128512 / 4  # Megatron's padding: 251 x 512
    lm_gemm = model.gemm_time_s(8192, 128512 / 4, 8192)
    assert head.forward_s > lm_gemm
    # one weight-gradient GEMM: Megatron's 2.61 launches per kernel (no memsets counted on that
    # stack), each after the GPU's 1.5 us gap
    gap = LAUNCHES_PER_KERNEL["megatron"] * KERNEL_GAP_S
    assert head.backward_weight_s == pytest.approx(model.gemm_time_s(8192, 128512 / 4, 8192) + gap)
    embedding = model.embedding_times(plan(tp=4))
    assert embedding.forward_s == pytest.approx(2 * 2 * 8192 * 8192 / (3.35e12 * 0.8) + gap)
    cast = model.memory_time_s(1e9, "copy")  # casts run at their measured share on Hopper
    assert cast == pytest.approx(1e9 / (3.35e12 * CAST_EFFICIENCY["h100-sxm"]))
    # a copy that converts nothing (a layout copy, a concatenation, a fill) at the fills' rate
    move = model.kernel_time_s(memory("split_grad_cat", 1e9, "copy", converts=False))
    assert move == pytest.approx(1e9 / (3.35e12 * MOVE_EFFICIENCY["h100-sxm"]))
    assert MOVE_EFFICIENCY["h100-sxm"] > CAST_EFFICIENCY["h100-sxm"]
    # a calibration's measured copy efficiency prices both alike
    fitted = ComputeModel(
        H100, ComputeCalibration(in_step_slowdown=0.0, efficiency={"memory_copy": 0.5})
    )
    for converts in (True, False):
        kernel = memory("copy", 1e9, "copy", converts=converts)
        assert fitted.kernel_time_s(kernel) == pytest.approx(1e9 / (3.35e12 * 0.5))
    step = model.optimizer_step_s(1e9, grad_bytes_per_param=4)
    assert step == pytest.approx(1e9 * 30 / (3.35e12 * 0.8))


def test_unaligned_gemms_run_at_the_measured_fraction() -> None:
    """A vocabulary of 50257 (odd) or 50258 (even, not a multiple of 8) runs the head GEMM at
    the measured 0.18 / 0.35 of 50304's rate; a vector (m = 1) and fp8 multiples of 16 are fine."""
    model = ComputeModel(H100, ISOLATED)
    rate = lambda n: 2 * 4096 * n * 2560 / model.gemm_time_s(4096, n, 2560)  # noqa: E731
    aligned = rate(50304)
    assert rate(50257) / aligned == pytest.approx(0.18, rel=2e-3)
    assert rate(50258) / aligned == pytest.approx(0.35, rel=2e-3)
    assert gemm_alignment((1, 8192, 8192), "bf16") == 1.0
    assert gemm_alignment((4096, 4104, 4096), "fp8") == UNALIGNED_GEMM[4]  # 8 bytes: below 16
    assert gemm_alignment((4096, 4112, 4096), "fp8") == 1.0
    assert gemm_alignment((4096.5, 4096, 4096), "bf16") == 1.0  # an average count: not judged


def test_attention_pads_the_head_dimension() -> None:
    """Head dimension 80 runs as 96 (80/96 of its rate), times Hopper's fused kernels' measured
    rate at 96 (0.825 forward, 0.885 backward of 128's); FlashAttention-2 only pads."""
    assert attention_head_dim_factor(80, "attention_forward", "cudnn", "hopper") == pytest.approx(
        80 / 96 * 0.825
    )
    assert attention_head_dim_factor(80, "attention_backward", "cudnn", "hopper") == pytest.approx(
        80 / 96 * 0.885
    )
    assert attention_head_dim_factor(112, "attention_forward", "cudnn", "hopper") == pytest.approx(
        112 / 128
    )
    assert attention_head_dim_factor(80, "attention_forward", "flash2", "hopper") == pytest.approx(
        80 / 96
    )
    assert attention_head_dim_factor(64, "attention_forward", "cudnn", "ampere") == 1.0
    assert attention_head_dim_factor(128, "attention_backward", "cudnn", "hopper") == 1.0


def test_megatron_pads_the_vocabulary() -> None:
    """Megatron pads the vocabulary to a multiple of 128 x tp; other stacks keep it."""
    assert head_vocab_per_gpu(plan(tp=8, stack="megatron")) == 129024 / 8
    assert head_vocab_per_gpu(plan(tp=8, stack="eager")) == 128256 / 8


def test_every_kernel_runs_the_in_step_slowdown_longer_by_default() -> None:
    """The default and a calibration that leaves the key out both add the in-step slowdown;
    a calibration fitted to measured steps (0) keeps the curves."""
    isolated, default = ComputeModel(H100, ISOLATED), ComputeModel(H100)
    measured = ComputeModel(H100, ComputeCalibration(efficiency={"gemm": 0.7}))
    factor = 1.0 + IN_STEP_SLOWDOWN["hopper"]
    assert default.gemm_time_s(8192, 8192, 8192) == pytest.approx(
        factor * isolated.gemm_time_s(8192, 8192, 8192)
    )
    assert default.memory_time_s(1e9) == pytest.approx(factor * 1e9 / (3.35e12 * 0.8))
    assert measured.gemm_time_s(8192, 8192, 8192) == pytest.approx(
        factor * 2 * 8192**3 / (0.7 * H100.peak_flops_per_s["bf16"] * (8192 / (8192 + 128)) ** 3)
    )
    half = ComputeModel(H100, ComputeCalibration(in_step_slowdown=0.5))
    assert half.memory_time_s(1e9) == pytest.approx(1.5 * isolated.memory_time_s(1e9))


def test_the_in_step_slowdown_is_its_gpu_generations() -> None:
    """Each generation with published runs has its own fitted factor (an A100 job's, an H100
    and an H200 job's); a generation without any takes the fit over every run; one GPU none."""
    assert ComputeModel(A100).in_step_slowdown == IN_STEP_SLOWDOWN["ampere"]
    assert ComputeModel(H100).in_step_slowdown == IN_STEP_SLOWDOWN["hopper"]
    assert ComputeModel(GPUS["h200"]).in_step_slowdown == IN_STEP_SLOWDOWN["hopper"]
    assert ComputeModel(GPUS["v100-sxm3-32gb"]).in_step_slowdown == IN_STEP_SLOWDOWN_ELSEWHERE
    assert ComputeModel(A100, distributed=False).in_step_slowdown == 0.0


def test_the_in_step_slowdowns_are_the_stored_leave_one_source_out_fits() -> None:
    """The defaults are the in-sample fits of results/validation/loso.json, per generation and
    over every run, to the three decimals they are written with."""
    stored = json.loads((REPO / "results" / "validation" / "loso.json").read_text())
    fits = stored["fitted_on_all"]
    for family, value in IN_STEP_SLOWDOWN.items():
        assert fits[family] == pytest.approx(value, abs=5e-4)
    assert fits["all"] == pytest.approx(IN_STEP_SLOWDOWN_ELSEWHERE, abs=5e-4)
    assert stored["default_in_step_slowdown"] == {
        **IN_STEP_SLOWDOWN,
        "other": IN_STEP_SLOWDOWN_ELSEWHERE,
    }


def test_flash_attention_2_runs_slower_on_hopper_only() -> None:
    """FlashAttention-2 on an H100: the default forward rate x 0.35 / 0.60 and the backward's x
    0.319 / 0.50 (measured); on an A100 it is the default's reference: unchanged. GEMMs never
    change."""
    for gpu, forward, backward in (
        (H100, FLASH2_ON_HOPPER, FLASH2_BACKWARD_ON_HOPPER),
        (A100, 1.0, 1.0),
    ):
        model = ComputeModel(gpu)
        for kind, factor in (("attention_forward", forward), ("attention_backward", backward)):
            cudnn = model.kernel_fit(kind, "bf16", "cudnn").max_flops_per_s
            flash2 = model.kernel_fit(kind, "bf16", "flash2").max_flops_per_s
            assert flash2 == pytest.approx(cudnn * factor)
        assert model.kernel_fit("gemm", "bf16", "flash2") == model.kernel_fit("gemm", "bf16")
    assert pytest.approx(0.5833, abs=1e-4) == FLASH2_ON_HOPPER
    # the measured rates: 343 TFLOP/s forward, 315 backward (at 2.5x the FLOPs) of 989.4
    flash2 = ComputeModel(H100)
    assert flash2.kernel_fit("attention_forward", "bf16", "flash2").max_flops_per_s == (
        pytest.approx(0.35 * 989.4e12)
    )
    assert flash2.kernel_fit("attention_backward", "bf16", "flash2").max_flops_per_s == (
        pytest.approx(0.319 * 989.4e12)
    )


def test_the_in_step_slowdown_is_bounded() -> None:
    for bad in (-0.1, 1.5, True, "0.2"):
        with pytest.raises(ValueError, match="in_step_slowdown must be a number in \\[0, 1\\]"):
            ComputeCalibration(in_step_slowdown=bad)  # type: ignore[arg-type]


def test_gpu_without_the_dtype_is_an_error() -> None:
    with pytest.raises(ValueError, match="a100-sxm-80gb has no fp8 peak"):
        ComputeModel(A100).gemm_time_s(1024, 1024, 1024, "fp8")


def test_fit_kernel_recovers_a_known_curve() -> None:
    truth = KernelFit(max_flops_per_s=5e14, dim_half=128.0, latency_s=4e-6)
    shapes = [(s, s, s) for s in (256, 512, 1024, 2048, 4096)] + [(8192, 1024, 4096)]
    samples = [
        (d, 2.0 * d[0] * d[1] * d[2], truth.time_s(2.0 * d[0] * d[1] * d[2], d)) for d in shapes
    ]
    fitted = fit_kernel(samples)
    assert fitted.dim_half == pytest.approx(128.0, rel=1e-9)
    assert fitted.max_flops_per_s == pytest.approx(5e14, rel=1e-6)
    assert fitted.latency_s == pytest.approx(4e-6, rel=1e-5)
    assert fit_kernel(samples) == fitted  # deterministic


def test_calibration_drives_the_model_and_round_trips(tmp_path: Path) -> None:
    fit = KernelFit(max_flops_per_s=6e14, dim_half=64.0, latency_s=2e-6)
    calibration = ComputeCalibration(
        device="NVIDIA H100 80GB HBM3",
        gpu="h100-sxm",
        kernels={"bf16": {"gemm": fit}},
        efficiency={"attention_forward": 0.5},
        memory_bandwidth_bytes_per_s=3.0e12,
        in_step_slowdown=0.0,
        measurements=(
            {"kind": "gemm", "dtype": "bf16", "dims": [1, 2, 3], "flops": 12.0, "time_s": 1e-6},
        ),
    )
    path = tmp_path / "compute.json"
    save_compute_calibration(calibration, path)
    loaded = load_compute_calibration(path)
    assert loaded.to_json() == calibration.to_json()
    model = ComputeModel(H100, loaded)
    assert model.gemm_time_s(4096, 4096, 4096) == fit.time_s(2 * 4096**3, (4096, 4096, 4096))
    assert model.kernel_fit("attention_forward", "bf16").max_flops_per_s == pytest.approx(
        0.5 * H100.peak_flops_per_s["bf16"]
    )
    assert model.memory_time_s(3e12) == pytest.approx(1.0)


def test_bad_calibration_files(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema": "commsim-compute/0"}))
    with pytest.raises(ValueError, match="schema 'commsim-compute/0'"):
        load_compute_calibration(path)
    path.write_text(json.dumps({"schema": "commsim-compute/1", "gemms": {}}))
    with pytest.raises(ValueError, match="unknown key 'gemms'"):
        load_compute_calibration(path)
    path.write_text(json.dumps({"schema": "commsim-compute/1", "efficiency": {"gemm": 3.0}}))
    with pytest.raises(ValueError, match=re.escape("efficiency gemm=3.0 invalid")):
        load_compute_calibration(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_compute_calibration(path)


def test_calibration_for_another_gpu_is_refused() -> None:
    calibration = ComputeCalibration(device="AMD EPYC", gpu="cpu")
    with pytest.raises(ValueError, match="calibration is for GPU 'cpu'"):
        ComputeModel(H100, calibration)
    assert ComputeModel(H100, ComputeCalibration(efficiency={"gemm": 0.5})).gpu is H100


def test_the_eager_stack_moves_more_bytes_than_fused_kernels() -> None:
    """Per layer forward (tp=1, b=1, s=8192, Llama 3 70B): the elementwise bytes of each stack
    from ``ELEMENTWISE_BYTES``, and autocast's weight casts only for eager/compiled DDP."""
    tokens, h, f, kv = 8192, 8192, 28672, 1024
    fused = 2 * 4 * tokens * h + 2 * 6 * tokens * h + 4 * tokens * (h + kv) + 6 * tokens * f
    eager = 2 * 4 * tokens * h + 2 * 6 * tokens * h + 20 * tokens * (h + kv) + 10 * tokens * f
    eager += 2 * 2 * tokens * (kv + h)  # repeat_kv of K and V
    assert elementwise_forward_bytes(plan(stack="megatron")) == fused
    assert elementwise_forward_bytes(plan(stack="compile")) == fused
    assert elementwise_forward_bytes(plan(stack="eager")) == eager

    # autocast over fp32 weights: the residual stream is fp32, norms 8 / adds 10 eagerly, the
    # fused add-norm 6 + 6 compiled (FP32_RESIDUAL_BYTES)
    def autocast(stack: str) -> Plan:
        base = plan(stack=stack)
        training = dataclasses.replace(base.training, mixed_precision="autocast")
        return dataclasses.replace(base, training=training)

    fp32 = (2 * 8 - 2 * 4 + 2 * 10 - 2 * 6) * tokens * h
    assert elementwise_forward_bytes(autocast("eager")) == eager + fp32
    assert elementwise_forward_bytes(autocast("compile")) == fused + 4 * tokens * h
    layer = layer_params_per_gpu(LLAMA3_70B, 1)
    assert weight_cast_bytes(autocast("eager"), layer) == 12 * layer
    assert weight_cast_bytes(plan(stack="eager"), layer) == 0
    assert weight_cast_bytes(plan(stack="megatron"), layer) == 0
    assert weight_cast_bytes(plan(stack="eager", data_parallel="fsdp"), layer) == 0
    model = ComputeModel(H100)
    slower = model.layer_times(plan(stack="eager")).forward_s
    assert slower > model.layer_times(plan(stack="compile")).forward_s
    compiled = model.layer_times(autocast("compile")).forward_s
    assert compiled > model.layer_times(plan()).forward_s  # autocast's casts and fp32 stream


def test_the_stack_defaults_follow_the_framework() -> None:
    unset = dataclasses.replace(plan(), training=dataclasses.replace(plan().training, stack=None))
    assert kernel_stack(unset) == "eager"
    megatron = dataclasses.replace(
        unset, parallel=ParallelConfig(data_parallel="distributed_optimizer")
    )
    assert kernel_stack(megatron) == "megatron"
