"""Leave-one-source-out refits of the in-step slowdown, on hand-made case lines."""

from __future__ import annotations

import pytest

from sim.validation.loso import REFERENCE_SLOWDOWN, CaseLine, fit_slowdown, refit


def line(
    case_id: str, source: str, slowdown: float, *, base: float = 1.0, family: str = "hopper"
) -> CaseLine:
    """A case whose compute grows with 1 + slowdown and whose measurement sits at ``slowdown``."""
    return CaseLine(
        case_id=case_id,
        source=source,
        family=family,
        measured_s=base * (1.0 + slowdown),
        without_s=base,
        at_reference_s=base * (1.0 + REFERENCE_SLOWDOWN),
    )


def test_interpolation_goes_through_both_simulations() -> None:
    case = line("a", "s", 0.3, base=2.0)
    assert case.predicted_s(0.0) == 2.0
    assert case.predicted_s(REFERENCE_SLOWDOWN) == pytest.approx(2.0 * (1 + REFERENCE_SLOWDOWN))
    assert case.error(0.3) == pytest.approx(0.0)


def test_the_fit_is_the_median_of_what_each_run_needs() -> None:
    """Least absolute log error: the fit sits at the median run, whatever the outliers say."""
    assert fit_slowdown([line("a", "s", 0.1), line("b", "s", 0.1, base=5.0)]) == pytest.approx(
        0.1, abs=1e-6
    )
    three = [line("a", "s", 0.05), line("b", "s", 0.12), line("c", "s", 0.9)]
    assert fit_slowdown(three) == pytest.approx(0.12, abs=1e-6)
    # least squares in log time would be pulled to 0.31 by the 0.9 run
    assert fit_slowdown([*three, line("d", "s", 0.11), line("e", "s", 0.13)]) == pytest.approx(
        0.12, abs=1e-6
    )


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


def test_a_source_is_refitted_on_the_other_runs_of_its_generation() -> None:
    """Two A100 sources and two H100 sources: each is scored with its own generation's other
    source; a generation with one source takes every other run. In-sample fits per
    generation and over all."""
    lines = [
        line("a1", "a", 0.1, family="ampere"),
        line("b1", "b", 0.15, family="ampere"),
        line("c1", "c", 0.2),
        line("d1", "d", 0.25),
        line("d2", "d", 0.25),
        line("v1", "v", 0.5, family="volta"),
    ]
    report = refit(lines)
    assert report.fitted["a"] == pytest.approx(0.15, abs=1e-6)
    assert report.fitted["b"] == pytest.approx(0.1, abs=1e-6)
    assert report.fitted["c"] == pytest.approx(0.25, abs=1e-6)
    assert report.fitted["d"] == pytest.approx(0.2, abs=1e-6)
    assert report.fitted["v"] == pytest.approx(0.2, abs=1e-6)  # median of the other five
    assert report.fitted_on_all["hopper"] == pytest.approx(0.25, abs=1e-6)
    assert report.fitted_on_all["volta"] == pytest.approx(0.5, abs=1e-6)
    assert 0.2 - 1e-6 <= report.fitted_on_all["all"] <= 0.25 + 1e-6  # six runs: a tie between
    assert report.to_json()["cases"][0]["family"] == "ampere"
