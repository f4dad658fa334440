"""Validation runner pieces: error figures, the calibration-case rule, the 1-D fit."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest

import refdata
from sim.validation.cases import CaseMapping, load_cases
from sim.validation.measured import Measurement
from sim.validation.runner import (
    CaseResult,
    Prediction,
    ValidationReport,
    calibration_simulations,
    map_cases,
    mape,
    network_calibration_applies,
    run_validation,
    select_calibration_cases,
    summarize,
)


def _result(case_id: str, source: str, measured: float, predicted: float, calib: bool = False):
    return CaseResult(
        case_id=case_id,
        source=source,
        gpu="a100-sxm-80gb",
        num_gpus=8,
        measured_step_time_s=measured,
        measured_how="reported iteration time",
        predicted_step_time_s=predicted,
        calibration=calib,
    )


def _mapping(case_id: str, source: str, gpu: str, num_gpus: int, simulable: bool = True):
    return CaseMapping(
        case_id=case_id,
        source=source,
        gpu=gpu,
        num_gpus=num_gpus,
        plan={"model": {}} if simulable else None,
        missing=() if simulable else ("micro_batch_size (not stated)",),
        assumptions=(),
        measured=Measurement(step_time_s=1.0, how="reported iteration time"),
    )


def test_error_is_signed_relative() -> None:
    assert _result("a", "s", 2.0, 2.2).error == pytest.approx(0.1)
    assert _result("a", "s", 2.0, 1.5).error == pytest.approx(-0.25)


def test_mape_of_hand_values() -> None:
    assert mape([0.1, -0.3]) == pytest.approx(0.2)
    assert math.isnan(mape([]))


def test_summary_excludes_calibration_cases_and_groups_by_source() -> None:
    results = [
        _result("a1", "alpha", 10.0, 11.0),  # +10 %
        _result("a2", "alpha", 10.0, 7.0),  # -30 %
        _result("a3", "alpha", 10.0, 30.0, calib=True),  # excluded
        _result("b1", "beta", 4.0, 4.2),  # +5 %
    ]
    summary = summarize(results)
    assert list(summary) == ["alpha", "beta", "all"]
    assert summary["alpha"]["num_cases"] == 2
    assert summary["alpha"]["mape"] == pytest.approx(0.2)
    assert summary["alpha"]["max_abs_error"] == pytest.approx(0.3)
    assert summary["alpha"]["mean_error"] == pytest.approx(-0.1)
    assert summary["all"]["num_cases"] == 3
    assert summary["all"]["mape"] == pytest.approx((0.1 + 0.3 + 0.05) / 3)


def test_runs_that_ran_are_checked_against_their_gpus_memory() -> None:
    fits = dataclasses.replace(_result("a", "s", 1.0, 1.0), predicted_memory_gib=79.9, hbm_gib=80.0)
    over = dataclasses.replace(_result("b", "s", 1.0, 1.0), predicted_memory_gib=80.1, hbm_gib=80.0)
    unknown = _result("c", "s", 1.0, 1.0)
    assert (fits.fits, over.fits, unknown.fits) == (True, False, None)
    report = ValidationReport(results=(fits, over, unknown), skipped=())
    assert report.fits_summary() == {"num_cases": 2, "num_fit": 1, "over": ["b"]}
    assert report.to_json()["cases"][1]["fits"] is False


def test_calibration_rule_picks_fewest_gpus_per_source_and_gpu_first_on_ties() -> None:
    mappings = [
        _mapping("n32", "nar", "a100-sxm-80gb", 32),
        _mapping("n8_unsimulable", "nar", "a100-sxm-80gb", 8, simulable=False),
        _mapping("n64", "nar", "a100-sxm-80gb", 64),
        _mapping("k8_first", "kor", "a100-sxm-80gb", 8),
        _mapping("k8_second", "kor", "a100-sxm-80gb", 8),
        _mapping("h16", "nemo", "h100-sxm", 16),
        _mapping("h8", "nemo", "h100-sxm", 8),
    ]
    assert select_calibration_cases(mappings) == ("n32", "k8_first", "h8")


# --- the whole runner with a stand-in simulator (the real one: test_cmd_validate) ---


def _fake_case(case_id: str, gpu: str, num_gpus: int, step_s: float) -> dict:
    """A minimal faithful case: 1 layer GPT, DDP on ``num_gpus`` GPUs, reported step time."""
    return {
        "id": case_id,
        "model": {
            "name": "tiny",
            "arch": "GPT (GeLU 4h MLP)",
            "num_layers": 2,
            "hidden_size": 64,
            "num_heads": 4,
            "ffn_hidden_size": 256,
            "vocab_size": 128,
            "seq_len": 32,
        },
        "hardware": {
            "gpu": gpu,
            "num_gpus": num_gpus,
            "gpus_per_node": 8,
            "inter_node": "8x Mellanox HDR InfiniBand 200 Gb/s per node",
        },
        "parallel": {
            "tp": 1,
            "pp": 1,
            "dp": num_gpus,
            "zero_stage": 0,
            "recompute": "none",
            "sequence_parallel": False,
            "micro_batch_size": 1,
            "global_batch_size": num_gpus,
            "precision": "bf16",
        },
        "measured": {"iteration_time_s": step_s},
    }


def _scale_simulator(true_scale: float):
    """Predicts measured x fitted scale / true_scale: the fit must find ``true_scale``."""

    def simulate(mapping, calibration):
        scale = 1.0 if calibration is None else calibration.time_scale
        return Prediction(step_time_s=mapping.measured.step_time_s * scale / true_scale)

    return simulate


def test_run_validation_fits_the_scale_and_reports_only_held_out_cases() -> None:
    cases = [
        _fake_case("a_16", "A100-SXM4-80GB", 16, 2.0),
        _fake_case("a_8", "A100-SXM4-80GB", 8, 1.0),
        _fake_case("h_8", "H100-SXM5-80GB", 8, 0.5),
        _fake_case("h_64", "H100-SXM5-80GB", 64, 0.7),
    ]
    report = run_validation(cases, simulate=_scale_simulator(0.8))
    assert report.calibration_cases == ("a_8", "h_8")
    for gpu in ("a100-sxm-80gb", "h100-sxm"):
        assert report.calibration[gpu]["time_scale"] == pytest.approx(0.8, abs=1e-3)
    assert [r.case_id for r in report.results] == ["a_16", "a_8", "h_8", "h_64"]
    assert [r.calibration for r in report.results] == [False, True, True, False]
    summary = report.summary()
    assert summary["all"]["num_cases"] == 2
    assert summary["all"]["mape"] == pytest.approx(0.0, abs=2e-3)


def test_run_validation_without_calibration_reports_every_case() -> None:
    cases = [_fake_case("a_8", "A100-SXM4-80GB", 8, 1.0)]
    report = run_validation(cases, calibrate_on=(), simulate=_scale_simulator(1.2))
    assert report.calibration_cases == () and report.calibration == {}
    assert report.results[0].error == pytest.approx(1 / 1.2 - 1)
    assert report.summary()["all"]["num_cases"] == 1


def test_run_validation_rejects_unknown_or_unsimulable_calibration_cases() -> None:
    unsimulable = _fake_case("no_mbs", "A100-SXM4-80GB", 8, 1.0)
    unsimulable["parallel"]["micro_batch_size"] = "not stated"
    cases = [_fake_case("a_8", "A100-SXM4-80GB", 8, 1.0), unsimulable]
    with pytest.raises(ValueError, match="unknown calibration case id 'nope'"):
        run_validation(cases, calibrate_on=("nope",), simulate=_scale_simulator(1.0))
    with pytest.raises(ValueError, match="'no_mbs' cannot be simulated: micro_batch_size"):
        run_validation(cases, calibrate_on=("no_mbs",), simulate=_scale_simulator(1.0))
    report = run_validation(cases, ids=("no_mbs",), simulate=_scale_simulator(1.0))
    assert report.results == () and [m.case_id for m in report.skipped] == ["no_mbs"]


def test_simulation_errors_are_reported_per_case_not_raised() -> None:
    def failing(mapping, calibration):
        if mapping.case_id == "bad":
            raise ValueError("pipeline too deep\nsecond line")
        return Prediction(step_time_s=1.0, simulated_ranks=1)

    cases = [_fake_case("good", "A100-SXM4-80GB", 8, 1.0), _fake_case("bad", "V100", 8, 1.0)]
    cases[1]["hardware"]["gpu"] = "A100-SXM4-80GB"
    report = run_validation(cases, calibrate_on=(), simulate=failing)
    assert [r.case_id for r in report.results] == ["good"]
    assert report.failed == (("bad", "pipeline too deep"),)


CASES_PATH = refdata.CASES_PATH


def test_ids_select_exact_ids_and_shell_patterns() -> None:
    cases = [
        _fake_case("nemo_a", "H100", 8, 1.0),
        _fake_case("nemo_b", "H100", 8, 1.0),
        _fake_case("other", "H100", 8, 1.0),
    ]
    assert [m.case_id for m in map_cases(cases, ("nemo_*",))] == ["nemo_a", "nemo_b"]
    assert [m.case_id for m in map_cases(cases, ("other", "nemo_b"))] == ["nemo_b", "other"]
    with pytest.raises(ValueError, match="unknown case id 'gpt\\*'"):
        map_cases(cases, ("gpt*",))


@pytest.mark.skipif(not CASES_PATH.exists(), reason="refdata is not installed")
def test_the_rule_picks_the_documented_calibration_cases() -> None:
    mappings = map_cases(load_cases(CASES_PATH))
    assert select_calibration_cases(mappings) == (
        "narayanan21_t1_1.7B",
        "korthikanti22_t5_22B_full_recompute",
        "nemo2407_h100_fp8_LLAMA2-7B_8gpu",
        "mcoremoe_h100_mixtral-8x7b_64gpu",
        "torchtitan_t1_8B_8gpu_fsdp",
        "torchtitan_trainy_8B_32gpu_h200_compile_float8",
        "mbridge_2604_h100_fp8_LLAMA3-70B_64gpu",
    )


def test_a_network_calibration_applies_to_its_node_type_only() -> None:
    from sim.network.calibration import Calibration

    h100 = _mapping("h", "nemo", "h100-sxm", 8)
    h100 = CaseMapping(**{**_fields(h100), "plan": {"cluster": {"node": "dgx-h100"}}})
    a100 = CaseMapping(**{**_fields(h100), "plan": {"cluster": {"node": "dgx-a100"}}})
    fitted = Calibration(topology="dgx-h100")
    assert network_calibration_applies(fitted, h100)
    assert not network_calibration_applies(fitted, a100)
    assert network_calibration_applies(Calibration(), a100)  # names no topology: applies to all
    assert not network_calibration_applies(None, h100)


def _fields(mapping: CaseMapping) -> dict:
    return {name: getattr(mapping, name) for name in CaseMapping.__dataclass_fields__}


# --- progress: every simulation is reported as it finishes, worker processes included ---


class _Recorder:
    """A ``runner.Progress`` that logs what it hears."""

    def __init__(self) -> None:
        self.log: list[tuple[str, object]] = []

    def start(self, phase: str, total: int) -> None:
        self.log.append(("start", (phase, total)))

    def advance(self, note: str = "") -> None:
        self.log.append(("advance", note))


def test_progress_counts_every_calibration_and_case_simulation() -> None:
    cases = [
        _fake_case("a_16", "A100-SXM4-80GB", 16, 2.0),
        _fake_case("a_8", "A100-SXM4-80GB", 8, 1.0),
        _fake_case("h_8", "H100-SXM5-80GB", 8, 0.5),
    ]
    calls: list[str] = []
    inner = _scale_simulator(0.8)

    def counting(mapping, calibration):
        calls.append(mapping.case_id)
        return inner(mapping, calibration)

    recorder = _Recorder()
    run_validation(cases, simulate=counting, progress=recorder)
    fit_calls = len(calls) - len(cases)
    assert recorder.log[0] == ("start", ("calibrating", fit_calls))  # the announced total is exact
    assert calibration_simulations([_mapping("a_8", "s", "a100-sxm-80gb", 8)]) == fit_calls // 2
    assert recorder.log[1 : 1 + fit_calls] == [("advance", "")] * fit_calls
    assert recorder.log[1 + fit_calls] == ("start", ("simulating", 3))
    notes = [str(note) for kind, note in recorder.log[2 + fit_calls :] if kind == "advance"]
    # One line per case, ending in its wall time; the fit (scale 0.8) predicts the measured times.
    assert [note.split(" (")[0] for note in notes] == [
        "a_16: 2.000 s predicted",
        "a_8: 1.000 s predicted",
        "h_8: 0.500 s predicted",
    ]


def test_no_calibration_phase_without_calibration_cases() -> None:
    recorder = _Recorder()
    cases = [_fake_case("a_8", "A100-SXM4-80GB", 8, 1.0)]
    run_validation(cases, calibrate_on=(), simulate=_scale_simulator(1 / 1.2), progress=recorder)
    assert recorder.log[0] == ("start", ("simulating", 1))
    assert str(recorder.log[1][1]).startswith("a_8: 1.200 s predicted (")


def _slow_first(mapping, calibration):
    """Picklable stand-in for worker processes: the first case takes a second, the others none."""
    if mapping.case_id == "slow":
        time.sleep(1.0)
    if mapping.case_id == "bad":
        raise ValueError("no such pipeline")
    return Prediction(step_time_s=1.0)


def test_worker_processes_report_progress_as_cases_finish() -> None:
    cases = [_fake_case(case_id, "A100-SXM4-80GB", 8, 1.0) for case_id in ("slow", "quick", "bad")]
    recorder = _Recorder()
    report = run_validation(cases, calibrate_on=(), simulate=_slow_first, progress=recorder, jobs=2)
    notes = [str(note) for kind, note in recorder.log if kind == "advance"]
    # The quick and the failed case are reported while the slow one still runs ...
    assert [note.split(":")[0] for note in notes] == ["quick", "bad", "slow"]
    assert notes[1] == "bad: FAILED: no such pipeline"
    # ... and the report keeps the file order.
    assert [r.case_id for r in report.results] == ["slow", "quick"]
    assert report.failed == (("bad", "no such pipeline"),)
