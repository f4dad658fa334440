"""Starting ranks without a launcher: N local processes, watched until they all end.

Torch-free. Each rank is ``python -m comm_bench <same arguments> --output <agreed file>`` with
the variables torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT on a free port). When a rank dies (or exits with an error), the others get
``timeout_s`` to stop on their own and are then killed; the parent prints which rank failed,
what it was doing (from its status file) and where the partial results are.

    exit_code = spawn_local(["--ops", "all_gather"], nprocs=4, timeout_s=120.0, output=path)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from comm_bench.faults import EXIT_FAILURE, EXIT_WRONG, STATUS_ENV, read_step

POLL_S = 0.05
"""How often the parent looks at its children."""


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_env(rank: int, nprocs: int, port: int, status_dir: Path) -> dict[str, str]:
    """The environment of spawned rank ``rank`` (what torchrun would set, plus a status dir)."""
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(nprocs),
        LOCAL_WORLD_SIZE=str(nprocs),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
    )
    env[STATUS_ENV] = str(status_dir)
    return env


def describe_exit(code: int) -> str:
    """``exited with code 3`` or ``was killed by SIGKILL``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _first_failure(procs: Sequence[subprocess.Popen[bytes]]) -> int | None:
    """Rank of the failed child to blame: killed by a signal first, then the lowest rank."""
    failed = [
        (p.returncode, r)
        for r, p in enumerate(procs)
        if p.returncode is not None and p.returncode not in (0, EXIT_WRONG)
    ]
    if not failed:
        return None
    return min(failed, key=lambda item: (item[0] >= 0, item[1]))[1]


def _wait_all(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> int | None:
    """Wait for every child; after a failure, give the rest ``timeout_s`` then kill them."""
    culprit: int | None = None
    deadline = float("inf")
    while any(p.poll() is None for p in procs):
        if culprit is None:
            culprit = _first_failure(procs)
            if culprit is not None:
                deadline = time.monotonic() + timeout_s
        if time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            break
        time.sleep(POLL_S)
    return culprit if culprit is not None else _first_failure(procs)


def _saved_count(output: Path) -> int | None:
    try:
        return len(json.loads(output.read_text(encoding="utf-8"))["results"])
    except (OSError, ValueError, KeyError):
        return None


def _failure_message(rank: int, code: int, step: str | None, output: Path) -> str:
    doing = f" during {step}" if step else " before its first collective"
    saved = _saved_count(output)
    kept = "no results were saved" if saved is None else f"{saved} result(s) saved in {output}"
    return f"commbench: error: rank {rank} {describe_exit(code)}{doing}; stopped the run; {kept}"


def spawn_local(argv: Sequence[str], *, nprocs: int, timeout_s: float, output: Path) -> int:
    """Run ``nprocs`` ranks of ``python -m comm_bench argv`` locally; returns the exit code."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="commbench-") as folder:
        status_dir = Path(folder)
        command = [sys.executable, "-m", "comm_bench", *argv, "--output", str(output)]
        procs = [
            subprocess.Popen(command, env=rank_env(rank, nprocs, port, status_dir))
            for rank in range(nprocs)
        ]
        try:
            culprit = _wait_all(procs, timeout_s)
        except KeyboardInterrupt:
            for p in procs:
                p.kill()
            raise
        if culprit is not None:
            code = procs[culprit].returncode
            step = read_step(status_dir, culprit)
            print(_failure_message(culprit, code, step, output), file=sys.stderr, flush=True)
            return EXIT_FAILURE
    return EXIT_WRONG if any(p.returncode == EXIT_WRONG for p in procs) else 0
