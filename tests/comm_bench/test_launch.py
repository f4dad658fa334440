"""Launching: torchrun, and what happens when a rank dies or hangs mid-run."""

from __future__ import annotations

import shutil
import sys

import pytest

from vocab.readers import read_results

SWEEP = ["--ops", "all_reduce", "-b", "1K", "-e", "64K", "-f", "2", "-n", "3", "-w", "1"]


def test_torchrun_launch_uses_its_world(commbench):
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not installed")
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "-m",
        "comm_bench",
    ]
    run = commbench(
        ["--ops", "all_reduce", "-b", "1K", "-e", "4K", "-n", "3", "-w", "1"], launcher=launcher
    )
    assert run.returncode == 0, run.stderr
    records = read_results(run.output)
    assert [(r.size_bytes, r.in_place) for r in records] == [
        (1024, False),
        (1024, True),
        (2048, False),
        (2048, True),
        (4096, False),
        (4096, True),
    ]
    assert {r.world_size for r in records} == {2} and all(r.num_wrong == 0 for r in records)
    assert run.stdout.count("# Collective test starting: all_reduce_perf") == 1


def test_a_killed_rank_stops_the_run_and_keeps_partial_results(commbench):
    env = {"COMMBENCH_KILL_RANK": "2", "COMMBENCH_KILL_AT_SIZE": "8192"}
    run = commbench(["--nprocs", "3", "--timeout", "20", *SWEEP], env=env)
    assert run.returncode == 3
    assert run.elapsed_s < 20 + 30  # the timeout plus process start-up, never a hang
    assert "rank 2 was killed by SIGKILL during all_reduce 8192 B" in run.stderr
    assert "6 result(s) saved" in run.stderr
    records = read_results(run.output)
    assert sorted({r.size_bytes for r in records}) == [1024, 2048, 4096]


def test_a_hung_rank_is_detected_within_the_timeout(commbench):
    env = {"COMMBENCH_HANG_RANK": "1", "COMMBENCH_KILL_AT_SIZE": "2048"}
    run = commbench(["--nprocs", "2", "--timeout", "3", *SWEEP], env=env)
    assert run.returncode == 3
    assert run.elapsed_s < 3 * 3 + 30
    assert "all_reduce 2048 B" in run.stderr
    assert [r.size_bytes for r in read_results(run.output)] == [1024, 1024]


class _Child:
    """A stand-in for a rank's process whose exit shows up at a given poll."""

    def __init__(self, code: int | None, after_polls: int = 0) -> None:
        self.code, self.after_polls, self.returncode = code, after_polls, None
        self.killed = False

    def poll(self) -> int | None:
        if self.after_polls > 0:
            self.after_polls -= 1
        elif self.returncode is None and self.code is not None:
            self.returncode = self.code
        return self.returncode

    def kill(self) -> None:
        self.killed, self.code, self.after_polls = True, -9, 0

    def wait(self) -> int | None:
        return self.poll()


def test_the_rank_killed_by_a_signal_is_blamed_though_a_peer_exits_first() -> None:
    """Rank 1 fails because rank 2 died; rank 2's SIGKILL is reaped a few polls later: the
    launcher still blames rank 2. A rank it kills itself after the timeout is never blamed."""
    from comm_bench.launch import _wait_all

    failure = 3  # comm_bench.faults.EXIT_FAILURE: a collective failed
    peer_first = [_Child(0), _Child(failure), _Child(-9, after_polls=3)]
    assert _wait_all(peer_first, 30.0, []) == 2  # type: ignore[arg-type]
    hung = [_Child(failure), _Child(None)]  # rank 1 never exits: killed at the timeout
    assert _wait_all(hung, 0.0, []) == 0  # type: ignore[arg-type]
    assert hung[1].killed
