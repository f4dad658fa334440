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
        == "commbench: error: bad size '12Q'; use a number with an optional K, M, G or T suffix\n"
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
    monkeypatch.setattr("comm_bench.memory.device_memory_bytes", lambda device: None)  # no GPUs
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


LAUNCHER_ENV = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip
"""What torchrun sets in rank 0 of a 2-rank world on one host."""


def _refused(argv: list[str], launched: bool, tmp_path, monkeypatch, capsys) -> str:
    """``commbench argv --backend gloo`` in ``tmp_path``, spawning 2 ranks or as rank 0 of a
    torchrun world; asserts exit 2, one line, no traceback, no rank started; returns the line."""
    monkeypatch.chdir(tmp_path)
    for name, value in LAUNCHER_ENV.items():
        if launched:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)
    started = []
    monkeypatch.setattr("comm_bench.launch.spawn_local", lambda argv, **kw: started.append(kw))
    monkeypatch.setattr("comm_bench.harness.run_rank", lambda options: started.append(options))
    assert cli.main([*argv, "--backend", "gloo", "--nprocs", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not started
    return err


@pytest.mark.parametrize("launched", [False, True])
def test_a_csv_twin_that_is_a_folder_is_refused_before_any_rank_starts(
    launched, tmp_path, monkeypatch, capsys
):
    (tmp_path / "r.csv").mkdir()
    output = tmp_path / "r.json"
    argv = ["-n", "2", "-w", "1", "-b", "1K", "-e", "4K", "--output", str(output)]
    assert _refused(argv, launched, tmp_path, monkeypatch, capsys) == (
        f"commbench: error: {output} (.csv) '{tmp_path / 'r.csv'}' is a folder; give a file name\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["r.csv"]


@pytest.mark.parametrize("launched", [False, True])
def test_integer_avg_gloo_cannot_run_is_refused_before_any_rank_starts(
    launched, tmp_path, monkeypatch, capsys
):
    argv = ["-o", "avg", "-d", "int32", "--output", "r.json"]
    assert _refused(argv, launched, tmp_path, monkeypatch, capsys) == (
        "commbench: error: nothing to measure: backend gloo cannot average integers (-o avg -d "
        "int32) for all_reduce: it divides the sum in place; use a floating-point -d, another "
        "-o, or --backend nccl\n"
    )
    assert list(tmp_path.iterdir()) == []  # no results file, no results/ folder


@pytest.mark.parametrize("launched", [False, True])
@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        (
            ["-e", "99999999999999999999999999999"],
            "-e 99999999999999999999999999999: all_reduce at 79228162514264337593543950336 B "
            "needs 343,597,383,680.0 EiB per rank, 687,194,767,360.0 EiB for 2 ranks",
        ),
        (
            ["-e", "1T", "-f", "1024"],
            "-e 1099511627776: all_reduce at 1099511627776 B needs 5.0 TiB per rank, 10.0 TiB "
            "for 2 ranks",
        ),
    ],
)
def test_a_largest_size_beyond_the_hosts_memory_is_refused_before_any_rank_starts(
    sizes, message, launched, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr("comm_bench.memory.ram_bytes", lambda: 16 << 30)
    assert _refused([*sizes, "--output", "r.json"], launched, tmp_path, monkeypatch, capsys) == (
        f"commbench: error: {message}, more than the 16.0 GiB of RAM of this machine; use a "
        "smaller -e\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_with_nccl_each_ranks_gpu_must_hold_the_largest_size(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr("comm_bench.memory.device_memory_bytes", lambda device: 80 << 30)
    spawned = []
    monkeypatch.setattr("comm_bench.launch.spawn_local", lambda argv, **kw: spawned.append(kw) or 0)
    # all_reduce of 16 GiB: three buffers and an 8-byte check index per element, 80 GiB: fits
    assert cli.main(["-b", "16G", "-e", "16G", "--output", "r.json"]) == 0 and len(spawned) == 1
    assert cli.main(["-b", "17G", "-e", "17G", "--output", "r.json"]) == 2 and len(spawned) == 1
    assert capsys.readouterr().err == (
        "commbench: error: -e 18253611008: all_reduce at 18253611008 B needs 85.0 GiB, more than "
        "the 80.0 GiB of NVIDIA H100 80GB HBM3 (cuda:0); use a smaller -e\n"
    )
    assert list(tmp_path.iterdir()) == []
