"""vocab.compute_calibration: one reader for the files a compute calibration comes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vocab.compute_calibration import (
    COMPUTE_SCHEMA,
    STEP_SCHEMA,
    ComputeCalibration,
    load_compute_calibration,
    load_compute_source,
    save_compute_calibration,
)


def test_a_source_is_a_calibration_or_a_step_measurement(tmp_path: Path) -> None:
    calibration = tmp_path / "compute.json"
    save_compute_calibration(ComputeCalibration(time_scale=1.5), calibration)
    loaded = load_compute_source(calibration)
    assert loaded == load_compute_calibration(calibration) == ComputeCalibration(time_scale=1.5)
    step = tmp_path / "step.json"
    step.write_text(json.dumps({"schema": STEP_SCHEMA, "gpu": "h100-sxm"}))
    assert load_compute_source(step) == {"schema": STEP_SCHEMA, "gpu": "h100-sxm"}


def test_a_step_measurement_is_not_a_calibration(tmp_path: Path) -> None:
    step = tmp_path / "step.json"
    step.write_text(json.dumps({"schema": STEP_SCHEMA}))
    with pytest.raises(ValueError, match=f"is not '{COMPUTE_SCHEMA}'"):
        load_compute_calibration(step)


@pytest.mark.parametrize("loader", [load_compute_calibration, load_compute_source])
def test_bad_files_are_one_line_naming_the_file(tmp_path: Path, loader: Any) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match=r"broken\.json: not valid JSON"):
        loader(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[1]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        loader(listed)
    with pytest.raises(FileNotFoundError, match=r"missing\.json"):
        loader(tmp_path / "missing.json")
