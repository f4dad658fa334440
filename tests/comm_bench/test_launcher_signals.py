"""The launcher owns its ranks: signals are forwarded, nothing outlives it, one --output each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from comm_bench.launch import GRACE_S, rank_argv

HANG = {"COMMBENCH_HANG_RANK": "1", "COMMBENCH_KILL_AT_SIZE": "2048"}
"""Rank 1 hangs at 2 KiB: the run would last the whole --timeout without a signal."""
ARGS = ["--ops", "all_reduce", "-b", "1K", "-e", "4K", "-n", "3", "-w", "1", "--nprocs", "2"]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped by init counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[int]]:
    env = dict(os.environ, PYTHONWARNINGS="ignore", **HANG)
    output = tmp_path / "run.json"
    command = [sys.executable, "-m", "comm_bench", *ARGS, "--backend", "gloo", "-T", "120"]
    launcher = subprocess.Popen(
        [*command, "--output", str(output)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # both ranks up and the hang reached
        ranks = _children(launcher.pid)
        written = output.read_bytes() if output.exists() else b""
        if len(ranks) == 2 and b'"size_bytes": 1024' in written:  # 1 KiB done, 2 KiB hangs
            return launcher, ranks
        time.sleep(0.2)
    launcher.kill()
    pytest.fail("the ranks did not start within 60 s")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the ranks")
def test_sigterm_to_the_launcher_stops_every_rank(tmp_path: Path) -> None:
    launcher, ranks = _start(tmp_path)
    try:
        for rank in ranks:
            cmdline = Path(f"/proc/{rank}/cmdline").read_bytes().split(b"\0")
            assert cmdline.count(b"--output") == 1
        os.kill(launcher.pid, signal.SIGTERM)
        _, err = launcher.communicate(timeout=GRACE_S + 30)
        assert launcher.returncode == 128 + signal.SIGTERM
        stopped_at = time.monotonic()
        assert "stopped by SIGTERM" in err.decode()
        assert "result(s) saved in" in err.decode()
        while any(_alive(r) for r in ranks) and time.monotonic() < stopped_at + GRACE_S:
            time.sleep(0.1)
        assert not [r for r in ranks if _alive(r)]
    finally:
        for pid in (launcher.pid, *ranks):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_ranks_die_with_a_killed_launcher(tmp_path: Path) -> None:
    launcher, ranks = _start(tmp_path)
    try:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + GRACE_S
        while any(_alive(r) for r in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [r for r in ranks if _alive(r)]
    finally:
        for pid in ranks:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_rank_arguments_carry_exactly_one_output() -> None:
    out = Path("agreed.json")
    assert rank_argv(["--ops", "x", "--output", "a.json"], out) == [
        "--ops",
        "x",
        "--output",
        "agreed.json",
    ]
    assert rank_argv(["--output=a.json", "-n", "3"], out) == ["-n", "3", "--output", "agreed.json"]
