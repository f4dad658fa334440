"""The compute-calibration fit: golden-section search, log-ratio cost, scaled calibration."""

from __future__ import annotations

import pytest

from sim.validation.fit import (
    golden_section_minimum,
    log_error_cost,
    scaled_compute_calibration,
)
from topologies.hardware import GPUS


def test_golden_section_finds_a_parabola_minimum() -> None:
    calls: list[float] = []

    def objective(x: float) -> float:
        calls.append(x)
        return (x - 0.63) ** 2

    assert golden_section_minimum(objective, 0.2, 1.0, tolerance=1e-4) == pytest.approx(
        0.63, abs=1e-4
    )
    # golden section: one new evaluation per step, ~log(0.8/1e-4)/log(1.618) + 2 in all
    assert len(calls) <= 22


def test_log_error_cost_is_symmetric_in_ratio() -> None:
    assert log_error_cost([2.0], [1.0]) == pytest.approx(log_error_cost([0.5], [1.0]))
    assert log_error_cost([1.0, 3.0], [1.0, 3.0]) == 0.0


def test_the_fitted_calibration_scales_every_kernel_time_alike() -> None:
    """One factor on every kernel time, whatever its precision or kind (an efficiency fitted on
    BF16 runs would misprice FP8 GEMMs)."""
    from sim.compute.model import ComputeModel

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
