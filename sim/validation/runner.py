"""Validation against published training runs: simulate each faithful case, compare step times.

The cases come from ``sim.validation.cases`` (case -> plan, or the missing knob) and
``sim.validation.measured`` (the measured step time). Compute is calibrated from the data the
way a user would: a few cases, chosen by a fixed rule (per source and GPU type, the run with the
fewest GPUs, ties broken by file order), fit the compute model's efficiency; those cases are
marked and left out of the error figures, which are reported only on the held-out runs.

    report = run_validation(load_cases(path)); report.summary()["all"]["mape"]
"""

from __future__ import annotations

import fnmatch
import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sim.validation.cases import CaseMapping, map_case
from sim.validation.fit import FIT_EVALUATIONS, fit_compute_calibration

if TYPE_CHECKING:
    from sim.network.calibration import Calibration
    from vocab.compute_calibration import ComputeCalibration

SCHEMA = "commsim-validation/1"
"""Version tag of the validation JSON."""


class Progress(Protocol):
    """Where ``run_validation`` says how far it is (``commsim validate`` draws tqdm bars)."""

    def start(self, phase: str, total: int) -> None:
        """A phase of ``total`` simulations begins: ``calibrating``, then ``simulating``."""

    def advance(self, note: str = "") -> None:
        """One simulation of the phase finished; ``note`` is a line about it, or empty."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """What the simulator predicts for one case."""

    step_time_s: float
    """Predicted seconds per optimizer step."""
    simulated_ranks: int = 0
    """Ranks simulated after folding symmetric ones."""
    breakdown: dict[str, float] = field(default_factory=dict)
    """The critical rank's step, terms that add up to it: ``compute_s``,
    ``exposed_<group>_s``, ``bubble_s``, ``optimizer_s`` and, where present, ``host_s``."""
    in_step_slowdown_s: float = 0.0
    """The fitted in-step slowdown's part of ``compute_s`` (``Breakdown.in_step_slowdown_s``)."""
    memory_gib: float | None = None
    """Predicted peak memory per GPU (GiB, the worst rank)."""
    hbm_gib: float | None = None
    """The GPU's memory (GiB, the catalogue's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    """One simulated published run: predicted against measured step time."""

    case_id: str
    """The case's id in cases.json."""
    source: str
    """Short source key (see ``sim.validation.cases.SOURCES``)."""
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
    breakdown: dict[str, float] = field(default_factory=dict)
    """Where the predicted step goes on the critical rank (see ``Prediction.breakdown``)."""
    in_step_slowdown_s: float = 0.0
    """The fitted in-step slowdown's part of the breakdown's ``compute_s``."""
    measured_memory_gib: float | None = None
    """Peak memory per GPU the source reports (GiB), or ``None``."""
    predicted_memory_gib: float | None = None
    """Predicted peak memory per GPU (GiB)."""
    hbm_gib: float | None = None
    """The GPU's memory (GiB): a run that was measured ran, so its prediction should fit."""
    stack: str = ""
    """Kernel stack the run's plan names (``training.stack``: eager, compile, megatron)."""

    @property
    def memory_error(self) -> float | None:
        """Signed relative error of the predicted memory, where the source reports one."""
        if self.measured_memory_gib is None or self.predicted_memory_gib is None:
            return None
        return self.predicted_memory_gib / self.measured_memory_gib - 1.0

    @property
    def fits(self) -> bool | None:
        """Whether the predicted peak (the caching allocator's reserve included) fits the GPU's
        memory, as the measured run did; None where either is unknown."""
        if self.predicted_memory_gib is None or self.hbm_gib is None:
            return None
        return self.predicted_memory_gib <= self.hbm_gib

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
            "breakdown": dict(self.breakdown),
            "in_step_slowdown_s": self.in_step_slowdown_s,
            "measured_memory_gib": self.measured_memory_gib,
            "predicted_memory_gib": self.predicted_memory_gib,
            "memory_error": self.memory_error,
            "hbm_gib": self.hbm_gib,
            "fits": self.fits,
            "stack": self.stack,
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

    def summary_by_stack(self) -> dict[str, dict[str, float]]:
        """Error figures per kernel stack (``CaseResult.stack``) over held-out cases: what a
        ``commsim plan`` report on defaults quotes (``sim.replay.basis.VALIDATED_ERROR``)."""
        return summarize(self.results, key=lambda result: result.stack)

    def memory_summary(self) -> dict[str, dict[str, float]]:
        """Peak-memory error figures per source (and ``all``) over every case reporting memory:
        nothing is fitted to memory, so calibration cases count too."""
        return summarize_memory(self.results)

    def fits_summary(self) -> dict[str, Any]:
        """Every simulated run ran on its GPUs, so each should be predicted to fit: how many
        are (``num_fit`` of ``num_cases``) and the ids of those that are not."""
        known = [r for r in self.results if r.fits is not None]
        return {
            "num_cases": len(known),
            "num_fit": sum(1 for r in known if r.fits),
            "over": [r.case_id for r in known if not r.fits],
        }

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
            "summary_by_stack": self.summary_by_stack(),
            "memory_summary": self.memory_summary(),
            "fits_summary": self.fits_summary(),
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


