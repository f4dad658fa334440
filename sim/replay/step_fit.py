"""A compute calibration fitted to a measured training step (``commbench --step`` JSON).

The step file holds the plan as measured (one device, the measured slice of layers, its batch),
the phase times and a profile by kernel class with the number of kernels launched. The compute
model prices the same step; each class's efficiency is scaled by modelled / measured time
(GEMMs, fused attention, memory-bound work: norms, elementwise, loss, casts and the optimizer),
never above the device's peak. The idle time is not a factor on the kernels: it is the host
launching them. The measured kernel count over the modelled inventory gives the loop's launches
per modelled kernel; when the step was launch-bound (the GPU idle for a good part of the
unprofiled step, ``LAUNCH_BOUND_IDLE``) the
host time per launch is solved so that the replayed step (``simulate_plan``, whose host thread
launches the kernels ahead of the GPU) matches the measured one; otherwise the launches hide
behind the kernels, the host cost cannot be read off the step and the default stays. Both carry
to another model size on the same loop, where a time scale would not: the host cost scales with
the kernels launched, the kernel time with the FLOPs and bytes.

    calibration = calibration_from_step(json.load(open("step.json")), GPUS["h100-sxm"])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from schedules.arithmetic import stage_params_per_gpu
from schedules.data_parallel.registry import data_parallel_kind
from schedules.kernels import (
    MEMORY_CLASSES,
    Kernel,
    embedding_kernels,
    head_kernels,
    kernel_stack,
    layer_kernels,
    master_copy_bytes,
)
from schedules.optimizer_states import adam_traffic_bytes
from schedules.plan import Plan, load_plan
from schedules.resolve import resolve_plan
from sim.compute.compute_model import (
    ComputeModel,
    default_efficiency,
    launch_loop,
    optimizer_launches,
)
from sim.compute.compute_model import known_launches as kernel_launches
from topologies.hardware import GPUSpec
from vocab.compute_calibration import (
    LAUNCH_BOUND_IDLE,
    STEP_SCHEMA,
    TIME_SCALE_RANGE,
    ComputeCalibration,
)

PASS_CLASSES = tuple(c for c in MEMORY_CLASSES if c != "optimizer")
"""Memory-bound profile classes of the forward and backward passes (the optimizer is fitted
apart: its bytes per parameter)."""


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
    """Seconds per step the model gives to gemm, attention, memory-bound work (and each of its
    profile classes, ``memory_<class>``) and the optimizer."""
    classes = {"gemm": 0.0, "attention": 0.0, "memory": 0.0, "optimizer": 0.0}
    classes.update({f"memory_{name}": 0.0 for name in PASS_CLASSES})
    for kernel in _kernels(plan):
        group = "attention" if kernel.kind.startswith("attention") else kernel.kind
        seconds = compute.kernel_time_s(kernel) * microbatches
        classes[group] += seconds
        if kernel.kind == "memory" and kernel.memory_class in PASS_CLASSES:
            classes[f"memory_{kernel.memory_class}"] += seconds
    params = stage_params_per_gpu(plan, 0)
    grad = data_parallel_kind(plan.parallel).grad_bytes(plan.parallel)
    classes["optimizer"] += compute.optimizer_step_s(
        params, grad_bytes_per_param=grad, adam_bytes_per_param=adam_traffic_bytes(plan)
    )
    # bf16_weights: the copies to and from the fp32 master weights are copy kernels in a profile
    master_s = compute.memory_time_s(master_copy_bytes(plan, params), "copy")
    classes["memory"] += master_s
    classes["memory_copy"] += master_s
    return classes


MAX_HOST_S_PER_LAUNCH = 0.01
"""Upper end of the host-cost search (10 ms per launch is a broken host, not a training loop)."""


def modelled_launch_count(plan: Any, microbatches: int) -> int:
    """Kernels of the modelled inventory in a step of ``microbatches`` (the launch unit)."""
    return len(_kernels(plan)) * microbatches


def known_launches(plan: Any, microbatches: int) -> float:
    """Launches the loop's code and cuBLAS give beyond the per-kernel count
    (``sim.compute.compute_model.known_launches``) in a step of ``microbatches``."""
    loop = launch_loop(plan)
    return sum(kernel_launches(kernel, loop) for kernel in _kernels(plan)) * microbatches


def _check_measurement(measurement: Mapping[str, Any], gpu: GPUSpec) -> None:
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


MEMORY_EFFICIENCY_CAP = 1.5
"""Most a memory-bound class's fitted efficiency may reach: above 1 the measured loop moves
fewer bytes than the modelled inventory (a fused norm where the eager stack lists its parts),
which a bandwidth cannot say otherwise; GEMMs and attention stay at most at the dense peak."""


POOLED_CLASSES = {"compile": ("elementwise", "copy")}
"""Memory classes whose profile times are fitted as one, per stack: Inductor names a fused
kernel after every operator it fuses (``triton_poi_fused__to_copy_add_mul_silu_...``), so the
profile's names put its elementwise fusions among the copies and cannot tell the two apart."""


