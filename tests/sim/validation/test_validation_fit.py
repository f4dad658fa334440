"""The compute-calibration fit: golden-section search, log-ratio cost, scaled calibration."""

from __future__ import annotations

import pytest

from sim.compute.model import default_efficiency
from sim.validation.fit import (
    COMPUTE_KINDS,
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


def test_scaled_calibration_scales_compute_kernels_only() -> None:
    calibration = scaled_compute_calibration("h100-sxm", "fp8", 0.5)
    assert calibration.gpu == "h100-sxm"
    assert set(calibration.efficiency) == set(COMPUTE_KINDS)  # memory-bound kernels keep theirs
    spec = GPUS["h100-sxm"]
    assert calibration.efficiency["gemm"] == pytest.approx(
        0.5 * default_efficiency(spec, "gemm", "fp8")
    )
    assert calibration.efficiency["attention_backward"] == pytest.approx(
        0.5 * default_efficiency(spec, "attention_backward", "fp8")
    )
