"""Failure handling of one rank: a watchdog for stalls, progress notes, and debug fault injection.

Torch-free. Each rank arms the ``Watchdog`` before every phase (warm-up, timed loop, check) of
every size; if the phase outlives its budget (``--timeout`` per collective in it) the rank
prints which op and size stalled and exits with ``EXIT_FAILURE`` (results so far are already
on disk). Under commbench's own spawner each rank also writes its current step to a status file
so that the parent can say what a rank that died without a word was doing.

Debug hooks, for tests: ``COMMBENCH_KILL_RANK=R`` makes rank R kill itself with SIGKILL at the
first step whose size is ``COMMBENCH_KILL_AT_SIZE`` bytes (default: any) and whose op is
``COMMBENCH_KILL_OP`` (default: any); ``COMMBENCH_HANG_RANK=R`` makes rank R stop responding
there instead.

    watchdog = Watchdog(rank=0, timeout_s=120.0); watchdog.arm("all_reduce 1024 B timed", 20)
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from fileio.output import write_text

EXIT_WRONG = 1
"""Exit code when any element was wrong."""
EXIT_FAILURE = 3
"""Exit code when a collective failed, timed out, or a rank died."""
EXIT_NOTHING = 4
"""Exit code when nothing was measured: the backend refused every op asked for."""

STATUS_ENV = "COMMBENCH_STATUS_DIR"
"""Directory where spawned ranks note their current step (set by the spawner)."""


class Watchdog:
    """A daemon thread that ends the process when the armed phase runs past its budget."""

    def __init__(self, *, rank: int, timeout_s: float) -> None:
        """Start the thread; nothing is armed yet."""
        self.rank = rank
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._what = ""
        self._deadline: float | None = None
        thread = threading.Thread(target=self._watch, name="commbench-watchdog", daemon=True)
        thread.start()

    def arm(self, what: str, num_calls: int = 1) -> None:
        """Expect ``what`` (``num_calls`` collectives) to finish within ``num_calls`` timeouts."""
        with self._lock:
            self._what = what
            self._deadline = time.monotonic() + self.timeout_s * max(num_calls, 1)

    def disarm(self) -> None:
        """Nothing is running that could stall."""
        with self._lock:
            self._deadline = None

    def _watch(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while True:
            time.sleep(period)
            with self._lock:
                late = self._deadline is not None and time.monotonic() > self._deadline
                what = self._what
            if late:
                print(
                    f"commbench: error: rank {self.rank}: {what} did not finish within "
                    f"--timeout {self.timeout_s:g} s per collective (a rank died or hangs); "
                    "results measured so far are saved",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(EXIT_FAILURE)


def note_step(rank: int, what: str) -> None:
    """Record ``what`` as this rank's current step for the spawner (no-op under torchrun)."""
    folder = os.environ.get(STATUS_ENV)
    if not folder:
        return
    write_text(Path(folder) / f"rank{rank}", what)


def read_step(folder: Path, rank: int) -> str | None:
    """The step rank ``rank`` last noted, if any."""
    try:
        return (folder / f"rank{rank}").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _matches(rank: int, op: str, size_bytes: int, rank_var: str) -> bool:
    if os.environ.get(rank_var) != str(rank):
        return False
    size = os.environ.get("COMMBENCH_KILL_AT_SIZE")
    wanted_op = os.environ.get("COMMBENCH_KILL_OP")
    return (size is None or int(size) == size_bytes) and (wanted_op in (None, op))


def inject_faults(rank: int, op: str, size_bytes: int) -> None:
    """Apply the debug kill / hang hooks if they name this rank, op and size."""
    if _matches(rank, op, size_bytes, "COMMBENCH_KILL_RANK"):
        print(
            f"commbench: rank {rank}: killed by COMMBENCH_KILL_RANK at {op} {size_bytes} B",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGKILL)
    if _matches(rank, op, size_bytes, "COMMBENCH_HANG_RANK"):
        print(
            f"commbench: rank {rank}: hanging (COMMBENCH_HANG_RANK) at {op} {size_bytes} B",
            file=sys.stderr,
            flush=True,
        )
        while True:
            time.sleep(3600)
