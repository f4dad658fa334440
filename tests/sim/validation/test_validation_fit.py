"""The compute-calibration fit: least squares on log ratios, scaled calibration."""

from __future__ import annotations

import math

import pytest

from sim.validation.fit import (
    FIT_EVALUATIONS,
    least_squares_log_scale,
    scaled_compute_calibration,
)
from topologies.hardware import GPUS


def _cases(scale_powers: list[tuple[float, float]]):
    """Residuals of cases whose predicted / measured ratio is ``a * s**b`` at time scale s."""
    calls: list[float] = []

    def residuals(u: float) -> list[float]:
        calls.append(u)
        return [math.log(a) + b * u for a, b in scale_powers]

    return residuals, calls


def test_proportional_cases_fit_their_geometric_mean_in_exact_evaluations() -> None:
    # step times proportional to the scale: the optimum is the geometric mean of the ratios
    residuals, calls = _cases([(1.25, 1.0), (1.1, 1.0), (0.95, 1.0)])
    u, cost = least_squares_log_scale(residuals, math.log(0.5), math.log(2.0))
    assert math.exp(u) == pytest.approx((1.25 * 1.1 * 0.95) ** (-1 / 3), rel=1e-9)
    mean = sum(math.log(a) for a in (1.25, 1.1, 0.95)) / 3
    assert cost == pytest.approx(sum((math.log(a) - mean) ** 2 for a in (1.25, 1.1, 0.95)))
    assert len(calls) == FIT_EVALUATIONS


def test_partly_hidden_cases_reach_the_least_squares_optimum() -> None:
    # slopes below one (communication that does not scale): the closed-form least-squares
    # optimum of sum (log a_i + b_i u)^2 is u* = -sum(b_i log a_i) / sum(b_i^2)
    pairs = [(1.3, 0.9), (0.8, 0.6), (1.05, 1.0)]
    residuals, _ = _cases(pairs)
    u, _ = least_squares_log_scale(residuals, math.log(0.5), math.log(2.0))
    expected = -sum(b * math.log(a) for a, b in pairs) / sum(b * b for _, b in pairs)
    assert u == pytest.approx(expected, abs=1e-6)


def test_an_optimum_outside_the_range_stops_at_the_bound() -> None:
    residuals, calls = _cases([(3.0, 1.0)])  # needs a scale of 1/3
    u, _ = least_squares_log_scale(residuals, math.log(0.5), math.log(2.0))
    assert math.exp(u) == pytest.approx(0.5)
    assert all(math.log(0.5) <= c <= math.log(2.0) for c in calls)


def test_the_fitted_calibration_scales_every_kernel_time_alike() -> None:
    """One factor on every kernel time, whatever its precision or kind (an efficiency fitted on
    BF16 runs would misprice FP8 GEMMs)."""
    from sim.compute.compute_model import ComputeModel

    calibration = scaled_compute_calibration("h100-sxm", 1.25)
    assert (calibration.gpu, calibration.time_scale, calibration.efficiency) == (
        "h100-sxm",
        1.25,
        {},
    )
    spec = GPUS["h100-sxm"]
    fitted, default = ComputeModel(spec, calibration), ComputeModel(spec)
    for dtype in ("bf16", "fp8"):
        assert fitted.gemm_time_s(8192, 8192, 8192, dtype) == pytest.approx(
            1.25 * default.gemm_time_s(8192, 8192, 8192, dtype)
        )
    assert fitted.memory_time_s(1e9) == pytest.approx(1.25 * default.memory_time_s(1e9))
