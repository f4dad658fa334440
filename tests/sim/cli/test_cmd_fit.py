"""``commsim fit``: one measured step fits the compute speed; absurd fits are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli.fit import MIN_GEMM_EFFICIENCY, fit_time_scale
from sim.cli.main import main
from tests.sim.cli.test_cmd_plan import TINY_PLAN, _write_plan
from vocab.compute_calibration import (
    ComputeCalibration,
    load_compute_calibration,
    save_compute_calibration,
)


def test_regula_falsi_finds_the_root_of_a_monotone_step() -> None:
    scale, simulated, calls = fit_time_scale(8.0, lambda s: 2.0 + 3.0 * s, low=0.1, high=10.0)
    assert scale == pytest.approx(2.0, rel=1e-3)  # 2 + 3 * 2 = 8
    assert simulated == pytest.approx(8.0, rel=1e-4)
    assert calls < 20
    with pytest.raises(ValueError, match=r"below:2\.3"):
        fit_time_scale(1.0, lambda s: 2.0 + 3.0 * s, low=0.1, high=10.0)
    with pytest.raises(ValueError, match="above:32"):
        fit_time_scale(100.0, lambda s: 2.0 + 3.0 * s, low=0.1, high=10.0)


def _step(plan: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> float:
    assert main(["plan", str(plan), "--json", *extra]) == 0
    return float(json.loads(capsys.readouterr().out)["step_time_s"])


def test_a_fitted_calibration_reproduces_the_measured_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # wide enough that the GPU, not the host's launches, sets the step (the scale is then unique)
    wide = {**TINY_PLAN["model"], "hidden_size": 4096, "num_heads": 32, "ffn_hidden_size": 16384}
    plan = _write_plan(tmp_path, {**TINY_PLAN, "model": {**wide, "seq_len": 2048}})
    slower = tmp_path / "slower.json"
    save_compute_calibration(ComputeCalibration(time_scale=1.3), slower)
    measured = _step(plan, capsys, "--compute-calibration", str(slower))
    out = tmp_path / "fitted.json"
    args = ["fit", str(plan), "--step-time", repr(measured), "--compute-calibration", str(out)]
    assert main([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["time_scale"] == pytest.approx(1.3, rel=1e-3)
    assert summary["simulated_step_s"] == pytest.approx(measured, rel=1e-4)
    fitted = load_compute_calibration(out)
    assert fitted.time_scale == pytest.approx(1.3, rel=1e-3)
    assert "measured step" in fitted.fitted_on
    assert _step(plan, capsys, "--compute-calibration", str(out)) == pytest.approx(
        measured, rel=1e-4
    )


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ("1e-6", "is shorter than this plan can run with its GEMMs at the GPU's dense peak"),
        ("1e4", f"at {MIN_GEMM_EFFICIENCY:.0%} of peak"),
        ("-3", "--step-time must be a positive number of seconds, got -3.0"),
        ("nan", "--step-time must be a positive number of seconds, got nan"),
    ],
)
def test_absurd_fits_are_refused_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], step: str, message: str
) -> None:
    plan = _write_plan(tmp_path, TINY_PLAN)
    out = tmp_path / "fitted.json"
    code = main(["fit", str(plan), "--step-time", step, "--compute-calibration", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not out.exists()


def test_a_calibration_with_an_absurd_time_scale_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"schema": "commsim-compute/1", "time_scale": 1e9}))
    with pytest.raises(ValueError, match=r"time_scale must be a number in \[0.05, 20.0\]"):
        load_compute_calibration(path)
