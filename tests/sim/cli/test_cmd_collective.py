"""The collective, calibrate and compare commands end to end, and their bad-input errors."""

from __future__ import annotations

import io
import json

import pytest

import refdata
from sim.cli.collective import size_sweep
from sim.cli.main import main
from vocab.readers import read_results

DATA = refdata.NCCL_DIR


def test_collective_prints_the_nccl_tests_table_and_writes_interchangeable_files(tmp_path, capsys):
    out = tmp_path / "sim.json"
    code = main(["collective", "--topology", "dgx-h100", "--ops", "all_reduce,all_gather",
                 "-b", "1K", "-e", "1G", "-f", "32", "--output", str(out)])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "# Collective test starting: all_reduce_perf" in text
    assert "     1024           256     float     sum      -1" in text
    assert text.count("N/A") == 2 * 2 * 5  # #wrong, both blocks, 2 ops x 5 sizes (1K..1G by 32)
    doc = json.loads(out.read_text())
    assert doc["schema"] == "commbench/1" and doc["env"]["simulated"] is True
    records = read_results(out)
    assert len(records) == 20 and {r.source for r in records} == {"simulated"}
    assert read_results(out.with_suffix(".csv")) == records


def test_collective_flow_multi_node_and_ranks(capsys):
    assert main(["collective", "--topology", "dgx-h100", "--nodes", "2", "--fabric", "ib-ndr",
                 "--ranks", "12", "--ops", "all_to_all", "-b", "1M", "-e", "1M",
                 "--fidelity", "flow"]) == 0  # fmt: skip
    assert "12 ranks on 2 node(s)" in capsys.readouterr().out


def test_calibrate_then_compare_with_the_file(tmp_path, capsys):
    measured = tmp_path / "m.json"
    main(["collective", "--topology", "dgx-a100", "--ops", "all_reduce", "-b", "1K", "-e", "1G",
          "-f", "4", "--output", str(measured)])  # fmt: skip
    cal = tmp_path / "cal.json"
    assert main(["calibrate", str(measured), "--topology", "dgx-a100", "-o", str(cal)]) == 0
    assert json.loads(cal.read_text())["schema"] == "commsim-calibration/1"
    plot, report = tmp_path / "p.png", tmp_path / "r.json"
    assert main(["compare", str(measured), "--topology", "dgx-a100", "--calibration", str(cal),
                 "-o", str(plot), "--json", str(report)]) == 0  # fmt: skip
    summary = json.loads(report.read_text())["summary"]
    assert summary["mape_pct"] < 1.0  # the model fitted to its own output reproduces it
    assert plot.stat().st_size > 0
    assert "MAPE" in capsys.readouterr().out


