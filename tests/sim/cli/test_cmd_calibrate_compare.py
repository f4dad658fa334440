"""calibrate and compare: wrong results are refused unless allowed, outputs never replace inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import refdata
from comm_bench.readers import read_results
from sim.cli.main import main


def _run_with_wrong(tmp_path: Path) -> Path:
    """The published 8x H100 all_reduce table as commbench JSON, one result marked wrong."""
    records = read_results(refdata.NCCL_DIR / "h100_8gpu_all_reduce_ring.txt")
    rows = [r.to_dict() for r in records]
    for row in rows:
        row["num_wrong"] = 7 if row["size_bytes"] == 4 << 20 else 0
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"schema": "commbench/1", "results": rows}))
    return path


def test_records_with_wrong_results_are_refused_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_with_wrong(tmp_path)
    out = tmp_path / "cal.json"
    argv = ["calibrate", str(run), "--topology", "dgx-h100", "-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    # the out-of-place and the in-place record of 4 MiB
    assert "2 record(s) have #wrong > 0" in err and "all_reduce 4194304 B" in err
    assert not out.exists()
    assert main([*argv, "--allow-wrong"]) == 0
    assert "using 2 record(s) with #wrong > 0" in capsys.readouterr().out
    assert main(["compare", str(run), "--topology", "dgx-h100"]) == 2
    assert "--allow-wrong" in capsys.readouterr().err


def test_an_output_that_is_an_input_is_refused_and_the_input_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_with_wrong(tmp_path)
    before = run.read_bytes()
    assert main(["calibrate", str(run), "--topology", "dgx-h100", "-o", str(run)]) == 2
    assert "is also an input" in capsys.readouterr().err
    argv = ["compare", str(run), "--topology", "dgx-h100", "--allow-wrong"]
    assert main([*argv, "--json", str(run)]) == 2
    assert main([*argv, "-o", str(tmp_path / "plot.json")]) == 2  # a plot is png, svg or pdf
    assert main(["calibrate", str(run), "--topology", "dgx-h100", "-o", str(tmp_path)]) == 2
    assert run.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