def _figures(groups: Mapping[str, list[float]]) -> dict[str, dict[str, float]]:
    """Count, MAPE, max |error| and mean error of each group's errors, ``all`` last."""
    return {
        source: {
            "num_cases": len(errors),
            "mape": mape(errors),
            "max_abs_error": max(abs(e) for e in errors),
            "mean_error": sum(errors) / len(errors),
        }
        for source, errors in sorted(groups.items(), key=lambda item: (item[0] == "all", item[0]))
    }


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
    return _figures(groups)


def summarize_memory(results: Iterable[CaseResult]) -> dict[str, dict[str, float]]:
    """Per source (and ``all``): count, MAPE, max |error| and mean error of the peak memory."""
    groups: dict[str, list[float]] = {}
    for result in results:
        error = result.memory_error
        if error is None:
            continue
        groups.setdefault(result.source, []).append(error)
        groups.setdefault("all", []).append(error)
    return _figures(groups)


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
    chosen_ids = {m.case_id for m in chosen.values()}
    return tuple(m.case_id for m in mappings if m.case_id in chosen_ids)


def simulate_case(
    mapping: CaseMapping,
    *,
    compute_calibration: ComputeCalibration | None = None,
    comm_calibration: Calibration | None = None,
    fidelity: str = "analytical",
) -> Prediction:
    """The prediction for one simulable case, via ``simulate_plan``."""
    from schedules.plan import load_plan
    from schedules.resolve import resolve_plan
    from sim.replay.simulate import simulate_plan
    from topologies.hardware import GPUS

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
    breakdown = {"compute_s": result.breakdown.compute_s}
    for group, seconds in sorted(result.breakdown.exposed_comm_s.items()):
        breakdown[f"exposed_{group}_s"] = seconds
    if result.breakdown.host_s:
        breakdown["host_s"] = result.breakdown.host_s
    breakdown["bubble_s"] = result.breakdown.bubble_s
    breakdown["optimizer_s"] = result.breakdown.optimizer_s
    return Prediction(
        step_time_s=result.step_time_s,
        simulated_ranks=result.num_simulated_ranks,
        breakdown=breakdown,
        in_step_slowdown_s=result.breakdown.in_step_slowdown_s,
        memory_gib=result.memory_gib.get("reserved", result.memory_gib.get("total")),
        hbm_gib=GPUS[mapping.gpu].hbm_bytes / 2**30 if mapping.gpu in GPUS else None,
    )


Simulator = Callable[[CaseMapping, "ComputeCalibration | None"], Prediction]
"""(case, compute calibration) -> prediction."""


def map_cases(cases: Iterable[Mapping[str, Any]], ids: Sequence[str] = ()) -> list[CaseMapping]:
    """Map every case, or only those matching ``ids`` (exact ids or shell patterns: ``nemo*``).

    An id or pattern that matches no case is a ValueError naming it.
    """
    mappings = [map_case(dict(case)) for case in cases]
    if ids:
        for pattern in ids:
            if not any(fnmatch.fnmatchcase(m.case_id, pattern) for m in mappings):
                raise ValueError(f"unknown case id {pattern!r}; see the ids in the cases file")
        mappings = [m for m in mappings if any(fnmatch.fnmatchcase(m.case_id, p) for p in ids)]
    return mappings


Task = tuple[Simulator, CaseMapping, "ComputeCalibration | None"]


def _outcome(task: Task) -> tuple[Prediction, float] | str:
    """(prediction, wall s), or the one-line error of a case that failed."""
    simulate, mapping, calibration = task
    start = time.perf_counter()
    try:
        prediction = simulate(mapping, calibration)
    except (ValueError, NotImplementedError) as exc:
        return (str(exc) or type(exc).__name__).splitlines()[0]
    return prediction, time.perf_counter() - start


Outcome = tuple[Prediction, float] | str


def _outcomes(tasks: Sequence[Task], jobs: int) -> Iterator[tuple[int, Outcome]]:
    """(task index, outcome) as each task finishes, here or in ``jobs`` worker processes.

    Workers report in completion order, so a slow case does not hold back the progress of
    the cases after it; the caller puts the answers back in task order.
    """
    if jobs == 1 or len(tasks) < 2:
        yield from enumerate(map(_outcome, tasks))
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_outcome, task): index for index, task in enumerate(tasks)}
        for future in as_completed(futures):
            yield futures[future], future.result()