@pytest.mark.skipif(not DATA.exists(), reason="refdata is not installed")
def test_compare_holdout_on_published_tables(tmp_path, capsys):
    files = [
        str(DATA / f) for f in ("h100_8gpu_all_reduce_ring.txt", "h100_8gpu_all_gather_ring.txt")
    ]
    report = tmp_path / "r.json"
    assert main(["compare", *files, "--topology", "dgx-h100", "--holdout", "op=all_gather",
                 "--json", str(report)]) == 0  # fmt: skip
    doc = json.loads(report.read_text())
    assert doc["summary"]["scored_on"] == "held-out points"
    assert doc["summary"]["mape_pct_min_size"] < 10.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["collective", "--topology", "nope"], "unknown cluster"),
        (["collective", "--topology", "dgx-a100", "--algo", "nvls"], "NVLink SHARP"),
        (["collective", "--topology", "dgx-h100", "--ops", "gather"], "unknown op"),
        (["collective", "--topology", "dgx-h100", "-b", "1X"], "bad size"),
        (["collective", "--topology", "dgx-h100", "-b", "2M", "-e", "1M"], "minbytes"),
        (["collective", "--topology", "dgx-h100", "--ranks", "9"], "--ranks 9"),
        (["collective", "--topology", "dgx-h100", "--fidelity", "packet"], "fidelity"),
        (
            ["collective", "--topology", "dgx-h100", "--calibration", "/nonexistent.json"],
            "nonexistent",
        ),
        (
            ["calibrate", "/nonexistent.json", "--topology", "dgx-h100", "-o", "x.json"],
            "nonexistent",
        ),
        (["compare", "/nonexistent.json", "--topology", "dgx-h100"], "nonexistent"),
        (["collective"], "--topology"),
        (["collective", "--topology", "dgx-h100", "-b", "-1K"], "bad size '-1K'"),
        (["collective", "--topology", "dgx-h100", "-f", "inf"], "-f must be a finite number"),
        (["collective", "--topology", "dgx-h100", "-f", "nan"], "got nan"),
        (["collective", "--topology", "dgx-h100", "-o", "xor"], "unknown reduction -o 'xor'"),
        (["collective", "--topology", "dgx-h100", "--nodes", "0"], "--nodes 0"),
        (
            ["collective", "--topology", "dgx-h100", "--output", "x.txt"],
            "is not one this output writes",
        ),
        (["collective", "--topology", "localhost", "--nodes", "-1"], "--nodes -1"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("commsim: error:") and message in err and err.count("\n") == 1


def test_compare_rejects_two_calibration_modes_and_bad_holdout(tmp_path, capsys):
    measured = tmp_path / "m.json"
    main(
        [
            "collective",
            "--topology",
            "dgx-a100",
            "-b",
            "1K",
            "-e",
            "1M",
            "-f",
            "4",
            "--output",
            str(measured),
        ]
    )
    capsys.readouterr()
    assert (
        main(["compare", str(measured), "--topology", "dgx-a100", "--fit", "--holdout", "size<4K"])
        == 2
    )
    assert "choose one of" in capsys.readouterr().err
    assert main(["compare", str(measured), "--topology", "dgx-a100", "--holdout", "size>1T"]) == 2
    assert "both sides" in capsys.readouterr().err
    assert (
        main(["compare", str(measured), "--topology", "dgx-a100", "--holdout", "colour=red"]) == 2
    )
    assert "bad selector" in capsys.readouterr().err


def test_size_sweep_follows_nccl_tests():
    assert size_sweep(1024, 8192, 2) == [1024, 2048, 4096, 8192]
    with pytest.raises(ValueError, match="-f"):
        size_sweep(1, 2, 1.0)
    with pytest.raises(ValueError, match="need 1 <= minbytes"):
        size_sweep(0, 2, 2.0)


BELOW_1P = "a size must be below 1P (1,125,899,906,842,624 bytes)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-b", "1K", "-e", "99999999999999999999999999"],
         f"-e 99999999999999999999999999: {BELOW_1P}"),
        (["-b", "1K", "-e", "1024T"], f"-e 1024T: {BELOW_1P}"),
        (["-b", "2000T", "-e", "2000T"], f"-b 2000T: {BELOW_1P}"),
        (["-b", "1K", "-e", "1P"],
         "-e: bad size '1P'; use a number with an optional K, M, G or T suffix"),
        (["-b", "1K", "-e", "9" * 5000],
         f"-e '{'9' * 59}... (5,000 characters): not a size below 1P"),
        (["-b", "0"], "-b 0: a size must be >= 1 byte"),
        (["-b", "0", "-e", "0"], "-b 0: a size must be >= 1 byte"),
        (["-b", "1K", "-e", "1K", "--ranks", "1"],
         "--ranks 1: no algorithm can run all_reduce on this group (a group of one GPU; "
         "use 2 or more)"),
        (["-b", "1K", "-e", "1K", "--ranks", "1", "--ops", "send_recv"],
         "--ranks 1: send_recv takes ranks=(src, dst) or a ring of >= 2, got [0] (a group of "
         "one GPU; use 2 or more)"),
    ],
)  # fmt: skip
def test_sizes_and_ranks_out_of_range_are_one_line(tmp_path, capsys, argv, message):
    out = tmp_path / "sim.json"
    assert main(["collective", "--topology", "dgx-h100", *argv, "--output", str(out)]) == 2
    assert capsys.readouterr().err == f"commsim: error: {message}\n"
    assert not out.exists() and not out.with_suffix(".csv").exists()


