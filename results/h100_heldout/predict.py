"""Predict every held-out step file here on the defaults and from each shipped step file's
calibration of the same loop (refdata/h100), and write predictions.json (run from the repository
root: ``python results/h100_heldout/predict.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from sim.replay.step_fit import calibration_from_step
from sim.validation.steps import STEPS_PATH, _predict, error_figures, load_steps
from topologies.hardware import GPUS

HERE = Path(__file__).resolve().parent


def main() -> None:
    held_out, shipped = load_steps(HERE), load_steps(STEPS_PATH)
    rows = []
    for name, measured in held_out.items():
        step_s = float(measured["timings_s"]["step"])
        sources = {"(defaults)": None}
        for source, calibrating in shipped.items():
            if bool(calibrating.get("compiled")) == bool(measured.get("compiled")):
                sources[source] = calibration_from_step(calibrating, GPUS[calibrating["gpu"]])
        for source, calibration in sources.items():
            predicted = _predict(measured, calibration)
            rows.append({"case": name, "calibrated_on": source, "measured_step_time_s": step_s,
                         "predicted_step_time_s": predicted, "error": predicted / step_s - 1})  # fmt: skip
    groups = {
        "defaults": [r["error"] for r in rows if r["calibrated_on"] == "(defaults)"],
        "calibrated": [r["error"] for r in rows if r["calibrated_on"] != "(defaults)"],
    }
    out = {
        "schema": "commsim-step-validation/1",
        "about": "commbench --step files measured on one H100 after the calibrations were "
        "written (held out), predicted on defaults and from each shipped step file's calibration "
        "of the same loop (eager or compiled)",
        "summary": error_figures(groups),
        "predictions": rows,
    }
    (HERE / "predictions.json").write_text(json.dumps(out, indent=1) + "\n")
    for row in rows:
        if row["calibrated_on"] == "(defaults)":
            print(f"{row['case']:48s} {row['error']:+7.1%}")
    for key, figures in out["summary"].items():
        print(key, {k: round(v, 4) for k, v in figures.items()})


if __name__ == "__main__":
    main()
