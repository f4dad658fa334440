"""The shipped H100 traces: each trace's fit predicts every traced step (issue 27's targets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.validation.traces import TRACES_PATH, load_trace_cases, trace_summary, validate_traces


@pytest.fixture(scope="module")
def predictions() -> dict[tuple[str, str], float]:
    found = validate_traces(load_trace_cases(TRACES_PATH))
    return {(p.case, p.calibrated_on): p.error for p in found}


def test_every_trace_predicts_every_step(predictions: dict) -> None:
    cases = {case for case, _ in predictions}
    assert len(cases) == 3 and len(predictions) == 3 + 3 * 3


def test_the_small_launch_bound_step_meets_the_issues_targets(predictions: dict) -> None:
    small, llama = "small-h1024-s1024-b4", "llama1b-s4096-b2"
    assert abs(predictions[(small, small)]) < 0.10  # fitted on its own trace
    assert abs(predictions[(small, llama)]) < 0.15  # fitted on the llama1b trace


def test_the_summary_separates_own_trace_from_transfer(predictions: dict) -> None:
    from sim.validation.steps import StepPrediction

    rows = [StepPrediction(case=c, calibrated_on=s, measured_s=1.0, predicted_s=1.0 + e)
            for (c, s), e in predictions.items()]  # fmt: skip
    summary = trace_summary(rows)
    assert [summary[k]["num"] for k in ("defaults", "own trace", "other traces")] == [3, 3, 6]


def test_a_malformed_index_is_refused(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text(json.dumps({"schema": "x", "cases": {}}))
    with pytest.raises(ValueError, match="not a trace index"):
        load_trace_cases(tmp_path)
    (tmp_path / "index.json").write_text(
        json.dumps({"schema": "commsim-trace-cases/1", "cases": {"a": {"trace": "t"}}})
    )
    with pytest.raises(ValueError, match="case 'a' needs trace, plan"):
        load_trace_cases(tmp_path)
