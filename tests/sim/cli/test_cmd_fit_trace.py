"""``commsim fit --trace``: a profiler trace calibrates the plan; bad traces write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli.main import main
from vocab.compute_calibration import load_compute_calibration

TRACES = Path(__file__).resolve().parents[3] / "refdata" / "h100" / "traces"
PLAN = TRACES / "plan_small-h1024-s1024-b4.yaml"
TRACE = TRACES / "trace_small-h1024-s1024-b4.json.gz"


def test_a_trace_fit_writes_a_calibration_that_plan_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, plot = tmp_path / "fitted.json", tmp_path / "fit.png"
    argv = ["fit", str(PLAN), "--trace", str(TRACE), "--step-time", "0.058",
            "--compute-calibration", str(out), "--plot", str(plot)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "396 of 396 with recorded shapes match the plan's GEMM shapes (100%)" in text
    assert "step time fitted to 58.000 ms: --step-time" in text
    assert "kernel time by class" in text and "GPU time by phase" in text
    # 1,776 kernels less fused Adam's 10 launches and cuBLAS's 104 memsets, over 4 micro-batches
    # of 183 modelled kernels
    assert load_compute_calibration(out).launches_per_kernel == pytest.approx(
        (1776 - 10 - 104) / 732
    )
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert main(["plan", str(PLAN), "--compute-calibration", str(out), "--json"]) == 0
    basis = json.loads(capsys.readouterr().out)["basis"]["compute"]
    assert "trace trace_small-h1024-s1024-b4.json.gz (ProfilerStep#1, rank 0)" in basis


def test_the_json_report_and_the_default_step_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", str(PLAN), "--trace", str(TRACE), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step_time_from"].startswith("the profiled step's wall time")
    assert report["step_time_s"] == report["wall_s"]
    assert report["gemm_match"]["rate"] == 1.0
    assert [row["what"] for row in report["phases"]][-1] == "step"


def test_a_trace_of_another_model_is_warned_about(capsys: pytest.CaptureFixture[str]) -> None:
    other = TRACES / "plan_llama1b-s4096-b2.yaml"
    assert main(["fit", str(other), "--trace", str(TRACE), "--step-time", "0.058"]) == 0
    assert "0 of 396 traced GEMMs have one of the plan's GEMM shapes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not json", "is not JSON"),
        (TRACE.read_bytes()[:4000], "truncated or corrupt gzip"),
        (b'{"traceEvents": []}', "has no GPU kernels"),
    ],
)
def test_a_bad_trace_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    trace, out = tmp_path / "trace.json", tmp_path / "fitted.json"
    trace.write_bytes(content)
    argv = ["fit", str(PLAN), "--trace", str(trace), "--compute-calibration", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_flags_that_need_a_trace_or_a_step_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", str(PLAN)]) == 2
    assert "--step-time is required without --trace" in capsys.readouterr().err
    assert main(["fit", str(PLAN), "--step-time", "1", "--plot", "x.png"]) == 2
    assert "--plot needs --trace" in capsys.readouterr().err
