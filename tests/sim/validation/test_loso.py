"""Leave-one-source-out refits of the in-step slowdown, on hand-made case lines."""

from __future__ import annotations

import pytest

from sim.compute.compute_model import DEFAULT_IN_STEP_SLOWDOWN
from sim.validation.loso import CaseLine, fit_slowdown, refit


def line(case_id: str, source: str, slowdown: float, *, base: float = 1.0) -> CaseLine:
    """A case whose compute grows with 1 + slowdown and whose measurement sits at ``slowdown``."""
    return CaseLine(
        case_id=case_id,
        source=source,
        measured_s=base * (1.0 + slowdown),
        without_s=base,
        with_default_s=base * (1.0 + DEFAULT_IN_STEP_SLOWDOWN),
    )


def test_interpolation_goes_through_both_simulations() -> None:
    case = line("a", "s", 0.3, base=2.0)
    assert case.predicted_s(0.0) == 2.0
    assert case.predicted_s(DEFAULT_IN_STEP_SLOWDOWN) == pytest.approx(2.0 * 1.21)
    assert case.error(0.3) == pytest.approx(0.0)


def test_the_fit_finds_the_slowdown_the_measurements_sit_at() -> None:
    assert fit_slowdown([line("a", "s", 0.1), line("b", "s", 0.1, base=5.0)]) == pytest.approx(
        0.1, abs=1e-6
    )
    # two cases at 0.0 and 0.44: the log-least-squares optimum is where the logs balance,
    # (1 + x)^2 = 1.44, x = 0.2
    assert fit_slowdown([line("a", "s", 0.0), line("b", "s", 0.44)]) == pytest.approx(0.2, abs=1e-6)


def test_each_source_is_scored_with_the_slowdown_fitted_without_it() -> None:
    lines = [line("a1", "a", 0.1), line("a2", "a", 0.1), line("b1", "b", 0.3)]
    report = refit(lines)
    assert report.fitted["a"] == pytest.approx(0.3, abs=1e-6)  # fitted on b only
    assert report.fitted["b"] == pytest.approx(0.1, abs=1e-6)  # fitted on a only
    errors = report.errors()
    assert errors["a1"] == pytest.approx(1.3 / 1.1 - 1.0)
    assert errors["b1"] == pytest.approx(1.1 / 1.3 - 1.0)
    summary = report.summary()
    assert summary["a"]["num_cases"] == 2 and summary["all"]["num_cases"] == 3
    assert summary["all"]["mape"] == pytest.approx((2 * (1.3 / 1.1 - 1) + (1 - 1.1 / 1.3)) / 3)
