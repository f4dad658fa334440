"""Compute calibration from published runs: one time scale per GPU type, fitted on a few.

The compute model's default kernel curves come from published kernel benchmarks, not from the
clusters that produced the runs. ``fit_compute_calibration`` multiplies every kernel time of one
GPU type by a single factor (``ComputeCalibration.time_scale``: on top of the default in-step
slowdown, the same for every precision and kernel kind) that best reproduces the measured step
times of its calibration cases (least squares on log ratios, Gauss-Newton), as a user
with a few measured runs of their own would (``commsim fit`` fits the same factor to one run).

    calibrations, fit = fit_compute_calibration(mappings, lambda m, c: simulate(m, c).step_time_s)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sim.validation.cases import CaseMapping

if TYPE_CHECKING:
    from vocab.compute_calibration import ComputeCalibration

StepTime = Callable[[CaseMapping, "ComputeCalibration"], float]
"""(case, compute calibration) -> predicted step time in seconds."""


FIT_EVALUATIONS = 5
"""Simulations of every calibration case per GPU type (the first at the defaults)."""


def least_squares_log_scale(
    residuals: Callable[[float], Sequence[float]],
    low: float,
    high: float,
    *,
    evaluations: int = FIT_EVALUATIONS,
) -> tuple[float, float]:
    """(u, cost): the ``u`` in [low, high] minimising ``sum(r_i(u)^2)``, and that cost.

    ``residuals(u)`` are the cases' log ratios predicted / measured at time scale ``exp(u)``;
    each moves about one for one with ``u`` (step times scale with kernel times, less what
    communication hides). Gauss-Newton with secant slopes: the first step assumes slope one,
    later ones the slopes between the last two points, so on near-proportional cases it lands
    within 1e-4 of the optimum in three evaluations. Always exactly ``evaluations`` calls
    (a point that stops moving is nudged, to keep the slopes measurable); the best point wins.
    """
    points: list[tuple[float, Sequence[float]]] = [(0.0, residuals(0.0))]
    previous, current = None, points[0]
    for _ in range(evaluations - 1):
        u, r = current
        if previous is None or abs(u - previous[0]) < 1e-12:
            slopes = [1.0] * len(r)
        else:
            slopes = [(a - b) / (u - previous[0]) for a, b in zip(r, previous[1], strict=True)]
        norm = sum(j * j for j in slopes)
        step = -sum(j * x for j, x in zip(slopes, r, strict=True)) / norm if norm > 0 else 0.0
        if abs(step) < 1e-6:
            step = 1e-4
        nxt = min(high, max(low, u + step))
        previous, current = current, (nxt, residuals(nxt))
        points.append(current)
    best = min(points, key=lambda point: sum(x * x for x in point[1]))
    return best[0], sum(x * x for x in best[1])


SCALE_RANGE = (0.5, 2.0)
"""Search interval of the time scale (1.0 = the compute model's defaults)."""


def scaled_compute_calibration(gpu: str, scale: float) -> ComputeCalibration:
    """A calibration for ``gpu`` whose kernels all take ``scale`` x their default time.

    A time scale, not efficiencies: ``ComputeCalibration.efficiency`` applies to every dtype, so a
    fit on BF16 runs would set the FP8 GEMM rate to the BF16 fraction of the FP8 peak.
    """
    from vocab.compute_calibration import ComputeCalibration

    return ComputeCalibration(
        device=f"fitted on published runs (time scale {scale:.4f})", gpu=gpu, time_scale=scale
    )


def fit_compute_calibration(
    mappings: Sequence[CaseMapping], step_time_s: StepTime
) -> tuple[dict[str, ComputeCalibration], dict[str, Any]]:
    """Per GPU type, the time scale that best fits its calibration cases' step times.

    The cost is the sum of squared log ratios of predicted to measured step time, minimised over
    ``SCALE_RANGE`` by ``least_squares_log_scale``; each evaluation simulates the cases.
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

    def residuals(log_scale: float) -> list[float]:
        evaluations.append(log_scale)
        calibration = scaled_compute_calibration(gpu, math.exp(log_scale))
        predicted = [step_time_s(m, calibration) for m in group]
        return [math.log(p / m) for p, m in zip(predicted, measured, strict=True)]

    log_scale, cost = least_squares_log_scale(residuals, *(math.log(x) for x in SCALE_RANGE))
    scale = math.exp(log_scale)
    calibration = scaled_compute_calibration(gpu, scale)
    description = {
        "cases": [m.case_id for m in group],
        "time_scale": scale,
        "cost": cost,
        "num_evaluations": len(evaluations),
    }
    return calibration, description


def measured_of(mapping: CaseMapping) -> float:
    """The measured step time of a simulable case (ValueError if it has none)."""
    if mapping.measured is None:
        raise ValueError(f"case {mapping.case_id} has no measured step time")
    return mapping.measured.step_time_s
