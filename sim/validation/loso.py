"""Leave-one-source-out validation of the defaults fitted on published runs.

One default of the compute model comes from published runs: the multi-GPU in-step slowdown
(``sim.compute.compute_model.DEFAULT_IN_STEP_SLOWDOWN``, fitted on Narayanan et al. Table 1).
Scoring a source with a default fitted on it flatters that source, so here every source is
scored with the slowdown refitted on all the *other* sources: least squares in log step time,
one parameter.

Each case is simulated twice, without the slowdown and with the default; its step time at any
other value is interpolated linearly between the two (compute time grows with 1 + slowdown, the
exposed communication it hides shrinks: close to linear over the fitted range).

    report = leave_one_source_out(load_cases(path), jobs=2)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sim.compute.compute_model import DEFAULT_IN_STEP_SLOWDOWN
from sim.validation.cases import CaseMapping
from sim.validation.runner import (
    CaseResult,
    Prediction,
    Progress,
    ValidationReport,
    mape,
    run_validation,
    simulate_case,
)
from vocab.compute_calibration import ComputeCalibration

SLOWDOWN_RANGE = (0.0, 1.0)
"""Values the refit may take (the calibration file's bounds)."""


def _simulate_with(
    mapping: CaseMapping, calibration: ComputeCalibration | None, *, slowdown: float
) -> Prediction:
    """A case on the defaults with the in-step slowdown set to ``slowdown``."""
    return simulate_case(mapping, compute_calibration=ComputeCalibration(in_step_slowdown=slowdown))


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseLine:
    """A case's step time as a function of the slowdown, and its measurement."""

    case_id: str
    """The case's id."""
    source: str
    """Its source key."""
    measured_s: float
    """Measured step time."""
    without_s: float
    """Simulated with no slowdown."""
    with_default_s: float
    """Simulated with ``DEFAULT_IN_STEP_SLOWDOWN``."""

    def predicted_s(self, slowdown: float) -> float:
        """Step time at ``slowdown``, interpolated."""
        slope = (self.with_default_s - self.without_s) / DEFAULT_IN_STEP_SLOWDOWN
        return self.without_s + slope * slowdown

    def error(self, slowdown: float) -> float:
        """Signed relative error at ``slowdown``."""
        return self.predicted_s(slowdown) / self.measured_s - 1.0


def fit_slowdown(lines: Sequence[CaseLine]) -> float:
    """The slowdown minimising the squared log error over ``lines`` (golden-section search;
    the objective is convex in the slowdown for step times linear in it)."""
    low, high = SLOWDOWN_RANGE

    def cost(slowdown: float) -> float:
        return sum(math.log(line.predicted_s(slowdown) / line.measured_s) ** 2 for line in lines)

    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = low, high
    for _ in range(80):
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        if cost(c) <= cost(d):
            b = d
        else:
            a = c
    return (a + b) / 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LosoReport:
    """Per source: the slowdown fitted without it and its error with that slowdown."""

    lines: tuple[CaseLine, ...]
    """Every simulated case."""
    fitted: dict[str, float]
    """Source -> slowdown fitted on the other sources."""
    fitted_on_all: float
    """The slowdown fitted on every source (in-sample)."""
    failed: tuple[tuple[str, str], ...] = ()
    """(case id, error) of cases that failed to simulate."""

    def errors(self) -> dict[str, float]:
        """Case id -> error with its source's held-out slowdown."""
        return {line.case_id: line.error(self.fitted[line.source]) for line in self.lines}

    def summary(self) -> dict[str, dict[str, float]]:
        """Per source and ``all``: cases, held-out MAPE, mean error, the slowdown used."""
        errors = self.errors()
        out: dict[str, dict[str, float]] = {}
        for source in sorted(self.fitted):
            values = [errors[line.case_id] for line in self.lines if line.source == source]
            out[source] = {
                "num_cases": len(values),
                "mape": mape(values),
                "max_abs_error": max(abs(v) for v in values),
                "mean_error": sum(values) / len(values),
                "in_step_slowdown": self.fitted[source],
            }
        values = list(errors.values())
        out["all"] = {
            "num_cases": len(values),
            "mape": mape(values),
            "max_abs_error": max(abs(v) for v in values),
            "mean_error": sum(values) / len(values),
            "in_step_slowdown": self.fitted_on_all,
        }
        return out

    def to_json(self) -> dict[str, Any]:
        """The report as JSON (schema ``commsim-loso/1``)."""
        errors = self.errors()
        return {
            "schema": "commsim-loso/1",
            "default_in_step_slowdown": DEFAULT_IN_STEP_SLOWDOWN,
            "summary": self.summary(),
            "cases": [
                {
                    "id": line.case_id,
                    "source": line.source,
                    "measured_step_time_s": line.measured_s,
                    "predicted_without_s": line.without_s,
                    "predicted_with_default_s": line.with_default_s,
                    "held_out_in_step_slowdown": self.fitted[line.source],
                    "error": errors[line.case_id],
                }
                for line in self.lines
            ],
            "failed": [list(item) for item in self.failed],
        }


def case_lines(without: ValidationReport, with_default: ValidationReport) -> list[CaseLine]:
    """Pair the two passes' results case by case (cases that failed in either are left out)."""
    by_id: Mapping[str, CaseResult] = {r.case_id: r for r in with_default.results}
    return [
        CaseLine(
            case_id=r.case_id,
            source=r.source,
            measured_s=r.measured_step_time_s,
            without_s=r.predicted_step_time_s,
            with_default_s=by_id[r.case_id].predicted_step_time_s,
        )
        for r in without.results
        if r.case_id in by_id
    ]


def refit(lines: Sequence[CaseLine], failed: Iterable[tuple[str, str]] = ()) -> LosoReport:
    """Fit the slowdown without each source in turn (and on all of them)."""
    sources = sorted({line.source for line in lines})
    fitted = {s: fit_slowdown([line for line in lines if line.source != s]) for s in sources}
    return LosoReport(
        lines=tuple(lines), fitted=fitted, fitted_on_all=fit_slowdown(lines), failed=tuple(failed)
    )


def leave_one_source_out(
    cases: Iterable[Mapping[str, Any]],
    *,
    ids: Sequence[str] = (),
    progress: Progress | None = None,
    jobs: int = 1,
) -> LosoReport:
    """Simulate every case without and with the default slowdown, then refit per source."""
    cases = list(cases)
    passes = []
    for slowdown in (0.0, DEFAULT_IN_STEP_SLOWDOWN):
        simulate = functools.partial(_simulate_with, slowdown=slowdown)
        passes.append(
            run_validation(
                cases, ids=ids, calibrate_on=(), simulate=simulate, progress=progress, jobs=jobs
            )
        )
    failed = {*passes[0].failed, *passes[1].failed}
    return refit(case_lines(*passes), sorted(failed))
