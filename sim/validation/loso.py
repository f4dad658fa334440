"""Leave-one-source-out validation of the defaults fitted on published runs.

One default of the compute model comes from published runs: the multi-GPU in-step slowdown of
each GPU generation (``sim.compute.compute_model.IN_STEP_SLOWDOWN``, fitted on every published
run of that generation). Scoring a source with a default fitted on it flatters that source, so
here every source is scored with the slowdown refitted without it: on the other sources' runs of
the same generation (on every other source's run where none is left), least absolute error in
log step time, one parameter.

Each case is simulated twice, without the slowdown and at ``REFERENCE_SLOWDOWN``; its step time
at any other value is interpolated linearly between the two (compute time grows with
1 + slowdown, the exposed communication it hides shrinks: close to linear over the fitted
range).

    report = leave_one_source_out(load_cases(path), jobs=2)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sim.compute.compute_model import IN_STEP_SLOWDOWN, IN_STEP_SLOWDOWN_ELSEWHERE
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
from topologies.hardware import GPUS, gpu_family
from vocab.compute_calibration import ComputeCalibration

SLOWDOWN_RANGE = (0.0, 1.0)
"""Values the refit may take (the calibration file's bounds)."""
REFERENCE_SLOWDOWN = 0.2
"""The second simulation's slowdown, the other end of each case's line."""


def _simulate_with(
    mapping: CaseMapping, calibration: ComputeCalibration | None, *, slowdown: float
) -> Prediction:
    """A case on the defaults with the in-step slowdown set to ``slowdown``."""
    return simulate_case(mapping, compute_calibration=ComputeCalibration(in_step_slowdown=slowdown))


def family_of(gpu: str) -> str:
    """The generation (``GPUSpec.family``) of a case's GPU."""
    spec = GPUS.get(gpu)
    return spec.family if spec is not None else gpu_family(gpu)


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseLine:
    """A case's step time as a function of the slowdown, and its measurement."""

    case_id: str
    """The case's id."""
    source: str
    """Its source key."""
    family: str
    """Its GPU's generation (``GPUSpec.family``)."""
    measured_s: float
    """Measured step time."""
    without_s: float
    """Simulated with no slowdown."""
    at_reference_s: float
    """Simulated with ``REFERENCE_SLOWDOWN``."""

    def predicted_s(self, slowdown: float) -> float:
        """Step time at ``slowdown``, interpolated."""
        slope = (self.at_reference_s - self.without_s) / REFERENCE_SLOWDOWN
        return self.without_s + slope * slowdown

    def error(self, slowdown: float) -> float:
        """Signed relative error at ``slowdown``."""
        return self.predicted_s(slowdown) / self.measured_s - 1.0


def fit_slowdown(lines: Sequence[CaseLine]) -> float:
    """The slowdown minimising the absolute log error over ``lines`` (golden-section search,
    80 steps over ``SLOWDOWN_RANGE``; where a range of values ties, a point inside it). Each
    term is unimodal in the slowdown for step times linear in it; their sum need not be, but on
    the shipped cases every pool's has one minimum (checked on a 1e-4 grid)."""
    low, high = SLOWDOWN_RANGE

    def cost(slowdown: float) -> float:
        return sum(abs(math.log(line.predicted_s(slowdown) / line.measured_s)) for line in lines)

    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = low, high
    for _ in range(80):
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        if cost(c) <= cost(d):
            b = d
        else:
            a = c
    return (a + b) / 2.0


def held_out_pool(lines: Sequence[CaseLine], source: str) -> list[CaseLine]:
    """What the slowdown scoring ``source`` is fitted on: the other sources' runs on its
    generation, or every other source's run where no other source used that generation."""
    families = {line.family for line in lines if line.source == source}
    others = [line for line in lines if line.source != source]
    same = [line for line in others if line.family in families]
    return same or others


@dataclass(frozen=True, slots=True, kw_only=True)
class LosoReport:
    """Per source: the slowdown fitted without it and its error with that slowdown."""

    lines: tuple[CaseLine, ...]
    """Every simulated case."""
    fitted: dict[str, float]
    """Source -> slowdown fitted without it (``held_out_pool``)."""
    fitted_on_all: dict[str, float]
    """In-sample fits: each generation's runs (by ``GPUSpec.family``) and ``all`` runs."""
    failed: tuple[tuple[str, str], ...] = ()
    """(case id, error) of cases that failed to simulate."""

    def errors(self) -> dict[str, float]:
        """Case id -> error with its source's held-out slowdown."""
        return {line.case_id: line.error(self.fitted[line.source]) for line in self.lines}

    def summary(self) -> dict[str, dict[str, float]]:
        """Per source and ``all``: cases, held-out MAPE, mean error (and per source, the
        slowdown it was scored with)."""
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
        }
        return out

    def to_json(self) -> dict[str, Any]:
        """The report as JSON (schema ``commsim-loso/2``)."""
        errors = self.errors()
        return {
            "schema": "commsim-loso/2",
            "default_in_step_slowdown": {**IN_STEP_SLOWDOWN, "other": IN_STEP_SLOWDOWN_ELSEWHERE},
            "fitted_on_all": self.fitted_on_all,
            "reference_in_step_slowdown": REFERENCE_SLOWDOWN,
            "summary": self.summary(),
            "cases": [
                {
                    "id": line.case_id,
                    "source": line.source,
                    "family": line.family,
                    "measured_step_time_s": line.measured_s,
                    "predicted_without_s": line.without_s,
                    "predicted_at_reference_s": line.at_reference_s,
                    "held_out_in_step_slowdown": self.fitted[line.source],
                    "error": errors[line.case_id],
                }
                for line in self.lines
            ],
            "failed": [list(item) for item in self.failed],
        }


