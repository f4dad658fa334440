"""Compute calibration from published runs: one efficiency scale per GPU type, fitted on a few.

The compute model's default kernel efficiencies come from published kernel benchmarks, not from
the clusters that produced the runs. ``fit_compute_calibration`` scales the GEMM and fused-
attention efficiencies of one GPU type by a single factor that best reproduces the measured step
times of its calibration cases (least squares on log ratios, golden-section search), as a user
with a few measured runs of their own would.

    calibrations, fit = fit_compute_calibration(mappings, lambda m, c: simulate(m, c).step_time_s)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sim.validation.cases import CaseMapping

if TYPE_CHECKING:
    from comm_bench.compute_calibration import ComputeCalibration

StepTime = Callable[[CaseMapping, "ComputeCalibration"], float]
"""(case, compute calibration) -> predicted step time in seconds."""


def golden_section_minimum(
    objective: Callable[[float], float], low: float, high: float, *, tolerance: float = 1e-3
) -> float:
    """The argument in [low, high] minimising a unimodal ``objective`` (golden-section search)."""
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = objective(c), objective(d)
    while b - a > tolerance:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = objective(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = objective(d)
    return (a + b) / 2.0


def log_error_cost(predicted_s: Sequence[float], measured_s: Sequence[float]) -> float:
    """Sum of squared log ratios: a symmetric least-squares cost for multiplicative errors."""
    return sum(math.log(p / m) ** 2 for p, m in zip(predicted_s, measured_s, strict=True))


COMPUTE_KINDS = ("gemm", "attention_forward", "attention_backward")
"""Kernel kinds whose efficiency the fitted scale multiplies (memory-bound kernels keep theirs)."""
SCALE_RANGE = (0.25, 1.5)
"""Search interval of the efficiency scale (1.0 = the compute model's defaults)."""


def scaled_compute_calibration(gpu: str, dtype: str, scale: float) -> ComputeCalibration:
    """A calibration for ``gpu`` whose compute efficiencies are ``scale`` x the defaults.

    ``ComputeCalibration.efficiency`` applies to every dtype of the plan, so the GEMM default is
    taken for ``dtype``, the precision of the calibration cases.
    """
    from comm_bench.compute_calibration import ComputeCalibration
    from sim.compute.model import default_efficiency
    from topologies.hardware import GPUS

    spec = GPUS[gpu]
    efficiency = {kind: scale * default_efficiency(spec, kind, dtype) for kind in COMPUTE_KINDS}
    return ComputeCalibration(
        device=f"fitted on published runs (scale {scale:.4f})", gpu=gpu, efficiency=efficiency
    )


def fit_compute_calibration(
    mappings: Sequence[CaseMapping], step_time_s: StepTime
) -> tuple[dict[str, ComputeCalibration], dict[str, Any]]:
    """Per GPU type, the efficiency scale that best fits its calibration cases' step times.

    The cost is the sum of squared log ratios of predicted to measured step time, minimised by
    a golden-section search over ``SCALE_RANGE``; each evaluation simulates the cases.
    Returns the calibrations by GPU key and a JSON-ready description of the fit.
    """
    by_gpu: dict[str, list[CaseMapping]] = {}
    for mapping in mappings:
        assert mapping.gpu is not None and mapping.plan is not None
        by_gpu.setdefault(mapping.gpu, []).append(mapping)
    calibrations: dict[str, ComputeCalibration] = {}
    described: dict[str, Any] = {}
    for gpu, group in by_gpu.items():
        calibrations[gpu], described[gpu] = _fit_one_gpu(gpu, group, step_time_s)
    return calibrations, described


def _fit_one_gpu(
    gpu: str, group: Sequence[CaseMapping], step_time_s: StepTime
) -> tuple[ComputeCalibration, dict[str, Any]]:
    dtype = str(group[0].plan["training"]["precision"])  # type: ignore[index]
    measured = [measured_of(m) for m in group]
    evaluations: list[float] = []

    def cost(scale: float) -> float:
        evaluations.append(scale)
        calibration = scaled_compute_calibration(gpu, dtype, scale)
        predicted = [step_time_s(m, calibration) for m in group]
        return log_error_cost(predicted, measured)

    scale = golden_section_minimum(cost, *SCALE_RANGE)
    calibration = scaled_compute_calibration(gpu, dtype, scale)
    description = {
        "cases": [m.case_id for m in group],
        "dtype": dtype,
        "efficiency_scale": scale,
        "efficiency": dict(calibration.efficiency),
        "cost": cost(scale),
        "num_evaluations": len(evaluations),
    }
    return calibration, description


def measured_of(mapping: CaseMapping) -> float:
    """The measured step time of a simulable case (ValueError if it has none)."""
    if mapping.measured is None:
        raise ValueError(f"case {mapping.case_id} has no measured step time")
    return mapping.measured.step_time_s
