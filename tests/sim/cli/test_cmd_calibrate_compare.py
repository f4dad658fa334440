"""calibrate and compare: wrong results are refused unless allowed, outputs never replace inputs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import refdata
from sim.cli import compare as compare_cli
from sim.cli.main import main
from vocab.readers import read_results


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


def _titles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Collects the title of every comparison plot ``commsim compare`` draws."""
    titles: list[str] = []
    real = compare_cli.plot_comparison

    def plot(points: Any, target: Any, *, title: str) -> None:
        titles.append(title)
        real(points, target, title=title)

    monkeypatch.setattr(compare_cli, "plot_comparison", plot)
    return titles


def test_compare_titles_read_naturally(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    titles = _titles(monkeypatch)
    run = _run_with_wrong(tmp_path)
    records = read_results(refdata.NCCL_DIR / "h100_8gpu_all_gather_ring.txt")
    rows = json.loads(run.read_text())["results"] + [r.to_dict() for r in records]
    for row in rows:
        row["num_wrong"] = 0
    run.write_text(json.dumps({"schema": "commbench/1", "results": rows}))
    argv = ["compare", str(run), "--topology", "dgx-h100", "-o", str(tmp_path / "p.png")]
    report = tmp_path / "r.json"
    assert main([*argv, "--holdout", "op!=all_reduce", "--json", str(report)]) == 0
    how = "fitted on op=all_reduce, scored on op!=all_reduce"
    assert f"# commsim compare: topology dgx-h100, {how}, fidelity analytical" in (
        capsys.readouterr().out
    )
    assert json.loads(report.read_text())["calibration"] == how
    assert main(argv) == 0
    mape_held_out, mape_all = (re.search(r"time MAPE [\d.]+%", t) for t in titles)
    assert mape_held_out is not None and mape_all is not None
    assert titles == [
        f"dgx-h100: measured vs simulated, {how}; {mape_held_out[0]} (held-out points)",
        "dgx-h100: measured vs simulated, uncalibrated (default parameters); "
        f"{mape_all[0]} (all points)",
    ]
    out = capsys.readouterr().out
    assert "((" not in out and "not matching" not in out
    assert "# time MAPE all_reduce (ring), 8 ranks / 1 node(s):" in out


def test_calibrate_header_counts_the_records_it_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """112 records read, 56 fitted (the out-of-place ones; their in-place twins are left out):
    on main the header said 112 records."""
    measured = Path(refdata.ROOT).parent / "results" / "localhost" / "commbench_gloo_4ranks.json"
    argv = ["calibrate", str(measured), "--topology", "localhost", "-o", str(tmp_path / "c.json")]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "# commsim calibrate: 56 of 112 records used (56 in-place twins of out-of-place ones), "
        "from 1 file(s), topology localhost"
    )


def test_compare_runs_under_the_nccl_release_the_measured_file_prints(
    tmp_path: Path, capsys: Any
) -> None:
    table = Path(refdata.__file__).parent / "nccl" / "h100_8gpu_all_reduce_ring.txt"
    printed = tmp_path / "all_reduce.log"
    printed.write_text(
        "# host:1:1 [0] NCCL INFO NCCL version 2.23.4+cuda12.6\n" + table.read_text()
    )
    argv = ["compare", str(printed), "--topology", "dgx-h100"]
    assert main(argv) == 0
    assert "NCCL 2.23.4's tuning tables, as 1 of the 1 measured file(s) print it" in (
        capsys.readouterr().out
    )
    assert main([*argv, "--nccl-version", "2.30.7"]) == 0
    assert "measured file(s) print it" not in capsys.readouterr().out
    other = tmp_path / "all_reduce_other.log"
    other.write_text(printed.read_text().replace("2.23.4", "2.27.5"))
    assert main(["compare", str(printed), str(other), "--topology", "dgx-h100"]) == 2
    assert "print different NCCL releases: 2.23.4" in capsys.readouterr().err
    cluster = tmp_path / "cluster.yaml"  # a cluster file keeps its own release, and says so
    cluster.write_text("node: dgx-h100\nnccl_version: 2.28.9\n")
    assert main(["compare", str(printed), "--topology", str(cluster)]) == 0
    assert "the cluster file names 2.28.9, which is what runs" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["calibrate", "compare"])
@pytest.mark.parametrize("algo", ["bogus", ""])
def test_an_unknown_algo_is_refused_where_every_file_names_its_algorithm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, algo: str
) -> None:
    """The published table names its algorithm (ring), so ``--algo`` would not be read: it is
    checked all the same, before anything is written."""
    out = tmp_path / ("cal.json" if command == "calibrate" else "cmp.json")
    table = str(refdata.NCCL_DIR / "h100_8gpu_all_reduce_ring.txt")
    flag = "-o" if command == "calibrate" else "--json"
    argv = [command, table, "--topology", "dgx-h100", "--algo", algo, flag, str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"unknown algorithm {algo!r}; valid: auto, ring" in err
    assert not out.exists()


def test_a_simulated_gloo_sweep_reads_back_into_compare_and_calibrate(tmp_path: Path) -> None:
    """``commsim collective`` on the CPU topology names its algorithm ``gloo``; its file is an
    input of ``compare`` and ``calibrate`` like a measured one."""
    sweep = tmp_path / "gloo.json"
    argv = ["collective", "--topology", "localhost", "--ranks", "4", "-b", "1K", "-e", "4K"]
    assert main([*argv, "--output", str(sweep)]) == 0
    assert {r.algo for r in read_results(sweep)} == {"gloo"}
    assert main(["compare", str(sweep), "--topology", "localhost"]) == 0
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(sweep), "--topology", "localhost", "-o", str(out)]) == 0
    assert "all_reduce/gloo/intra" in json.loads(out.read_text())["params"]
