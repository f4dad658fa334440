"""Starting ranks without a launcher: N local processes, owned until they all end.

Torch-free. Each rank is ``python -m comm_bench <same arguments> --output <agreed file>`` with
the variables torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT on a free port). When a rank dies (or exits with an error), the others get
``timeout_s`` to stop on their own and are then killed; the parent prints which rank failed,
what it was doing (from its status file) and where the partial results are.

The launcher owns its ranks, as torchrun's agent does: SIGINT, SIGTERM and SIGHUP are forwarded
to every rank, which get ``GRACE_S`` to stop before they are killed; all are reaped, the partial
results are named, and the launcher exits with 128 + the signal number. A rank also dies when
its launcher dies without a word (``die_with_parent``: Linux's parent-death signal, or a
watchdog thread polling the parent's pid elsewhere).

    exit_code = spawn_local(["--ops", "all_gather"], nprocs=4, timeout_s=120.0, output=path)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from comm_bench.faults import EXIT_FAILURE, EXIT_NOTHING, EXIT_WRONG, STATUS_ENV, read_step
from vocab.readers import read_results

POLL_S = 0.05
"""How often the parent looks at its children."""
GRACE_S = 5.0
"""How long ranks get to stop after a forwarded signal before they are killed."""
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals the launcher passes on to its ranks."""
PARENT_ENV = "COMMBENCH_LAUNCHER_PID"
"""Set in each spawned rank: the pid of the launcher it must not outlive."""
PR_SET_PDEATHSIG = 1
"""prctl option: the signal a process gets when its parent thread exits (Linux)."""
PARENT_POLL_S = 1.0
"""How often a rank without prctl looks whether its launcher is still its parent."""


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
    env[PARENT_ENV] = str(os.getpid())
    return env


def die_with_parent() -> None:
    """In a spawned rank: end this process when the launcher that started it is gone.

    A no-op unless ``PARENT_ENV`` names the launcher (it is taken out of the environment, so
    that nothing this rank starts inherits it). Linux: prctl(PR_SET_PDEATHSIG, SIGTERM), then a
    check that the launcher did not die before it took effect. Elsewhere: a daemon thread that
    polls the parent's pid every ``PARENT_POLL_S``.
    """
    expected = os.environ.pop(PARENT_ENV, None)
    if not expected or not expected.isdigit():
        return
    parent = int(expected)
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:  # the launcher died before prctl took effect
        _orphaned(parent)
    if not armed:
        threading.Thread(
            target=_watch_parent, args=(parent,), name="commbench-parent", daemon=True
        ).start()


def _watch_parent(parent: int) -> None:
    # An orphan is re-parented (to init or a subreaper), so its parent pid changes; unlike
    # probing the old pid with kill(pid, 0), this cannot be fooled by a reused pid.
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    _orphaned(parent)


def _orphaned(parent: int) -> NoReturn:
    print(
        f"commbench: error: the launcher (pid {parent}) that started this rank is gone; stopping",
        file=sys.stderr,
        flush=True,
    )
    os._exit(128 + int(signal.SIGTERM))