def calibration_simulations(mappings: Sequence[CaseMapping]) -> int:
    """Simulations the compute fit runs: every calibration case ``FIT_EVALUATIONS`` times."""
    return len(mappings) * FIT_EVALUATIONS


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
    progress: Progress | None = None,
    jobs: int = 1,
) -> ValidationReport:
    """Fit compute on the calibration cases, then simulate every faithful case (or ``ids``).

    ``calibrate_on=None`` applies the documented rule (``select_calibration_cases``); an empty
    sequence keeps the compute model's defaults and reports the error on every case. A case
    whose plan or simulation raises ValueError or NotImplementedError is listed as failed.
    ``progress`` hears of every simulation, calibration included, as it finishes (worker
    processes too), with a line per simulated case. A network calibration is used only
    for the cases on the node type it was fitted on (``network_calibration_applies``).
    ``jobs`` > 1 simulates the cases in that many processes (default simulator only; each
    case's answer is unchanged).
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
    calibrations, fitted = _fit(_calibration_mappings(every, calibration_ids), simulate, progress)
    tasks = [(simulate, m, calibrations.get(m.gpu or "")) for m in wanted if m.simulable]
    if progress is not None:
        progress.start("simulating", len(tasks))
    outcomes: dict[int, Outcome] = {}
    for index, outcome in _outcomes(tasks, jobs):
        outcomes[index] = outcome
        if progress is not None:
            progress.advance(_progress_note(tasks[index][1].case_id, outcome))
    results: list[CaseResult] = []
    failed: list[tuple[str, str]] = []
    for index, (_, mapping, _) in enumerate(tasks):
        outcome = outcomes[index]
        if isinstance(outcome, str):
            failed.append((mapping.case_id, outcome))
        else:
            results.append(_case_result(mapping, *outcome, calibration_ids))
    return ValidationReport(
        results=tuple(results),
        skipped=tuple(m for m in wanted if not m.simulable),
        failed=tuple(failed),
        calibration_cases=calibration_ids,
        calibration=fitted,
        fidelity=fidelity,
        runtime_s=time.perf_counter() - start,
    )


def _fit(
    mappings: Sequence[CaseMapping], simulate: Simulator, progress: Progress | None
) -> tuple[dict[str, ComputeCalibration], dict[str, Any]]:
    """``fit_compute_calibration`` on the calibration cases, reporting each simulation."""
    if progress is not None and mappings:
        progress.start("calibrating", calibration_simulations(mappings))

    def step_time_s(mapping: CaseMapping, calibration: ComputeCalibration) -> float:
        predicted_s = simulate(mapping, calibration).step_time_s
        if progress is not None:
            progress.advance()
        return predicted_s

    return fit_compute_calibration(mappings, step_time_s)


def _progress_note(case_id: str, outcome: Outcome) -> str:
    if isinstance(outcome, str):
        return f"{case_id}: FAILED: {outcome}"
    prediction, wall_s = outcome
    return f"{case_id}: {prediction.step_time_s:.3f} s predicted ({wall_s:.2f} s wall)"


def _case_result(
    mapping: CaseMapping,
    prediction: Prediction,
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
        predicted_step_time_s=prediction.step_time_s,
        calibration=mapping.case_id in calibration_ids,
        simulated_ranks=prediction.simulated_ranks,
        wall_s=wall_s,
        assumptions=mapping.assumptions,
        table=mapping.table,
        breakdown=dict(prediction.breakdown),
        in_step_slowdown_s=prediction.in_step_slowdown_s,
        measured_memory_gib=mapping.measured_memory_gib,
        predicted_memory_gib=prediction.memory_gib,
        hbm_gib=prediction.hbm_gib,
        stack=str(((mapping.plan or {}).get("training") or {}).get("stack", "")),
    )


def _default_simulator(fidelity: str, comm_calibration: Calibration | None) -> Simulator:
    """``simulate_case`` with the run's network settings (picklable, for worker processes)."""
    return functools.partial(
        _simulate_default, fidelity=fidelity, comm_calibration=comm_calibration
    )


def network_calibration_applies(calibration: Calibration | None, mapping: CaseMapping) -> bool:
    """Whether a network calibration fits this case: same node type (any, if it names none)."""
    if calibration is None or mapping.plan is None:
        return False
    topology = calibration.topology.split()
    return not topology or topology[0] == mapping.plan["cluster"]["node"]


def _simulate_default(
    mapping: CaseMapping,
    compute_calibration: ComputeCalibration | None,
    *,
    fidelity: str,
    comm_calibration: Calibration | None,
) -> Prediction:
    applies = network_calibration_applies(comm_calibration, mapping)
    return simulate_case(
        mapping,
        compute_calibration=compute_calibration,
        comm_calibration=comm_calibration if applies else None,
        fidelity=fidelity,
    )
