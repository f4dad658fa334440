"""Real single-GPU training steps as validation cases: defaults, and calibrations that transfer.

A ``commbench --step`` file holds a plan, its measured step time and its profile. Two questions
are asked of every file in a folder (shipped: ``refdata/h100``, one H100):

- **defaults**: how far ``simulate_plan`` on the compute model's defaults is from the step;
- **transfer**: each file calibrates the compute model (``sim.replay.step_fit``: per-class
  efficiencies, launches per modelled kernel, the host time per launch), and every other file
  of the same kind of loop (eager or compiled) is predicted with it. A calibration that only
  describes its own file shows up here as a large error on the others.

    report = validate_steps(load_steps(STEPS_PATH))
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fileio.strict import read_input
from sim.replay.simulate import simulate_plan
from sim.replay.step_fit import calibration_from_step, step_plan
from topologies.hardware import GPUS
from vocab.compute_calibration import STEP_SCHEMA

STEPS_PATH = Path(__file__).resolve().parents[2] / "refdata" / "h100"
"""The shipped ``commbench --step`` files (one H100, eager and compiled)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepPrediction:
    """One predicted step: which file, calibrated on which (empty: defaults)."""

    case: str
    """The predicted file's name (without ``step_`` and ``.json``)."""
    calibrated_on: str
    """The calibrating file's name; empty for the defaults."""
    measured_s: float
    """The measured (unprofiled) step time."""
    predicted_s: float
    """The simulated step time."""

    @property
    def error(self) -> float:
        """Signed relative error, predicted / measured - 1."""
        return self.predicted_s / self.measured_s - 1.0


def load_steps(*folders: Path) -> dict[str, dict[str, Any]]:
    """Every ``step_*.json`` of the ``folders`` by name (one set: each file calibrates every
    other of its loop kind); a file of another schema, or a name in two folders, is a
    ValueError."""
    steps: dict[str, dict[str, Any]] = {}
    where: dict[str, Path] = {}
    for path in (p for folder in folders for p in sorted(folder.glob("step_*.json"))):
        name = path.stem.removeprefix("step_")
        if name in where:
            raise ValueError(f"step {name!r} is in both {where[name].parent} and {path.parent}")
        where[name] = path
        try:
            data = json.loads(read_input(path, what="step measurement"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"malformed input: {path}: {exc}") from None
        if not isinstance(data, dict) or data.get("schema") != STEP_SCHEMA:
            raise ValueError(f"{path}: not a commbench --step file (schema {STEP_SCHEMA!r})")
        steps[name] = data
    if not steps:
        raise ValueError(f"no step_*.json files in {', '.join(str(f) for f in folders)}")
    return steps


def _predict(measurement: Mapping[str, Any], calibration: Any) -> float:
    return simulate_plan(step_plan(measurement), compute_calibration=calibration).step_time_s


def validate_steps(steps: Mapping[str, Mapping[str, Any]]) -> list[StepPrediction]:
    """Defaults for every file, then every ordered pair of files of the same loop kind."""
    out = []
    for name, measured in steps.items():
        step_s = float(measured["timings_s"]["step"])
        out.append(StepPrediction(case=name, calibrated_on="", measured_s=step_s,
                                  predicted_s=_predict(measured, None)))  # fmt: skip
    for source, calibrating in steps.items():
        calibration = calibration_from_step(calibrating, GPUS[str(calibrating["gpu"])])
        for name, measured in steps.items():
            if name == source or bool(measured.get("compiled")) != bool(
                calibrating.get("compiled")
            ):
                continue
            out.append(
                StepPrediction(
                    case=name,
                    calibrated_on=source,
                    measured_s=float(measured["timings_s"]["step"]),
                    predicted_s=_predict(measured, calibration),
                )
            )
    return out


def step_summary(predictions: list[StepPrediction]) -> dict[str, dict[str, float]]:
    """MAPE, largest error and count of the defaults and of the cross-predictions."""
    return error_figures(
        {
            "defaults": [p.error for p in predictions if not p.calibrated_on],
            "transfer": [p.error for p in predictions if p.calibrated_on],
        }
    )


def error_figures(groups: Mapping[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per non-empty group of signed errors: how many, their MAPE and the largest one."""
    return {
        key: {
            "num": len(errors),
            "mape": sum(abs(e) for e in errors) / len(errors),
            "max_abs_error": max(abs(e) for e in errors),
        }
        for key, errors in groups.items()
        if errors
    }
