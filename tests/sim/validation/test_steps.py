"""Real H100 steps as validation cases: each file calibrates, the others are predicted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.validation.steps import STEPS_PATH, load_steps, step_summary, validate_steps


def test_the_shipped_steps_load_and_every_same_kind_pair_is_predicted() -> None:
    steps = load_steps(STEPS_PATH)
    assert len(steps) == 9
    predictions = validate_steps(steps)
    eager = sum(1 for m in steps.values() if not m["compiled"])
    compiled = len(steps) - eager
    pairs = eager * (eager - 1) + compiled * (compiled - 1)
    assert len(predictions) == len(steps) + pairs
    summary = step_summary(predictions)
    assert summary["defaults"]["num"] == 9 and summary["transfer"]["num"] == pairs
    # a file calibrating itself is the closed loop: it must reproduce its own step
    assert all(p.case != p.calibrated_on for p in predictions)


def test_a_calibration_reproduces_its_own_step() -> None:
    from sim.replay.simulate import simulate_plan
    from sim.replay.step_fit import calibration_from_step, step_plan
    from topologies.hardware import GPUS

    for name, measured in load_steps(STEPS_PATH).items():
        calibration = calibration_from_step(measured, GPUS["h100-sxm"])
        predicted = simulate_plan(step_plan(measured), compute_calibration=calibration)
        step_s = measured["timings_s"]["step"]
        if calibration.host_s_per_launch is not None:  # launch-bound: solved to match
            assert predicted.step_time_s == pytest.approx(step_s, rel=1e-6), name
        else:  # GPU-bound: the profiled kernels' time, within the profile's own spread
            assert predicted.step_time_s == pytest.approx(step_s, rel=0.08), name


def test_a_folder_without_step_files_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no step_"):
        load_steps(tmp_path)
    (tmp_path / "step_x.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ValueError, match="not a commbench --step file"):
        load_steps(tmp_path)


def test_several_folders_are_one_set(tmp_path: Path) -> None:
    """Steps of one machine kept in several folders calibrate each other as one set; a name
    in two of them is refused."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    shipped = sorted(STEPS_PATH.glob("step_*.json"))
    for path in shipped[:4]:
        (first / path.name).write_text(path.read_text())
    for path in shipped[4:]:
        (second / path.name).write_text(path.read_text())
    assert load_steps(first, second) == load_steps(STEPS_PATH)
    (second / shipped[0].name).write_text(shipped[0].read_text())
    with pytest.raises(ValueError, match=f"step '{shipped[0].stem[5:]}' is in both"):
        load_steps(first, second)
