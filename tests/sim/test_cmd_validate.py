"""``commsim validate``: the text report, the plot, the JSON, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main
from sim.cmd_validate import format_report, plot_bytes
from sim.validation import CaseResult, ValidationReport
from sim.validation_cases import CaseMapping

CASES_PATH = (
    Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "validation" / "cases.json"
)
needs_cases = pytest.mark.skipif(not CASES_PATH.exists(), reason="shared validation data absent")


def _report() -> ValidationReport:
    results = (
        CaseResult(
            case_id="nar_small",
            source="narayanan21",
            gpu="a100-sxm-80gb",
            num_gpus=32,
            measured_step_time_s=3.528,
            measured_how="reported TFLOP/s/GPU with Narayanan eq.(3)",
            predicted_step_time_s=3.5,
            calibration=True,
        ),
        CaseResult(
            case_id="nar_big",
            source="narayanan21",
            gpu="a100-sxm-80gb",
            num_gpus=512,
            measured_step_time_s=10.0,
            measured_how="reported TFLOP/s/GPU with Narayanan eq.(3)",
            predicted_step_time_s=11.0,
            calibration=False,
        ),
    )
    skipped = (
        CaseMapping(
            case_id="mtnlg",
            source="mtnlg530B",
            gpu="a100-sxm-80gb",
            num_gpus=2240,
            plan=None,
            missing=("micro_batch_size (not stated)",),
            assumptions=(),
            measured=None,
        ),
    )
    return ValidationReport(
        results=results,
        skipped=skipped,
        calibration_cases=("nar_small",),
        runtime_s=1.25,
    )


def test_text_report_lists_cases_errors_mape_and_missing_knobs() -> None:
    text = format_report(_report())
    assert "nar_small *" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("nar_")}
    assert lines["nar_big"].split()[1:] == ["512", "10.000", "11.000", "+10.0%"]
    # the calibration case (-0.8 %) is excluded: MAPE over the one held-out case is 10 %
    assert "narayanan21        1 cases  MAPE  10.0%" in text
    assert "mtnlg: micro_batch_size (not stated)" in text
    assert "Validation runtime: 1.2 s" in text or "Validation runtime: 1.3 s" in text


def test_json_has_schema_summary_and_held_out_flags() -> None:
    data = _report().to_json()
    assert data["schema"] == "commsim-validation/1"
    assert data["summary"]["all"]["mape"] == pytest.approx(0.1)
    assert [c["calibration"] for c in data["cases"]] == [True, False]
    assert data["cases"][1]["error"] == pytest.approx(0.1)
    assert data["not_simulated"] == [
        {"id": "mtnlg", "source": "mtnlg530B", "missing": ["micro_batch_size (not stated)"]}
    ]
    json.dumps(data)  # JSON-ready


def test_plot_is_a_png() -> None:
    data = plot_bytes(_report(), "png")
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_missing_cases_file_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    code = main(["validate", str(tmp_path / "absent.json")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("commsim: error: cases file not found") and err.count("\n") == 1


def test_malformed_cases_file_is_exit_2(tmp_path: Path, capsys) -> None:
    path = tmp_path / "cases.json"
    path.write_text("{not json")
    assert main(["validate", str(path)]) == 2
    assert "malformed input" in capsys.readouterr().err


@needs_cases
def test_unknown_case_id_is_exit_2_naming_it(capsys) -> None:
    assert main(["validate", str(CASES_PATH), "--ids", "no_such_case"]) == 2
    assert "no_such_case" in capsys.readouterr().err
