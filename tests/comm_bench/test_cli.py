"""The command's contract: bad input, the backend and world size it picks, --compute."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.distributed as dist

from comm_bench import cli
from comm_bench.dist_env import resolve_backend


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


def test_auto_backend_follows_the_machine_it_runs_on():
    nccl = torch.cuda.is_available() and dist.is_nccl_available()
    assert resolve_backend("auto") == ("nccl" if nccl else "gloo")
    assert resolve_backend("gloo") == "gloo"


@pytest.mark.parametrize(
    ("gpus", "args", "nprocs"),
    [
        (0, [], cli.DEFAULT_CPU_PROCS),
        (0, ["--nprocs", "2"], 2),
        (2, [], 2),
        (1, ["--nprocs", "2", "--backend", "gloo"], 2),
    ],
)
def test_spawned_world_size_follows_the_backend(tmp_path, monkeypatch, gpus, args, nprocs):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    spawned = []
    monkeypatch.setattr("comm_bench.launch.spawn_local", lambda argv, **kw: spawned.append(kw) or 0)
    assert cli.main(["--ops", "all_reduce", "--output", "r.json", *args]) == 0
    assert [kw["nprocs"] for kw in spawned] == [nprocs]


def test_auto_on_one_gpu_refuses_two_ranks(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert cli.main(["--ops", "all_reduce", "--nprocs", "2"]) == 2
    assert capsys.readouterr().err == (
        "commbench: error: --nprocs 2 exceeds the 1 GPU(s) here; NCCL needs one each\n"
    )
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