def _cap(group: str) -> float:
    return MEMORY_EFFICIENCY_CAP if group.startswith("memory") else 1.0


def _class_efficiencies(
    plan: Any, gpu: GPUSpec, microbatches: int, measured: Mapping[str, Any], dtype: str
) -> dict[str, float]:
    """Each class's default efficiency scaled by modelled / measured time (at most 1). The
    modelled times take one memory efficiency for every memory class (the GPU family's
    per-class defaults left out), so that each fitted efficiency is the fraction its class
    reached."""
    uniform = default_efficiency(gpu, "memory", dtype)
    base = ComputeModel(  # a step is in-step: no slowdown
        gpu,
        ComputeCalibration(
            in_step_slowdown=0.0, efficiency={f"memory_{k}": uniform for k in PASS_CLASSES}
        ),
    )
    modelled = modelled_classes_s(plan, base, microbatches)
    observed = {
        "gemm": float(measured.get("gemm", 0.0)),
        "attention": float(measured.get("attention", 0.0)),
        "memory": sum(float(measured.get(k, 0.0)) for k in PASS_CLASSES),
    }
    observed.update({f"memory_{k}": float(measured.get(k, 0.0)) for k in PASS_CLASSES})
    efficiency: dict[str, float] = {}
    groups = [
        ("gemm", ("gemm",)),
        ("attention", ("attention_forward", "attention_backward")),
        ("memory", ("memory",)),
    ]
    pooled = POOLED_CLASSES.get(kernel_stack(plan), ())
    if pooled:  # fitted together: one efficiency from their summed times
        group = "memory_" + "+".join(pooled)
        modelled[group] = sum(modelled[f"memory_{k}"] for k in pooled)
        observed[group] = sum(observed[f"memory_{k}"] for k in pooled)
        groups.append((group, tuple(f"memory_{k}" for k in pooled)))
    groups += [(f"memory_{k}", (f"memory_{k}",)) for k in PASS_CLASSES if k not in pooled]
    for group, keys in groups:
        if observed[group] <= 0 or modelled[group] <= 0:
            continue
        for key in keys:
            default = default_efficiency(
                gpu, "memory" if group.startswith("memory") else key, dtype
            )
            efficiency[key] = min(_cap(group), default * modelled[group] / observed[group])
    return efficiency


def _optimizer_bytes(
    plan: Any, gpu: GPUSpec, efficiency: Mapping[str, float], optimizer_s: float
) -> float | None:
    """Bytes per parameter the measured optimizer step moved, at the fitted memory rate."""
    params = stage_params_per_gpu(plan, 0)
    if optimizer_s <= 0 or params <= 0:
        return None
    compute = ComputeModel(gpu, ComputeCalibration(in_step_slowdown=0.0, efficiency=efficiency))
    moved = optimizer_s * compute.memory_bandwidth_bytes_per_s() / params
    return min(max(moved, 1.0), 1000.0)


def _busy_classes(classes: Mapping[str, Any], busy_s: Any) -> dict[str, float]:
    """Class times scaled to the profile's busy time when they add up to more: kernels that ran
    at the same time (side streams, the profiler's own copies) are counted once in the busy
    time, once per kernel in the classes."""
    total = sum(float(v) for v in classes.values())
    number = isinstance(busy_s, int | float) and not isinstance(busy_s, bool)
    scale = busy_s / total if number and 0 < busy_s < total else 1.0
    return {key: float(value) * scale for key, value in classes.items()}


def _without_annotation(classes: Mapping[str, float], timings: Any) -> dict[str, float]:
    """The profile's classes with the optimizer's kernel time at most the optimizer phase's
    measured time: torch 2.11's profiler lists the GPU-side ``Optimizer.step#...`` annotation as
    a CUDA event beside the kernels it spans, which files written before ``commbench --step``
    dropped it count twice (kernels inside a phase cannot take longer than the phase)."""
    out = dict(classes)
    phase = timings.get("optimizer") if isinstance(timings, Mapping) else None
    if isinstance(phase, int | float) and not isinstance(phase, bool) and phase > 0:
        out["optimizer"] = min(out.get("optimizer", 0.0), float(phase))
    return out


def _replayed_step_s(plan: Any, calibration: ComputeCalibration) -> float:
    from sim.replay.simulate import simulate_plan

    return simulate_plan(plan, compute_calibration=calibration).step_time_s


