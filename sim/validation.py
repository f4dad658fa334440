"""Validation against published training runs: simulate each faithful case, compare step times.

The cases come from ``sim.validation_cases`` (case -> plan, or the missing knob) and
``sim.validation_measured`` (the measured step time). Compute is calibrated from the data the
way a user would: a few cases, chosen by a fixed rule (per source and GPU type, the run with the
fewest GPUs, ties broken by file order), fit the compute model's efficiency; those cases are
marked and left out of the error figures, which are reported only on the held-out runs.

    report = run_validation(load_cases(path)); report.summary()["all"]["mape"]
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sim.validation_cases import CaseMapping, map_case

if TYPE_CHECKING:
    from sim.calibration import Calibration
    from sim.compute import ComputeCalibration

SCHEMA = "commsim-validation/1"
"""Version tag of the validation JSON."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    """One simulated published run: predicted against measured step time."""

    case_id: str
    """The case's id in cases.json."""
    source: str
    """Short source key (see ``sim.validation_cases.SOURCES``)."""
    gpu: str
    """GPU key of the topologies catalogue."""
    num_gpus: int
    """World size of the run."""
    measured_step_time_s: float
    """Measured seconds per optimizer step."""
    measured_how: str
    """How the measured step time was obtained from what the source reported."""
    predicted_step_time_s: float
    """Simulated seconds per optimizer step."""
    calibration: bool
    """Whether this case was used to fit the compute calibration (then excluded from errors)."""
    simulated_ranks: int = 0
    """Ranks simulated after folding symmetric ones."""
    wall_s: float = 0.0
    """Wall-clock seconds the simulation took."""
    assumptions: tuple[str, ...] = ()
    """Choices made where the source is ambiguous."""
    table: str = ""
    """Where in the source the run is reported (e.g. "Table 1")."""

    @property
    def group(self) -> str:
        """Source and table, e.g. "narayanan21 Table 2": runs measured the same way."""
        return f"{self.source} {self.table}".strip()

    @property
    def error(self) -> float:
        """Signed relative error of the prediction: predicted / measured - 1."""
        return self.predicted_step_time_s / self.measured_step_time_s - 1.0

    def to_json(self) -> dict[str, Any]:
        """The case's entry in the validation JSON."""
        return {
            "id": self.case_id,
            "source": self.source,
            "table": self.table,
            "gpu": self.gpu,
            "num_gpus": self.num_gpus,
            "measured_step_time_s": self.measured_step_time_s,
            "measured_how": self.measured_how,
            "predicted_step_time_s": self.predicted_step_time_s,
            "error": self.error,
            "calibration": self.calibration,
            "simulated_ranks": self.simulated_ranks,
            "wall_s": self.wall_s,
            "assumptions": list(self.assumptions),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationReport:
    """Everything ``commsim validate`` reports."""

    results: tuple[CaseResult, ...]
    """Simulated cases, in file order."""
    skipped: tuple[CaseMapping, ...]
    """Cases that cannot be simulated faithfully, each with its missing knobs."""
    failed: tuple[tuple[str, str], ...] = ()
    """Cases whose plan or simulation raised an error: (case id, one-line message)."""
    calibration_cases: tuple[str, ...] = ()
    """Ids of the cases the compute calibration was fitted on."""
    calibration: dict[str, Any] = field(default_factory=dict)
    """The fitted compute parameters per GPU type (JSON-ready)."""
    fidelity: str = "analytical"
    """Network fidelity used."""
    runtime_s: float = 0.0
    """Wall-clock seconds of the whole validation (calibration included)."""

    def summary(self) -> dict[str, dict[str, float]]:
        """Error figures per source over held-out cases, plus ``all``."""
        return summarize(self.results)

    def summary_by_table(self) -> dict[str, dict[str, float]]:
        """Error figures per source table (``CaseResult.group``) over held-out cases."""
        return summarize(self.results, key=lambda result: result.group)

    def to_json(self) -> dict[str, Any]:
        """The validation JSON (schema ``commsim-validation/1``)."""
        return {
            "schema": SCHEMA,
            "config": {
                "fidelity": self.fidelity,
                "calibration_cases": list(self.calibration_cases),
            },
            "calibration": self.calibration,
            "summary": self.summary(),
            "summary_by_table": self.summary_by_table(),
            "cases": [result.to_json() for result in self.results],
            "failed": [{"id": case_id, "error": message} for case_id, message in self.failed],
            "not_simulated": [
                {"id": m.case_id, "source": m.source, "missing": list(m.missing)}
                for m in self.skipped
            ],
            "runtime_s": self.runtime_s,
        }


def mape(errors: Iterable[float]) -> float:
    """Mean absolute percentage error (as a fraction) of signed relative errors."""
    values = [abs(e) for e in errors]
    return sum(values) / len(values) if values else math.nan


def summarize(
    results: Iterable[CaseResult], key: Callable[[CaseResult], str] | None = None
) -> dict[str, dict[str, float]]:
    """Per source, or per ``key`` (and ``all``): held-out count, MAPE, max |error|, mean error."""
    groups: dict[str, list[float]] = {}
    for result in results:
        if result.calibration:
            continue
        name = result.source if key is None else key(result)
        groups.setdefault(name, []).append(result.error)
        groups.setdefault("all", []).append(result.error)
    return {
        source: {
            "num_cases": float(len(errors)),
            "mape": mape(errors),
            "max_abs_error": max(abs(e) for e in errors),
            "mean_error": sum(errors) / len(errors),
        }
        for source, errors in sorted(groups.items(), key=lambda item: (item[0] == "all", item[0]))
    }


def select_calibration_cases(mappings: Sequence[CaseMapping]) -> tuple[str, ...]:
    """The calibration rule: per (source, GPU type), the simulable case with the fewest GPUs.

    Ties go to the case that comes first in the file. The rule looks only at the run's size,
    never at its error, so it cannot be tuned to flatter the result.
    """
    chosen: dict[tuple[str, str], CaseMapping] = {}
    for mapping in mappings:
        if not mapping.simulable or mapping.gpu is None or mapping.num_gpus is None:
            continue
        key = (mapping.source, mapping.gpu)
        best = chosen.get(key)
        if best is None or mapping.num_gpus < (best.num_gpus or 0):
            chosen[key] = mapping
    return tuple(m.case_id for m in mappings if m in chosen.values())


def simulate_case(
    mapping: CaseMapping,
    *,
    compute_calibration: ComputeCalibration | None = None,
    comm_calibration: Calibration | None = None,
    fidelity: str = "analytical",
) -> tuple[float, int]:
    """(predicted step time in s, simulated ranks) of one simulable case via ``simulate_plan``."""
    from schedules.plan import load_plan, resolve_plan
    from sim.plan_sim import simulate_plan

    if mapping.plan is None or mapping.num_gpus is None:
        raise ValueError(
            f"case {mapping.case_id} cannot be simulated: {'; '.join(mapping.missing)}"
        )
    plan = resolve_plan(load_plan(mapping.plan), mapping.num_gpus)
    result = simulate_plan(
        plan,
        comm_calibration=comm_calibration,
        compute_calibration=compute_calibration,
        fidelity=fidelity,
    )
    return result.step_time_s, result.num_simulated_ranks


Simulator = Callable[[CaseMapping, "ComputeCalibration | None"], tuple[float, int]]
"""(case, compute calibration) -> (predicted step time s, simulated ranks)."""


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
    from sim.compute import ComputeCalibration, default_efficiency
    from topologies.hardware import GPUS

    spec = GPUS[gpu]
    efficiency = {kind: scale * default_efficiency(spec, kind, dtype) for kind in COMPUTE_KINDS}
    return ComputeCalibration(
        device=f"fitted on published runs (scale {scale:.4f})", gpu=gpu, efficiency=efficiency
    )


def fit_compute_calibration(
    mappings: Sequence[CaseMapping], simulate: Simulator
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
        calibrations[gpu], described[gpu] = _fit_one_gpu(gpu, group, simulate)
    return calibrations, described


def _fit_one_gpu(
    gpu: str, group: Sequence[CaseMapping], simulate: Simulator
) -> tuple[ComputeCalibration, dict[str, Any]]:
    dtype = str(group[0].plan["training"]["precision"])  # type: ignore[index]
    measured = [measured_of(m) for m in group]
    evaluations: list[float] = []

    def cost(scale: float) -> float:
        evaluations.append(scale)
        calibration = scaled_compute_calibration(gpu, dtype, scale)
        return log_error_cost([simulate(m, calibration)[0] for m in group], measured)

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


def map_cases(cases: Iterable[Mapping[str, Any]], ids: Sequence[str] = ()) -> list[CaseMapping]:
    """Map every case (or only ``ids``, ValueError naming any unknown id)."""
    mappings = [map_case(dict(case)) for case in cases]
    if ids:
        known = {m.case_id for m in mappings}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise ValueError(f"unknown case id {unknown[0]!r}; see the ids in the cases file")
        mappings = [m for m in mappings if m.case_id in ids]
    return mappings


Task = tuple[Simulator, CaseMapping, "ComputeCalibration | None"]


def _outcome(task: Task) -> tuple[float, int, float] | str:
    """(predicted s, simulated ranks, wall s), or the one-line error of a case that failed."""
    simulate, mapping, calibration = task
    start = time.perf_counter()
    try:
        predicted_s, ranks = simulate(mapping, calibration)
    except (ValueError, NotImplementedError) as exc:
        return (str(exc) or type(exc).__name__).splitlines()[0]
    return predicted_s, ranks, time.perf_counter() - start


def _outcomes(tasks: Sequence[Task], jobs: int) -> Iterator[tuple[float, int, float] | str]:
    """Each task's outcome in order, computed here or in ``jobs`` worker processes."""
    if jobs == 1 or len(tasks) < 2:
        yield from map(_outcome, tasks)
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(_outcome, tasks)


def _calibration_mappings(every: Sequence[CaseMapping], ids: Sequence[str]) -> list[CaseMapping]:
    by_id = {m.case_id: m for m in every}
    for case_id in ids:
        mapping = by_id.get(case_id)
        if mapping is None:
            raise ValueError(f"unknown calibration case id {case_id!r}")
        if not mapping.simulable:
            reason = "; ".join(mapping.missing)
            raise ValueError(f"calibration case {case_id!r} cannot be simulated: {reason}")
    return [by_id[case_id] for case_id in ids]


def run_validation(
    cases: Iterable[Mapping[str, Any]],
    *,
    ids: Sequence[str] = (),
    calibrate_on: Sequence[str] | None = None,
    fidelity: str = "analytical",
    comm_calibration: Calibration | None = None,
    simulate: Simulator | None = None,
    progress: Callable[[str], None] | None = None,
    jobs: int = 1,
) -> ValidationReport:
    """Fit compute on the calibration cases, then simulate every faithful case (or ``ids``).

    ``calibrate_on=None`` applies the documented rule (``select_calibration_cases``); an empty
    sequence keeps the compute model's defaults and reports the error on every case. A case
    whose plan or simulation raises ValueError or NotImplementedError is listed as failed.
    ``progress`` receives one line per simulated case. ``jobs`` > 1 simulates the cases in
    that many processes (the default simulator only; each case's answer is unchanged).
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    start = time.perf_counter()
    cases = list(cases)
    every = map_cases(cases)
    wanted = map_cases(cases, ids) if ids else every
    if simulate is None:
        simulate = _default_simulator(fidelity, comm_calibration)
    calibration_ids = (
        select_calibration_cases(every) if calibrate_on is None else tuple(calibrate_on)
    )
    calibrations, fitted = fit_compute_calibration(
        _calibration_mappings(every, calibration_ids), simulate
    )
    results: list[CaseResult] = []
    failed: list[tuple[str, str]] = []
    tasks = [(simulate, m, calibrations.get(m.gpu or "")) for m in wanted if m.simulable]
    for (_, mapping, _), outcome in zip(tasks, _outcomes(tasks, jobs), strict=True):
        if isinstance(outcome, str):
            failed.append((mapping.case_id, outcome))
            continue
        predicted_s, ranks, wall_s = outcome
        results.append(_case_result(mapping, predicted_s, ranks, wall_s, calibration_ids))
        if progress is not None:
            progress(f"{mapping.case_id}: {predicted_s:.3f} s predicted ({wall_s:.2f} s wall)")
    return ValidationReport(
        results=tuple(results),
        skipped=tuple(m for m in wanted if not m.simulable),
        failed=tuple(failed),
        calibration_cases=calibration_ids,
        calibration=fitted,
        fidelity=fidelity,
        runtime_s=time.perf_counter() - start,
    )


def _case_result(
    mapping: CaseMapping,
    predicted_s: float,
    ranks: int,
    wall_s: float,
    calibration_ids: Sequence[str],
) -> CaseResult:
    assert mapping.measured is not None and mapping.gpu is not None
    return CaseResult(
        case_id=mapping.case_id,
        source=mapping.source,
        gpu=mapping.gpu,
        num_gpus=mapping.num_gpus or 0,
        measured_step_time_s=mapping.measured.step_time_s,
        measured_how=mapping.measured.how,
        predicted_step_time_s=predicted_s,
        calibration=mapping.case_id in calibration_ids,
        simulated_ranks=ranks,
        wall_s=wall_s,
        assumptions=mapping.assumptions,
        table=mapping.table,
    )


def _default_simulator(fidelity: str, comm_calibration: Calibration | None) -> Simulator:
    """``simulate_case`` with the run's network settings (picklable, for worker processes)."""
    return functools.partial(
        _simulate_default, fidelity=fidelity, comm_calibration=comm_calibration
    )


def _simulate_default(
    mapping: CaseMapping,
    compute_calibration: ComputeCalibration | None,
    *,
    fidelity: str,
    comm_calibration: Calibration | None,
) -> tuple[float, int]:
    return simulate_case(
        mapping,
        compute_calibration=compute_calibration,
        comm_calibration=comm_calibration,
        fidelity=fidelity,
    )
