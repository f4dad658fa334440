"""``commsim validate``: the text report, the plot, the JSON, and bad input."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
from pathlib import Path

import pytest

import refdata
from sim.cli.main import main
from sim.cli.validate import format_report, plot_bytes
from sim.validation.cases import CaseMapping
from sim.validation.runner import CaseResult, ValidationReport

CASES_PATH = refdata.CASES_PATH
needs_cases = pytest.mark.skipif(not CASES_PATH.exists(), reason="refdata is not installed")


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
            table="Table 1",
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
            breakdown={
                "compute_s": 10.0,
                "exposed_dp_s": 0.5,
                "exposed_tp_s": 0.2,
                "bubble_s": 0.3,
            },
            in_step_slowdown_s=10.0 * 0.21 / 1.21,
            table="Table 1",
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


def _summary_row(text: str, name: str) -> list[str]:
    """The figures after ``name`` on its summary line (two-space indented)."""
    for line in text.splitlines():
        if line.startswith(f"  {name}  "):
            return line[len(name) + 2 :].split()
    raise AssertionError(f"no summary line for {name!r} in:\n{text}")


def test_text_report_lists_cases_errors_mape_and_missing_knobs() -> None:
    text = format_report(_report())
    assert "nar_small *" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("nar_")}
    # exposed comm, bubble, host (none) and the in-step slowdown's part: 10 s x 0.21 / 1.21
    big = ["512", "10.000", "11.000", "+10.0%", "0.700", "0.300", "0.000", "1.736"]
    assert lines["nar_big"].split()[1:] == big
    # the calibration case (-0.8 %) is excluded: MAPE over the one held-out case is 10 %
    assert _summary_row(text, "narayanan21")[:4] == ["1", "cases", "MAPE", "10.0%"]
    assert _summary_row(text, "narayanan21 Table 1")[:4] == ["1", "cases", "MAPE", "10.0%"]
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


# --- end to end with the real simulator, on small published runs ---

SMALL_H100 = "nemo2407_h100_fp8_LLAMA2-7B_8gpu"
SMALL_A100 = "korthikanti22_t5_22B_selective_plus_sp"


@needs_cases
def test_calibrating_on_one_case_reproduces_its_step_time(tmp_path: Path, capsys) -> None:
    out = tmp_path / "validation.json"
    code = main(
        [
            "validate",
            str(CASES_PATH),
            "--ids",
            f"{SMALL_H100},nemo2407_h100_fp8_GPT3-5B_64gpu",
            "--calibrate-on",
            SMALL_H100,
            "--json",
            str(out),
        ]
    )
    assert code == 0
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask
    data = json.loads(out.read_text())
    cases = {c["id"]: c for c in data["cases"]}
    assert set(cases) == {SMALL_H100, "nemo2407_h100_fp8_GPT3-5B_64gpu"}
    assert cases[SMALL_H100]["calibration"] is True
    # one case, one parameter: the fit reproduces the measured 3.87 s
    assert abs(cases[SMALL_H100]["error"]) < 0.005
    assert cases[SMALL_H100]["measured_step_time_s"] == pytest.approx(128 * 4096 / (16934 * 8))
    assert data["config"]["cases_sha256"] == hashlib.sha256(CASES_PATH.read_bytes()).hexdigest()
    assert data["env"]["command"] == "commsim validate"
    for case in cases.values():  # the critical rank's breakdown accounts for the whole step
        assert case["breakdown"]["compute_s"] > 0
        assert sum(case["breakdown"].values()) == pytest.approx(case["predicted_step_time_s"])
        # the fitted factor's part of compute_s, beside the breakdown (multi-GPU: s = 0.21)
        assert 0 < case["in_step_slowdown_s"] < case["breakdown"]["compute_s"]
    fit = data["calibration"]["h100-sxm"]
    assert fit["cases"] == [SMALL_H100]
    assert 0.5 <= fit["time_scale"] <= 2.0
    # the held-out case alone makes up the summary
    assert data["summary"]["all"]["num_cases"] == 1
    assert data["summary"]["all"]["mape"] == pytest.approx(
        abs(cases["nemo2407_h100_fp8_GPT3-5B_64gpu"]["error"])
    )
    text = capsys.readouterr().out
    assert f"{SMALL_H100} *" in text and "MAPE over held-out cases, per source:" in text
    assert f"h100-sxm: time scale {fit['time_scale']:.3f} on every kernel" in text


@needs_cases
def test_default_rule_and_plot_on_a_small_selection(tmp_path: Path, capsys) -> None:
    plot = tmp_path / "validation.png"
    # the shipped runs of the A100 and NeMo sources (the rule's picks over the other sources'
    # runs would add minutes of simulation and are covered by the results files)
    cases = [
        case
        for case in json.loads(CASES_PATH.read_text())
        if case["id"].startswith(("narayanan21_", "korthikanti22_", "nemo2407_"))
    ]
    subset = tmp_path / "cases.json"
    subset.write_text(json.dumps(cases))
    code = main(
        ["validate", str(subset), "--ids", f"{SMALL_A100},{SMALL_H100}", "--plot", str(plot)]
    )
    assert code == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    # the rule calibrates H100 on LLAMA2-7B (8 GPUs, first of the two 8-GPU NeMo runs) and A100
    # on the smallest Narayanan and Korthikanti runs, which are not among the ids shown
    assert f"{SMALL_H100} *" in text and f"{SMALL_A100} *" not in text
    assert _summary_row(text, "korthikanti22")[:2] == ["1", "cases"]
    assert _summary_row(text, "korthikanti22 Table 5")[:2] == ["1", "cases"]


@needs_cases
def test_simulating_a_case_is_deterministic() -> None:
    from sim.validation.cases import load_cases, map_case
    from sim.validation.runner import simulate_case

    case = next(c for c in load_cases(CASES_PATH) if c["id"] == SMALL_A100)
    mapping = map_case(case)
    assert simulate_case(mapping) == simulate_case(mapping)


@needs_cases
def test_worker_processes_give_the_same_answers() -> None:
    from sim.validation.cases import load_cases
    from sim.validation.runner import run_validation

    cases = load_cases(CASES_PATH)
    ids = (SMALL_A100, SMALL_H100, "korthikanti22_t5_22B_full_recompute")
    serial = run_validation(cases, ids=ids, calibrate_on=())
    parallel = run_validation(cases, ids=ids, calibrate_on=(), jobs=2)
    assert [r.predicted_step_time_s for r in serial.results] == [
        r.predicted_step_time_s for r in parallel.results
    ]
    assert [r.case_id for r in parallel.results] == [
        "korthikanti22_t5_22B_full_recompute",
        SMALL_A100,
        SMALL_H100,
    ]


@needs_cases
def test_unknown_plot_type_is_refused_before_simulating(tmp_path: Path, capsys) -> None:
    out = tmp_path / "validation.json"
    code = main(
        ["validate", str(CASES_PATH), "--plot", str(tmp_path / "p.txt"), "--json", str(out)]
    )
    assert code == 2
    assert "the extension '.txt' is not one this output writes" in capsys.readouterr().err
    assert not out.exists()


@needs_cases
def test_jobs_must_be_positive(capsys) -> None:
    assert main(["validate", str(CASES_PATH), "--jobs", "0"]) == 2
    assert "jobs must be >= 1, got 0" in capsys.readouterr().err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@needs_cases
def test_progress_bars_on_a_terminal_lines_in_a_log(capsys, monkeypatch) -> None:
    argv = ["validate", str(CASES_PATH), "--ids", f"{SMALL_H100},{SMALL_A100}", "-j", "2"]
    argv += ["--calibrate-on", SMALL_H100]
    assert main(argv) == 0
    lines = capsys.readouterr().err.splitlines()  # not a terminal: a line per 10% of a phase
    assert lines[-1].startswith("simulating: 100% (2/2 sims, ")
    assert all(re.fullmatch(r"(calibrating|simulating): \d+% \(\d+/\d+ sims, \d+ s\)", ln)
               for ln in lines)  # fmt: skip
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv) == 0
    text = terminal.getvalue().replace("\r", "\n")  # each redraw starts with a carriage return
    assert "calibrating:" in text and "simulating:" in text
    assert re.search(r"\d+/2 \[\d\d:\d\d<", text)  # count and elapsed<remaining (the ETA)
    for case_id in (SMALL_H100, SMALL_A100):  # a line per case, from the worker processes
        assert re.search(rf"^  {case_id}: [\d.]+ s predicted \([\d.]+ s wall\)$", text, re.M)
    report = capsys.readouterr().out  # the report itself stays on stdout, untouched
    assert report.startswith("commsim validate: 2 published runs simulated")


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The message of the one error line on standard error (no traceback before it)."""
    err = capsys.readouterr().err
    assert err.startswith("commsim: error: ") and err.count("\n") == 1, err
    return err.removeprefix("commsim: error: ").rstrip("\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "--collectives"],
         "--steps and --collectives: give only one of --steps, --collectives, --traces, "
         "--leave-one-source-out (one validation per run)"),
        (["--steps", "--traces"], "--steps and --traces: give only one of"),
        (["--traces", "--leave-one-source-out"], "--traces and --leave-one-source-out: give"),
        (["--steps", "--plot", "p.png"], "--plot p.png does not apply to --steps"),
        (["--collectives", "-j", "2"], "--jobs 2 does not apply to --collectives"),
        (["--leave-one-source-out", "--calibrate-on", "none"],
         "--calibrate-on none does not apply to --leave-one-source-out"),
        (["--ids", ""], "--ids '': expected comma-separated case ids"),
        (["other.json", "--traces"], "CASES.json other.json does not apply to --traces"),
        (["--ids", "a,,b"], "--ids 'a,,b': expected comma-separated case ids (an empty item)"),
        (["--calibrate-on", ""], "--calibrate-on '': expected comma-separated case ids"),
    ],
)  # fmt: skip
def test_contradictory_or_empty_flags_are_refused(
    tmp_path: Path, capsys, argv: list[str], message: str
) -> None:
    out = tmp_path / "v.json"
    assert main(["validate", *argv, "--json", str(out)]) == 2
    assert _one_line_error(capsys).startswith(message)
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[]", "{path}: no cases (an empty list)"),
        (b'[{"id": "a"}, {"id": "b"}, {"id": "a"}]',
         "{path}: case id 'a' given twice (cases 1 and 3)"),
        (b"\xd5\xff\x00", "cases file '{path}' is not UTF-8 text (byte 0xd5 at offset 0)"),
        (b'[{"id": "a"}, {"id": "b", "gpu": "H100"}]',
         "{path}: none of the 2 cases can be simulated (e.g. a: num_gpus (None); "
         "model.num_layers (None); and 11 more)"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("mode", [[], ["--leave-one-source-out"]])
def test_a_cases_file_without_usable_cases_is_refused_writing_nothing(
    tmp_path: Path, capsys, monkeypatch, content: bytes, message: str, mode: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # short names: messages shorten long paths
    Path("cases.json").write_bytes(content)
    plot = [] if mode else ["--plot", "v.png"]
    assert main(["validate", "cases.json", *mode, "--json", "v.json", *plot]) == 2
    assert _one_line_error(capsys) == message.format(path="cases.json")
    assert [p.name for p in tmp_path.iterdir()] == ["cases.json"]


@needs_cases
def test_every_case_failing_is_exit_2_writing_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    import sim.cli.validate

    cases = [c for c in json.loads(CASES_PATH.read_text()) if c["id"] == SMALL_H100]
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    failed = ValidationReport(results=(), skipped=(), failed=((SMALL_H100, "boom"),),
                              calibration_cases=(), runtime_s=0.0)  # fmt: skip
    monkeypatch.setattr(sim.cli.validate, "run_validation", lambda *a, **k: failed)
    out, plot = tmp_path / "v.json", tmp_path / "v.png"
    assert main(["validate", str(path), "--json", str(out), "--plot", str(plot)]) == 2
    assert _one_line_error(capsys) == (
        f"{path}: every case failed to simulate (1; first {SMALL_H100}: boom)"
    )
    assert not out.exists() and not plot.exists()


def test_a_truncated_step_file_is_named(tmp_path: Path, capsys) -> None:
    step = tmp_path / "step_x.json"
    step.write_text('{"schema": "commbench-step/1", "gpu"')
    out = tmp_path / "v.json"
    assert main(["validate", "--steps", str(tmp_path), "--json", str(out)]) == 2
    assert _one_line_error(capsys) == (
        f"malformed input: {step}: Expecting ':' delimiter: line 1 column 37 (char 36)"
    )
    assert not out.exists()


def test_a_truncated_trace_index_is_named(tmp_path: Path, capsys) -> None:
    index = tmp_path / "index.json"
    index.write_text('{"schema": ')
    assert main(["validate", "--traces", str(tmp_path)]) == 2
    assert _one_line_error(capsys) == (
        f"malformed input: {index}: Expecting value: line 1 column 12 (char 11)"
    )


def test_steps_of_several_folders_are_validated_as_one_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--steps A B``: the files of both folders calibrate each other (2 + 1 eager steps here:
    3 on defaults, 6 ordered pairs)."""
    from sim.validation.steps import STEPS_PATH

    names = ["small-h1024-s1024-b4_mb1_eager", "small-h1024-s1024-b4_mb4_eager",
             "llama1b-s4096-b2_mb1_eager"]  # fmt: skip
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, chosen in ((first, names[:2]), (second, names[2:])):
        folder.mkdir()
        for name in chosen:
            source = STEPS_PATH / f"step_{name}.json"
            (folder / source.name).write_text(source.read_text())
    out = tmp_path / "steps.json"
    assert main(["validate", "--steps", str(first), str(second), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "defaults       3 predictions" in text and "transfer       6 predictions" in text
    assert json.loads(out.read_text())["steps"] == f"{first} {second}"
