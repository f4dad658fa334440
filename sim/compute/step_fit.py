"""A compute calibration fitted to a measured training step (``commbench --step`` JSON).

The step file holds the plan as measured (one device, the measured slice of layers, its batch),
the phase times and a profile by kernel class. The compute model prices the same step; each
class's efficiency is scaled by modelled / measured time (GEMMs, fused attention, memory-bound
work: norms, elementwise, loss, casts and the optimizer), never above the device's peak; then a
``time_scale`` takes up what no kernel explains (the device idle between kernels: launch and CPU
overhead of an eager step), so that the calibrated model reproduces the measured step.

    calibration = calibration_from_step(json.load(open("step.json")), GPUS["h100-sxm"])
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from schedules.arithmetic import stage_params_per_gpu
from schedules.data_parallel.registry import data_parallel_kind
from schedules.kernels import Kernel, embedding_kernels, head_kernels, layer_kernels
from schedules.plan import load_plan
from schedules.resolve import resolve_plan
from sim.compute.compute_model import ComputeModel, default_efficiency
from topologies.hardware import GPUSpec
from vocab.compute_calibration import STEP_SCHEMA, TIME_SCALE_RANGE, ComputeCalibration

MEMORY_CLASSES = ("elementwise", "loss", "copy", "optimizer")
"""Profile classes the compute model prices as memory-bound kernels."""


def _kernels(plan: Any) -> list[Kernel]:
    """Every kernel of one micro-batch of the measured slice (forward, recompute, backward)."""
    out: list[Kernel] = []
    layers = plan.model.num_layers
    for piece, count in (
        (layer_kernels(plan), layers),
        (embedding_kernels(plan), 1),
        (head_kernels(plan), 1),
    ):
        phases = (piece.forward, piece.recompute, piece.backward_input, piece.backward_weight)
        out += [kernel for phase in phases for kernel in phase] * count
    return out


def modelled_classes_s(plan: Any, compute: ComputeModel, microbatches: int) -> dict[str, float]:
    """Seconds per step the model gives to gemm, attention and memory-bound work."""
    classes = {"gemm": 0.0, "attention": 0.0, "memory": 0.0}
    for kernel in _kernels(plan):
        group = "attention" if kernel.kind.startswith("attention") else kernel.kind
        classes[group] += compute.kernel_time_s(kernel) * microbatches
    params = stage_params_per_gpu(plan, 0)
    grad = data_parallel_kind(plan.parallel).grad_bytes_per_param
    classes["memory"] += compute.optimizer_step_s(params, grad_bytes_per_param=grad)
    return classes


def calibration_from_step(measurement: Mapping[str, Any], gpu: GPUSpec) -> ComputeCalibration:
    """Efficiencies per class and a time scale reproducing the measured step on ``gpu``."""
    if measurement.get("schema") != STEP_SCHEMA:
        raise ValueError(
            f"step measurement schema {measurement.get('schema')!r} is not {STEP_SCHEMA!r}"
        )
    measured_gpu = str(measurement.get("gpu", ""))
    if measured_gpu and measured_gpu != gpu.name:
        raise ValueError(
            f"the step was measured on {measured_gpu!r} ({measurement.get('device', '')}), not "
            f"on this plan's {gpu.name!r}; measure this GPU"
        )
    if measurement.get("dtype", "bf16") != "bf16" and gpu.name != "cpu":
        raise ValueError(
            f"the step was measured in {measurement.get('dtype')}; calibrate a bf16 plan on a "
            "step measured with --dtype bf16"
        )
    plan = resolve_plan(load_plan(measurement["plan"]), 1)
    microbatches = measurement.get("microbatches", 1)
    step_s = measurement["timings_s"]["step"]
    profile = measurement.get("profile") or {}
    measured = profile.get("classes_s", {}) if isinstance(profile, dict) else None
    numbers_ok = all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0
        for x in (microbatches, step_s)
    )
    if not numbers_ok or not isinstance(measured, dict) or int(microbatches) != microbatches:
        raise ValueError(
            f"malformed step measurement: microbatches={microbatches!r}, step={step_s!r}, "
            "profile.classes_s must be a mapping"
        )
    microbatches = int(microbatches)
    base = ComputeModel(gpu, ComputeCalibration(in_step_slowdown=0.0))  # a step is in-step
    modelled = modelled_classes_s(plan, base, microbatches)
    dtype = "bf16" if measurement.get("dtype", "bf16") == "bf16" else "fp32"
    efficiency: dict[str, float] = {}
    observed = {
        "gemm": float(measured.get("gemm", 0.0)),
        "attention": float(measured.get("attention", 0.0)),
        "memory": sum(float(measured.get(k, 0.0)) for k in MEMORY_CLASSES),
    }
    for group, keys in (
        ("gemm", ("gemm",)),
        ("attention", ("attention_forward", "attention_backward")),
        ("memory", ("memory",)),
    ):
        if observed[group] <= 0 or modelled[group] <= 0:
            continue
        for key in keys:
            default = default_efficiency(gpu, key, dtype)
            efficiency[key] = min(1.0, default * modelled[group] / observed[group])
    fitted = ComputeCalibration(gpu=gpu.name, device=str(measurement.get("device", "")),
                                efficiency=efficiency, in_step_slowdown=0.0)  # fmt: skip
    predicted = sum(modelled_classes_s(plan, ComputeModel(gpu, fitted), microbatches).values())
    low, high = TIME_SCALE_RANGE
    scale = step_s / predicted
    if not low <= scale <= high:
        raise ValueError(
            f"the measured step ({step_s:.4g} s) is {scale:.3g}x what the model gives for it "
            f"({predicted:.4g} s), outside [{low}, {high}]: the file does not describe this GPU"
        )
    note = (
        f"commbench --step {measurement.get('source_plan', '')}: "
        f"{measurement.get('measured_layers')} layers, {microbatches} micro-batch(es), "
        f"step {step_s:.6g} s, {'compiled' if measurement.get('compiled') else 'eager'}"
    )
    return ComputeCalibration(
        gpu=gpu.name,
        device=fitted.device,
        efficiency=efficiency,
        time_scale=scale,
        fitted_on=note,
        in_step_slowdown=0.0,
    )
