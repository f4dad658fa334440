"""Predict every held-out step file of a folder (default: this one) on the defaults and from
each shipped step file's calibration of the same loop and GPU (refdata/h100), with its peak
memory where measured, and write the folder's predictions.json (run from the repository root:
``python results/h100_heldout/predict.py [FOLDER]``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sim.replay.simulate import simulate_plan
from sim.replay.step_fit import calibration_from_step, step_plan
from sim.validation.steps import STEPS_PATH, _predict, error_figures, load_steps
from topologies.hardware import GPUS

HERE = Path(__file__).resolve().parent


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    held_out, shipped = load_steps(folder), load_steps(STEPS_PATH)
    rows, memory = [], []
    for name, measured in held_out.items():
        step_s = float(measured["timings_s"]["step"])
        if "memory" in measured:
            reserved = measured["memory"]["max_reserved_bytes"] / 2**30
            predicted_gib = simulate_plan(step_plan(measured)).memory_gib["reserved"]
            memory.append({"case": name, "measured_reserved_gib": reserved,
                           "predicted_reserved_gib": predicted_gib,
                           "error": predicted_gib / reserved - 1})  # fmt: skip
        sources = {"(defaults)": None}
        for source, calibrating in shipped.items():
            same_gpu = calibrating["gpu"] == measured["gpu"]
            if same_gpu and bool(calibrating.get("compiled")) == bool(measured.get("compiled")):
                sources[source] = calibration_from_step(calibrating, GPUS[calibrating["gpu"]])
        for source, calibration in sources.items():
            predicted = _predict(measured, calibration)
            rows.append({"case": name, "calibrated_on": source, "measured_step_time_s": step_s,
                         "predicted_step_time_s": predicted, "error": predicted / step_s - 1})  # fmt: skip
    groups = {
        "defaults": [r["error"] for r in rows if r["calibrated_on"] == "(defaults)"],
        "calibrated": [r["error"] for r in rows if r["calibrated_on"] != "(defaults)"],
        "peak_memory": [m["error"] for m in memory],
    }
    out = {
        "schema": "commsim-step-validation/1",
        "about": "commbench --step files measured on one GPU (the files' gpu) after the "
        "calibrations were written (held out), predicted on defaults and from each shipped step "
        "file's calibration of the same loop and GPU (eager or compiled)",
        "summary": error_figures(groups),
        "predictions": rows,
        "peak_memory": memory,
    }
    (folder / "predictions.json").write_text(json.dumps(out, indent=1) + "\n")
    for row in rows:
        if row["calibrated_on"] == "(defaults)":
            print(f"{row['case']:48s} {row['error']:+7.1%}")
    for key, figures in out["summary"].items():
        print(key, {k: round(v, 4) for k, v in figures.items()})


if __name__ == "__main__":
    main()
