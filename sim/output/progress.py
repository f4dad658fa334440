"""Progress bars for long commands: tqdm on standard error, and only on a terminal.

A bar shows the count, the rate and the time left (ETA). When standard error is not a terminal
(a pipe, a log file, CI) or the caller turns it off, the bar is disabled and writes nothing, so
redirected output stays clean; standard output, where the results go, is never touched.

    bar = progress_bar(len(sizes), "simulating", delay_s=1.0)
    for size in sizes: ...; bar.update(1)
    bar.close()
"""

from __future__ import annotations

import sys
from typing import IO

from tqdm import tqdm


def progress_bar(
    total: int | None,
    description: str,
    *,
    enabled: bool = True,
    delay_s: float = 0.0,
    unit: str = "it",
    stream: IO[str] | None = None,
) -> tqdm:
    """A tqdm bar on ``stream`` (standard error), disabled unless it is an enabled terminal.

    ``delay_s`` keeps the bar hidden until that long has passed, so quick runs show nothing.
    """
    stream = sys.stderr if stream is None else stream
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

    def __init__(self, *, enabled: bool = True, stream: IO[str] | None = None) -> None:
        self._enabled = enabled
        self._stream = stream
        self._bar: tqdm | None = None
        self._file: IO[str] = sys.stderr

    def start(self, phase: str, total: int) -> None:
        """Close the previous phase's bar and open one for ``total`` simulations."""
        self.close()
        # Resolved now, not at construction: tests and callers may swap sys.stderr in between.
        self._file = sys.stderr if self._stream is None else self._stream
        self._bar = progress_bar(total, phase, enabled=self._enabled, unit="sim", stream=self._file)

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