def test_localhost_has_as_many_processes_as_ranks_asked(capsys):
    sweep = ["-b", "1M", "-e", "1M"]
    assert main(["collective", "--topology", "localhost", "--ranks", "4", *sweep]) == 0
    assert "4 ranks on 1 node(s)" in capsys.readouterr().out
    assert main(["collective", "--topology", "localhost", *sweep]) == 0
    assert "2 ranks on 1 node(s)" in capsys.readouterr().out  # the preset's two processes


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("[1, 2]", "expected 'commsim-calibration/1'"),
        ("{not json", "not valid JSON"),
        ('{"schema": "commsim-calibration/1", "params": [1]}', "'params' must map op/algo/scope"),
        ('{"schema": "commsim-calibration/1", "params": {"all_reduce/ring/intra": 5}}', "5"),
    ],
)
def test_bad_calibration_files_are_one_line_errors(tmp_path, capsys, document, message):
    path = tmp_path / "cal.json"
    path.write_text(document)
    assert main(["collective", "--topology", "dgx-h100", "--calibration", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"commsim: error: {path}") and err.count("\n") == 1
    assert message in err or "bad calibration key" in err


def test_bad_measured_records_name_the_file_and_the_value(tmp_path, capsys):
    row = {"op": "all_reduce", "size_bytes": 1024, "count": 1, "dtype": "float32", "world_size": 4,
           "num_nodes": 1, "in_place": False, "time_us": 1.0, "algbw_gbps": 1.0,
           "busbw_gbps": 1.0}  # fmt: skip
    path = tmp_path / "m.json"
    for bad, message in [({"size_bytes": -5}, "size_bytes=-5"), ({"op": "gather"}, "'gather'"),
                         ({"time_us": "x"}, "time_us='x'")]:  # fmt: skip
        path.write_text(json.dumps({"schema": "commbench/1", "results": [{**row, **bad}]}))
        assert main(["calibrate", str(path), "--topology", "localhost", "-o", "c.json"]) == 2
        err = capsys.readouterr().err
        assert f"{path}: result 0" in err and message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-b", "1K", "-e", "1G", "-f", "1.0000001"], "gives more than 10,000 sizes"),
        (["--nodes", "1000000", "--fabric", "ib-ndr"], "clusters of up to 131,072 GPUs"),
        (
            ["--nodes", "1024", "--fabric", "ib-ndr", "--ops", "all_to_all", "--fidelity", "flow"],
            "needs 67,100,672 point-to-point flows",
        ),
    ],
)
def test_inputs_that_would_hang_are_refused_at_once(argv, message, capsys):
    assert main(["collective", "--topology", "dgx-h100", *argv]) == 2
    assert message in capsys.readouterr().err


def test_localhost_ranks_are_bounded(capsys):
    assert main(["collective", "--topology", "localhost", "--ranks", "100000"]) == 2
    assert "at most 1024 processes per host" in capsys.readouterr().err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_collective_sweep_ticks_a_progress_bar_per_op_and_size(monkeypatch, capsys):
    from sim.cli import collective as collective_cli

    made = []
    real = collective_cli.progress_bar

    def recording(total, description, **kwargs):
        made.append((total, description, kwargs["delay_s"]))
        bar = real(total, description, stream=_Terminal(), **kwargs)
        made.append(bar)
        return bar

    monkeypatch.setattr(collective_cli, "progress_bar", recording)
    argv = ["collective", "--topology", "dgx-h100", "--ops", "all_reduce,all_gather",
            "-b", "1K", "-e", "1M", "-f", "32"]  # fmt: skip
    assert main(argv) == 0
    (total, description, delay_s), bar = made
    assert (total, description, delay_s) == (2 * 3, "simulating", 1.0)  # 2 ops x 1K, 32K, 1M
    assert bar.n == 6  # every (op, size) ticked once
    assert capsys.readouterr().err == ""  # the bar went to the terminal, nothing else to stderr
    monkeypatch.undo()
    assert main(argv) == 0
    assert capsys.readouterr().err == ""  # stderr is not a terminal here: no bar


def test_collective_names_protocols_and_runs_in_network_reduction(capsys):
    sharp = "ib-ndr-sharp-collnet"
    assert main(["collective", "--topology", "dgx-h100", "--nodes", "8", "--fabric",
                 sharp, "--ops", "all_reduce", "-b", "8G", "-e", "8G"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "# algorithms: 8589934592-8589934592 nvls/simple" in out  # NVLS + SHARP
    row = next(line.split() for line in out.splitlines() if line.lstrip().startswith("858993"))
    assert float(row[7]) > 8 * 47  # busbw: in-network reduction passes the ring's 8-NIC limit


def test_compare_on_the_p5_preset_attributes_the_plugins_picks(capsys):
    assert main(["compare", str(DATA / "h100_multinode_all_reduce_busbw.csv"), "--topology",
                 "p5-h100", "--only", "nodes=8"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "proto" in out.splitlines()[1]
    assert "33554432  tree           ll128" in out
    assert "1073741824  ring           ll128" in out
