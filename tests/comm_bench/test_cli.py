"""The command's contract for bad input and --compute."""

from __future__ import annotations

import importlib

from comm_bench import cli


def test_bad_flag_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--ops", "all_gather", "-e", "12Q"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == "commbench: error: bad size '12Q'; use an integer with an optional K, M, G or T suffix\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_root_outside_the_spawned_world_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    assert cli.main(["--ops", "reduce", "-r", "5", "--nprocs", "2", "--backend", "gloo"]) == 2
    assert "-r 5 is not a rank of a 2-rank world" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_compute_is_handed_over_or_refused_cleanly(monkeypatch, capsys):
    try:
        importlib.import_module("comm_bench.compute")
    except ModuleNotFoundError:
        assert cli.main(["--compute", "--help"]) == 2
        assert "--compute is not available" in capsys.readouterr().err
        return
    calls = []
    monkeypatch.setattr("comm_bench.compute.main", lambda argv: calls.append(argv) or 0)
    assert cli.main(["--compute", "-x", "1"]) == 0 and calls == [["-x", "1"]]
