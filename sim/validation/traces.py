"""The shipped profiler traces as validation cases: fit on each trace, predict every step.

``refdata/h100/traces`` holds torch.profiler traces of one training step of a plain-PyTorch
Llama-style loop on one H100 (eager, compiled, and a small launch-bound model), the plan of each
traced job and its unprofiled step time (``index.json``). Each trace calibrates the compute model
(``sim.replay.trace_fit.fit_trace`` at its unprofiled step time) and every plan is predicted with
that calibration (``simulate_plan``): the fit's own error on its trace, and how it carries to the
other batch shapes, model sizes and kernel stacks. The defaults are scored beside them.

    predictions = validate_traces(load_trace_cases(TRACES_PATH))
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fileio.strict import read_input
from schedules.plan import Plan, load_plan
from sim.replay.simulate import plan_topology, simulate_plan
from sim.replay.trace_fit import TraceFit, fit_trace
from sim.validation.steps import StepPrediction, error_figures
from vocab.trace_summary import read_step

TRACES_PATH = Path(__file__).resolve().parents[2] / "refdata" / "h100" / "traces"
"""The shipped traces, their plans and step times."""
CASES_SCHEMA = "commsim-trace-cases/1"
"""Version tag of a trace folder's ``index.json``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceCase:
    """One traced job: its trace, its plan and its unprofiled step time."""

    name: str
    """The case's name."""
    trace: Path
    """The trace file."""
    plan: Path
    """The plan of the traced job."""
    step_time_s: float
    """Its unprofiled step time."""


def load_trace_cases(folder: Path) -> dict[str, TraceCase]:
    """The cases of ``folder/index.json``; a malformed index is a ValueError."""
    index = folder / "index.json"
    try:
        data = json.loads(read_input(index, what="trace index"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed input: {index}: {exc}") from None
    cases = data.get("cases") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or data.get("schema") != CASES_SCHEMA
        or not isinstance(cases, dict)
    ):
        raise ValueError(f"{index}: not a trace index (schema {CASES_SCHEMA!r} with cases)")
    out = {}
    for name, case in cases.items():
        try:
            out[name] = TraceCase(
                name=name,
                trace=folder / str(case["trace"]),
                plan=folder / str(case["plan"]),
                step_time_s=float(case["step_time_s"]),
            )
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{index}: case {name!r} needs trace, plan and a numeric step_time_s"
            ) from None
    return out


def fit_case(case: TraceCase) -> tuple[Plan, TraceFit]:
    """The case's plan and the calibration its trace gives at its unprofiled step time."""
    plan = load_plan(case.plan)
    gpu = plan_topology(plan).gpu_spec(0)
    step = read_step(case.trace)
    return plan, fit_trace(step, plan, gpu, step_time_s=case.step_time_s, source_plan=case.name)


def validate_traces(cases: Mapping[str, TraceCase]) -> list[StepPrediction]:
    """Every case on the defaults, then every case with every trace's calibration."""
    plans = {name: load_plan(case.plan) for name, case in cases.items()}
    out = [
        StepPrediction(
            case=name,
            calibrated_on="",
            measured_s=case.step_time_s,
            predicted_s=simulate_plan(plans[name]).step_time_s,
        )
        for name, case in cases.items()
    ]
    for source, calibrating in cases.items():
        _, fit = fit_case(calibrating)
        for name, case in cases.items():
            predicted = simulate_plan(plans[name], compute_calibration=fit.calibration)
            out.append(
                StepPrediction(
                    case=name,
                    calibrated_on=source,
                    measured_s=case.step_time_s,
                    predicted_s=predicted.step_time_s,
                )
            )
    return out


def trace_summary(predictions: list[StepPrediction]) -> dict[str, dict[str, float]]:
    """MAPE, largest error and count of the defaults, the own-trace fits and the transfers."""
    groups = {
        "defaults": [p.error for p in predictions if not p.calibrated_on],
        "own trace": [p.error for p in predictions if p.calibrated_on == p.case],
        "other traces": [
            p.error for p in predictions if p.calibrated_on and p.calibrated_on != p.case
        ],
    }
    return error_figures(groups)
