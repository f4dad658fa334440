"""Compute calibration from published runs: one time scale per GPU type, fitted on a few.

The compute model's default kernel curves come from published kernel benchmarks, not from the
clusters that produced the runs. ``fit_compute_calibration`` multiplies every kernel time of one
GPU type by a single factor (``ComputeCalibration.time_scale``: on top of the default in-step
slowdown, the same for every precision and kernel kind) that best reproduces the measured step
times of its calibration cases (least squares on log ratios, golden-section search), as a user
with a few measured runs of their own would (``commsim fit`` fits the same factor to one run).

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


SCALE_RANGE = (0.5, 2.0)
"""Search interval of the time scale (1.0 = the compute model's defaults)."""


def scaled_compute_calibration(gpu: str, scale: float) -> ComputeCalibration:
    """A calibration for ``gpu`` whose kernels all take ``scale`` x their default time.

    A time scale, not efficiencies: ``ComputeCalibration.efficiency`` applies to every dtype, so a
    fit on BF16 runs would set the FP8 GEMM rate to the BF16 fraction of the FP8 peak.
    """
    from comm_bench.compute_calibration import ComputeCalibration

    return ComputeCalibration(
        device=f"fitted on published runs (time scale {scale:.4f})", gpu=gpu, time_scale=scale
    )


def fit_compute_calibration(
    mappings: Sequence[CaseMapping], step_time_s: StepTime
) -> tuple[dict[str, ComputeCalibration], dict[str, Any]]:
    """Per GPU type, the time scale that best fits its calibration cases' step times.

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
    measured = [measured_of(m) for m in group]
    evaluations: list[float] = []

    def cost(scale: float) -> float:
        evaluations.append(scale)
        calibration = scaled_compute_calibration(gpu, scale)
        predicted = [step_time_s(m, calibration) for m in group]
        return log_error_cost(predicted, measured)

    scale = golden_section_minimum(cost, *SCALE_RANGE)
    calibration = scaled_compute_calibration(gpu, scale)
    description = {
        "cases": [m.case_id for m in group],
        "time_scale": scale,
        "cost": cost(scale),
        "num_evaluations": len(evaluations),
    }
    return calibration, description


def measured_of(mapping: CaseMapping) -> float:
    """The measured step time of a simulable case (ValueError if it has none)."""
    if mapping.measured is None:
        raise ValueError(f"case {mapping.case_id} has no measured step time")
    return mapping.measured.step_time_s
