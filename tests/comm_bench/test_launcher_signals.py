"""The launcher owns its ranks: signals are forwarded, nothing outlives it, one --output each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from comm_bench import launch
from comm_bench.launch import FORWARDED_SIGNALS, GRACE_S, PARENT_ENV, PARENT_POLL_S, rank_argv

HANG = {"COMMBENCH_HANG_RANK": "1", "COMMBENCH_KILL_AT_SIZE": "2048"}
"""Rank 1 hangs at 2 KiB: the run would last the whole --timeout without a signal."""
ARGS = ["--ops", "all_reduce", "-b", "1K", "-e", "4K", "-n", "3", "-w", "1", "--nprocs", "2"]
needs_proc = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="needs /proc to find the processes"
)


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


@needs_proc
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


def test_ranks_that_ignore_the_signal_are_killed_after_the_grace_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(launch, "GRACE_S", 0.5)
    started = "import time; print(flush=True); time.sleep(60)"
    stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + started
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        for code in (started, stubborn)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            p.stdout.readline()  # started, and SIGTERM ignored where asked
        start = time.monotonic()
        code = launch._stop(procs, signal.SIGTERM, tmp_path / "absent.json")
        elapsed_s = time.monotonic() - start
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            assert p.stdout is not None
            p.stdout.close()
    assert code == 128 + signal.SIGTERM
    assert [p.returncode for p in procs] == [-signal.SIGTERM, -signal.SIGKILL]
    assert 0.5 <= elapsed_s < 5
    assert capsys.readouterr().err == (
        "commbench: error: stopped by SIGTERM; its 2 rank(s) are gone; no results were saved\n"
    )


def test_a_signal_stops_the_run_and_the_previous_handlers_come_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = {s: signal.getsignal(s) for s in FORWARDED_SIGNALS}
    seen: list[int] = []

    def run_ranks(argv: list[str], *, received: list[int], **_: object) -> int:
        signal.raise_signal(signal.SIGHUP)  # its Python handler runs before this returns
        seen.extend(received)
        return 128 + received[0]

    monkeypatch.setattr(launch, "_run_ranks", run_ranks)
    code = launch.spawn_local(["-n", "1"], nprocs=2, timeout_s=1.0, output=tmp_path / "r.json")
    assert code == 128 + signal.SIGHUP and seen == [signal.SIGHUP]
    assert {s: signal.getsignal(s) for s in FORWARDED_SIGNALS} == before


GUARDED = (
    "import os\n"
    "from comm_bench.launch import PARENT_ENV, die_with_parent\n"
    "die_with_parent()\n"
    "print(os.environ.get(PARENT_ENV), flush=True)\n"
)
"""A rank's first step, then whether the launcher's pid is still in its environment."""


def test_a_rank_checks_its_launcher_at_once() -> None:
    def start(parent: int) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, **{PARENT_ENV: str(parent)})
        command = [sys.executable, "-c", GUARDED]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)

    alive = start(os.getpid())
    assert (alive.returncode, alive.stdout) == (0, "None\n")
    orphan = start(os.getpid() + 1)  # not its parent: the launcher died before prctl
    assert (orphan.returncode, orphan.stdout) == (128 + signal.SIGTERM, "")
    assert f"the launcher (pid {os.getpid() + 1}) that started this rank is gone" in orphan.stderr


WATCHED = (
    "import sys, time\n"
    "from comm_bench.launch import die_with_parent\n"
    "sys.platform = 'darwin'  # no prctl: the watchdog thread must notice\n"
    "die_with_parent()\n"
    "print(flush=True)\n"
    "time.sleep(60)\n"
)
"""A rank on a system without prctl."""
LAUNCHER = (
    "import os, subprocess, sys\n"
    f"env = dict(os.environ, {PARENT_ENV}=str(os.getpid()))\n"
    "command = [sys.executable, '-c', sys.argv[1]]\n"
    "rank = subprocess.Popen(command, env=env, stdout=subprocess.PIPE)\n"
    "rank.stdout.readline()\n"
    "print(rank.pid, flush=True)\n"
    "os._exit(0)\n"
)
"""Starts the rank, waits until its watchdog runs, and dies without a word."""


@needs_proc
def test_without_prctl_a_watchdog_thread_ends_the_orphaned_rank() -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, WATCHED], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    rank = 0
    try:
        assert launcher.stdout is not None
        rank = int(launcher.stdout.readline())
        launcher.wait(timeout=30)
        deadline = time.monotonic() + PARENT_POLL_S + 3
        while _alive(rank) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(rank)
        _, err = launcher.communicate(timeout=30)  # the rank's stderr is the launcher's
        assert b"that started this rank is gone; stopping" in err
    finally:
        if rank and _alive(rank):
            os.kill(rank, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
        launcher.communicate()
