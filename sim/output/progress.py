"""Progress bars for long commands: tqdm on standard error on a terminal, lines in a log.

A bar shows the count, the rate and the time left (ETA). When standard error is not a terminal
(a pipe, a log file, CI) a command that runs for minutes (``search``, ``validate``: ``log_every``)
writes one line per tenth of the work instead (``simulating: 30% (67/222 layouts, 31 s)``), so a
log shows it is alive; otherwise, or when the caller turns it off, nothing is written. Standard
output, where the results go, is never touched.

    bar = progress_bar(len(sizes), "simulating", delay_s=1.0)
    for size in sizes: ...; bar.update(1)
    bar.close()
"""

from __future__ import annotations

import math
import sys
import time
from typing import IO

from tqdm import tqdm

LOG_EVERY = 0.1
"""Share of the work between two progress lines when standard error is not a terminal."""


class LineProgress:
    """Progress for a log: a line each time another ``every`` of ``total`` is done."""

    disable = False
    """Shown (tqdm's attribute, which callers read)."""

    def __init__(
        self, total: int, description: str, *, unit: str, stream: IO[str], every: float
    ) -> None:
        self.total, self.description, self.unit, self.every = total, description, unit, every
        self.n = 0
        self._stream = stream
        self._shown = 0  # tenths (steps of ``every``) written so far
        self._start_s = time.monotonic()

    def update(self, n: int = 1) -> None:
        """Count ``n`` more; write a line when the count crosses another step."""
        self.n += n
        step = math.floor(self.n / self.total / self.every + 1e-9) if self.total else 0
        if step > self._shown:
            self._shown = step
            elapsed_s = time.monotonic() - self._start_s
            print(
                f"{self.description}: {self.n / self.total:.0%} ({self.n}/{self.total} "
                f"{self.unit}s, {elapsed_s:.0f} s)",
                file=self._stream,
                flush=True,
            )

    def write(self, text: str, file: IO[str] | None = None) -> None:
        """Notes are for the terminal bar; a log gets the progress lines only."""

    def close(self) -> None:
        """Nothing to remove from a log."""


def progress_bar(
    total: int | None,
    description: str,
    *,
    enabled: bool = True,
    delay_s: float = 0.0,
    unit: str = "it",
    stream: IO[str] | None = None,
    log_every: float | None = None,
) -> tqdm | LineProgress:
    """A tqdm bar on ``stream`` (standard error), disabled unless it is an enabled terminal;
    with ``log_every`` and a known ``total``, a ``LineProgress`` when it is not a terminal.

    ``delay_s`` keeps the bar hidden until that long has passed, so quick runs show nothing.
    """
    stream = sys.stderr if stream is None else stream
    if enabled and log_every and total and not stream.isatty():
        return LineProgress(total, description, unit=unit, stream=stream, every=log_every)
    return tqdm(
        total=total,
        desc=description,
        unit=unit,
        file=stream,
        disable=not (enabled and stream.isatty()),
        delay=delay_s,
        dynamic_ncols=True,
        leave=False,
    )


class PhaseBars:
    """One bar per phase of a long run (``sim.validation.runner.Progress``), notes above it."""

    def __init__(
        self, *, enabled: bool = True, stream: IO[str] | None = None, log_every: float = LOG_EVERY
    ) -> None:
        self._enabled = enabled
        self._stream = stream
        self._log_every = log_every
        self._bar: tqdm | LineProgress | None = None
        self._file: IO[str] = sys.stderr

    def start(self, phase: str, total: int) -> None:
        """Close the previous phase's bar and open one for ``total`` simulations."""
        self.close()
        # Resolved now, not at construction: tests and callers may swap sys.stderr in between.
        self._file = sys.stderr if self._stream is None else self._stream
        self._bar = progress_bar(
            total, phase, enabled=self._enabled, unit="sim", stream=self._file,
            log_every=self._log_every,
        )  # fmt: skip

    def advance(self, note: str = "") -> None:
        """Count one simulation; print ``note`` above the bar (only when the bar is shown)."""
        if self._bar is None:
            return
        if note and not self._bar.disable:
            self._bar.write(f"  {note}", file=self._file)
        self._bar.update(1)

    def close(self) -> None:
        """Remove the current bar from the terminal."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