def _fit_host_cost(plan: Any, calibration: ComputeCalibration, step_s: float) -> float | None:
    """The host time per launch at which the replayed step takes ``step_s`` (None if even no
    host cost gives a longer step: the kernels alone explain it)."""

    def at(cost: float) -> float:
        return _replayed_step_s(plan, dataclasses.replace(calibration, host_s_per_launch=cost))

    low, high = 0.0, MAX_HOST_S_PER_LAUNCH
    if at(low) >= step_s:
        return None
    for _ in range(50):  # bisection on a monotone function: 1e-15 relative at the end
        middle = (low + high) / 2
        low, high = (middle, high) if at(middle) < step_s else (low, middle)
    return (low + high) / 2


def _unprofiled_idle_share(profile: Mapping[str, Any], step_s: float) -> float:
    """The share of the measured (unprofiled) step the GPU spent idle: one minus the profiled
    kernels' busy time over it. The profiled step's own idle share overstates it: the profiler
    adds host time to every operator (profiled steps ran up to 2x longer than unprofiled ones
    while their kernels stayed the same), and that host time shows as idle GPU."""
    busy = profile.get("busy_s")
    if not isinstance(busy, int | float) or isinstance(busy, bool) or not busy > 0:
        return 0.0
    return max(0.0, 1.0 - busy / step_s)


def step_plan(measurement: Mapping[str, Any]) -> Plan:
    """The plan a ``commbench --step`` file measured: its loop runs under autocast over fp32
    weights, which files written before the plan said so leave unset."""
    raw = dict(measurement["plan"])
    training = dict(raw.get("training") or {})
    if training.get("mixed_precision") is None:
        training["mixed_precision"] = "autocast"
    return load_plan({**raw, "training": training})


def calibration_from_step(
    measurement: Mapping[str, Any], gpu: GPUSpec, *, fit_host: bool = True
) -> ComputeCalibration:
    """Efficiencies per class, launches per modelled kernel and the host time per launch that
    reproduce the measured step on ``gpu`` (``fit_host`` False: the default host cost stays,
    for a step time that is the profiled one)."""
    _check_measurement(measurement, gpu)
    plan = resolve_plan(step_plan(measurement), 1)
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
    measured = _without_annotation(
        {key: float(value) for key, value in measured.items()}, measurement["timings_s"]
    )
    measured = _busy_classes(measured, profile.get("busy_s"))
    dtype = "bf16" if measurement.get("dtype", "bf16") == "bf16" else "fp32"
    efficiency = _class_efficiencies(plan, gpu, microbatches, measured, dtype)
    optimizer = _optimizer_bytes(plan, gpu, efficiency, float(measured.get("optimizer", 0.0)))
    num_kernels = profile.get("num_kernels")
    launches = None
    if isinstance(num_kernels, int) and not isinstance(num_kernels, bool) and num_kernels > 0:
        fused = optimizer_launches(stage_params_per_gpu(plan, 0))
        counted = num_kernels - fused - known_launches(plan, microbatches)
        launches = max(counted, 1) / modelled_launch_count(plan, microbatches)
    # files written before it was measured have none; a GPU profile with no short gap (the host
    # behind at every kernel) measured none, where a CPU profile's 0 is its operators' own
    gap = profile.get("kernel_gap_s")
    lowest = 0.0 if gpu.family == "cpu" else 1e-9
    measured_gap = (
        float(gap)
        if isinstance(gap, int | float) and not isinstance(gap, bool) and lowest <= gap <= 1e-4
        else None
    )
    fitted = ComputeCalibration(
        gpu=gpu.name,
        device=str(measurement.get("device", "")),
        efficiency=efficiency,
        in_step_slowdown=0.0,
        launches_per_kernel=launches,
        optimizer_bytes_per_param=optimizer,
        kernel_gap_s=measured_gap,
    )
    predicted = _replayed_step_s(plan, fitted)
    low, high = TIME_SCALE_RANGE
    if not low <= step_s / predicted <= high:
        raise ValueError(
            f"the measured step ({step_s:.4g} s) is {step_s / predicted:.3g}x what the model "
            f"gives for it ({predicted:.4g} s), outside [{low}, {high}]: the file does not "
            "describe this GPU"
        )
    idle_share = _unprofiled_idle_share(profile, step_s)
    host = None
    if fit_host and launches is not None and idle_share >= LAUNCH_BOUND_IDLE:
        host = _fit_host_cost(plan, fitted, step_s)
    note = (
        f"commbench --step {measurement.get('source_plan', '')}: "
        f"{measurement.get('measured_layers')} layers, {microbatches} micro-batch(es), "
        f"step {step_s:.6g} s, {'compiled' if measurement.get('compiled') else 'eager'}, "
        f"{num_kernels} kernels"
        + ("" if host is None else f", host {host * 1e6:.3g} us per launch (launch-bound)")
    )
    return dataclasses.replace(fitted, host_s_per_launch=host, fitted_on=note)