def describe_exit(code: int) -> str:
    """``exited with code 3`` or ``was killed by SIGKILL``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _first_failure(
    procs: Sequence[subprocess.Popen[bytes]], spared: frozenset[int] = frozenset()
) -> int | None:
    """Rank of the failed child to blame: killed by a signal first, then the lowest rank; ranks
    in ``spared`` (the launcher killed them itself) are not blamed."""
    failed = [
        (p.returncode, r)
        for r, p in enumerate(procs)
        if r not in spared
        and p.returncode is not None
        and p.returncode not in (0, EXIT_WRONG, EXIT_NOTHING)
    ]
    if not failed:
        return None
    return min(failed, key=lambda item: (item[0] >= 0, item[1]))[1]


def _wait_all(
    procs: Sequence[subprocess.Popen[bytes]], timeout_s: float, received: list[int]
) -> int | None:
    """Wait for every child; after a failure, give the rest ``timeout_s`` then kill them.
    Returns at once when a signal was ``received`` (the caller stops the ranks).

    The rank blamed is chosen once every exit is known: a rank killed by a signal takes its
    peers down with it, and a peer's error can be reaped before the killed rank's own exit."""
    culprit: int | None = None
    deadline = float("inf")
    killed: set[int] = set()
    while any(p.poll() is None for p in procs) and not received:
        if culprit is None:
            culprit = _first_failure(procs)
            if culprit is not None:
                deadline = time.monotonic() + timeout_s
        if time.monotonic() > deadline:
            for rank, p in enumerate(procs):
                if p.poll() is None:
                    p.kill()
                    killed.add(rank)
            for p in procs:
                p.wait()
            break
        time.sleep(POLL_S)
    if received:
        return culprit
    blamed = _first_failure(procs, frozenset(killed))
    return blamed if blamed is not None else culprit


def _saved_count(output: Path) -> int | None:
    try:
        return len(read_results(output))
    except (OSError, ValueError):
        return None


def _failure_message(rank: int, code: int, step: str | None, output: Path) -> str:
    doing = f" during {step}" if step else " before its first collective"
    saved = _saved_count(output)
    kept = "no results were saved" if saved is None else f"{saved} result(s) saved in {output}"
    return f"commbench: error: rank {rank} {describe_exit(code)}{doing}; stopped the run; {kept}"


def _stop(procs: Sequence[subprocess.Popen[bytes]], signum: int, output: Path) -> int:
    """Forward ``signum`` to every live rank, kill what remains after ``GRACE_S``, reap all."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signum)
    deadline = time.monotonic() + GRACE_S
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()
    saved = _saved_count(output)
    kept = "no results were saved" if saved is None else f"{saved} result(s) saved in {output}"
    name = signal.Signals(signum).name
    print(
        f"commbench: error: stopped by {name}; its {len(procs)} rank(s) are gone; {kept}",
        file=sys.stderr,
        flush=True,
    )
    return 128 + signum


def rank_argv(argv: Sequence[str], output: Path) -> list[str]:
    """The ranks' arguments: the user's, with exactly one ``--output`` (the agreed file)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--output":
            skip = True
        elif not arg.startswith("--output="):
            kept.append(arg)
    return [*kept, "--output", str(output)]


def spawn_local(argv: Sequence[str], *, nprocs: int, timeout_s: float, output: Path) -> int:
    """Run ``nprocs`` ranks of ``python -m comm_bench argv`` locally; returns the exit code."""
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)

    # Python lets only the main thread install handlers; elsewhere the caller owns the signals.
    owner = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, on_signal) for s in FORWARDED_SIGNALS} if owner else {}
    try:
        return _run_ranks(
            argv, nprocs=nprocs, timeout_s=timeout_s, output=output, received=received
        )
    finally:
        for signum, handler in previous.items():
            # None: the previous handler was installed outside Python; the default is closest.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _run_ranks(
    argv: Sequence[str], *, nprocs: int, timeout_s: float, output: Path, received: list[int]
) -> int:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="commbench-") as folder:
        status_dir = Path(folder)
        command = [sys.executable, "-m", "comm_bench", *rank_argv(argv, output)]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(nprocs):
                env = rank_env(rank, nprocs, port, status_dir)
                procs.append(subprocess.Popen(command, env=env))
                if received:
                    break
            culprit = _wait_all(procs, timeout_s, received)
        except BaseException:
            for p in procs:
                p.kill()
                p.wait()
            raise
        if received:
            return _stop(procs, received[0], output)
        if culprit is not None:
            code = procs[culprit].returncode
            step = read_step(status_dir, culprit)
            print(_failure_message(culprit, code, step, output), file=sys.stderr, flush=True)
            return EXIT_FAILURE
    codes = {p.returncode for p in procs}
    if EXIT_NOTHING in codes:
        return EXIT_NOTHING  # every rank said so; rank 0 printed which ops and why
    return EXIT_WRONG if EXIT_WRONG in codes else 0