def case_lines(without: ValidationReport, at_reference: ValidationReport) -> list[CaseLine]:
    """Pair the two passes' results case by case (cases that failed in either are left out)."""
    by_id: Mapping[str, CaseResult] = {r.case_id: r for r in at_reference.results}
    return [
        CaseLine(
            case_id=r.case_id,
            source=r.source,
            family=family_of(r.gpu),
            measured_s=r.measured_step_time_s,
            without_s=r.predicted_step_time_s,
            at_reference_s=by_id[r.case_id].predicted_step_time_s,
        )
        for r in without.results
        if r.case_id in by_id
    ]


def refit(lines: Sequence[CaseLine], failed: Iterable[tuple[str, str]] = ()) -> LosoReport:
    """Fit the slowdown without each source in turn, and in-sample per generation."""
    sources = sorted({line.source for line in lines})
    fitted = {s: fit_slowdown(held_out_pool(lines, s)) for s in sources}
    families = sorted({line.family for line in lines})
    on_all = {f: fit_slowdown([line for line in lines if line.family == f]) for f in families}
    on_all["all"] = fit_slowdown(lines)
    return LosoReport(lines=tuple(lines), fitted=fitted, fitted_on_all=on_all, failed=tuple(failed))


def leave_one_source_out(
    cases: Iterable[Mapping[str, Any]],
    *,
    ids: Sequence[str] = (),
    progress: Progress | None = None,
    jobs: int = 1,
) -> LosoReport:
    """Simulate every case without the slowdown and at the reference, then refit per source."""
    cases = list(cases)
    passes = []
    for slowdown in (0.0, REFERENCE_SLOWDOWN):
        simulate = functools.partial(_simulate_with, slowdown=slowdown)
        passes.append(
            run_validation(
                cases, ids=ids, calibrate_on=(), simulate=simulate, progress=progress, jobs=jobs
            )
        )
    failed = {*passes[0].failed, *passes[1].failed}
    return refit(case_lines(*passes), sorted(failed))
