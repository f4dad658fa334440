"""Progress bars: drawn with an ETA on a terminal, a line per tenth in a log when asked."""

from __future__ import annotations

import io
import re

from tqdm import tqdm

from sim.output.progress import PhaseBars, progress_bar


class _Terminal(io.StringIO):
    """Standard error as a terminal would be."""

    def isatty(self) -> bool:
        return True


def _tick(bar: tqdm, n: int) -> None:
    """``n`` updates, then a redraw (tqdm skips redraws within 0.1 s of the last)."""
    for _ in range(n):
        bar.update(1)
    bar.refresh()
    bar.close()


def test_a_terminal_gets_a_bar_with_count_and_time_left() -> None:
    stream = _Terminal()
    _tick(progress_bar(3, "simulating", unit="size", stream=stream), 3)
    text = stream.getvalue()
    assert "simulating" in text
    # tqdm's "[elapsed<remaining" is the ETA.
    assert re.search(r"3/3 \[\d\d:\d\d<\d\d:\d\d", text), text


def test_no_terminal_or_turned_off_means_no_output() -> None:
    piped = io.StringIO()
    _tick(progress_bar(3, "simulating", stream=piped), 3)
    assert piped.getvalue() == ""
    terminal = _Terminal()
    _tick(progress_bar(3, "simulating", enabled=False, stream=terminal), 3)
    assert terminal.getvalue() == ""


def test_phase_bars_write_notes_above_the_bar_only_on_a_terminal() -> None:
    stream = _Terminal()
    bars = PhaseBars(stream=stream)
    bars.start("calibrating", 2)
    bars.advance()
    bars.advance()
    bars.start("simulating", 1)
    bars.advance("case_a: 1.000 s predicted (0.01 s wall)")
    bars.close()
    text = stream.getvalue()
    assert "calibrating" in text and "simulating" in text
    assert "  case_a: 1.000 s predicted (0.01 s wall)\n" in text
    piped = io.StringIO()
    bars = PhaseBars(stream=piped)
    bars.start("simulating", 1)
    bars.advance("case_a: 1.000 s predicted (0.01 s wall)")
    bars.close()
    assert piped.getvalue() == "simulating: 100% (1/1 sims, 0 s)\n"  # the progress, no notes
    quiet = io.StringIO()
    bars = PhaseBars(stream=quiet, enabled=False)
    bars.start("simulating", 1)
    bars.advance("case_a")
    assert quiet.getvalue() == ""


def test_a_log_gets_one_line_per_tenth_of_a_long_run() -> None:
    """Not a terminal (``search > log``): a line per 10% with the count and the time so far,
    never more than ten, and nothing where the command did not ask for lines."""
    piped = io.StringIO()
    bar = progress_bar(222, "simulating", unit="layout", stream=piped, log_every=0.1)
    for _ in range(222):
        bar.update(1)
    bar.close()
    lines = piped.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[0] == "simulating: 10% (23/222 layouts, 0 s)"
    assert lines[2] == "simulating: 30% (67/222 layouts, 0 s)"
    assert lines[-1] == "simulating: 100% (222/222 layouts, 0 s)"
