"""Which validation ``commsim validate`` is asked for, and the flags and cases it can use.

One run is one validation: the published runs (the default), ``--leave-one-source-out``,
``--steps``, ``--collectives`` or ``--traces``. Two of them, a flag the chosen one does not read,
an empty ``--ids``, or a cases file with no case to simulate is one line (exit code 2) before
anything runs, rather than a validation silently dropped, a flag silently ignored or an empty
report written.

    mode = check_mode(args)  # "" for the published runs, else e.g. "steps"
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fileio.strict import shorten
from sim.validation.cases import DEFAULT_CASES_PATH

MODES = ("steps", "collectives", "traces", "leave_one_source_out")
"""The validations other than the published runs' (``args`` attributes), one per run."""
MODE_READS: dict[str, tuple[str, ...]] = {
    "": ("cases", "calibrate_on", "ids", "plot", "fidelity", "calibration", "jobs"),
    "leave_one_source_out": ("cases", "ids", "jobs"),
    "collectives": ("plot",),
    "steps": (),
    "traces": (),
}
"""The flags (``args`` attributes) each validation reads besides ``--json``."""
DEFAULTS: dict[str, Any] = {"cases": DEFAULT_CASES_PATH, "fidelity": "analytical", "jobs": 1}
"""Values of those flags that are not given (the others default to None)."""


def _flag(name: str) -> str:
    return "CASES.json" if name == "cases" else "--" + name.replace("_", "-")


def check_mode(args: argparse.Namespace) -> str:
    """The one validation asked for (``""``: the published runs); two of them, or a flag the
    chosen one does not read, is a ValueError naming them."""
    chosen = [m for m in MODES if getattr(args, m) not in (None, False)]
    if len(chosen) > 1:
        raise ValueError(
            f"{_flag(chosen[0])} and {_flag(chosen[1])}: give only one of "
            f"{', '.join(map(_flag, MODES))} (one validation per run)"
        )
    mode = chosen[0] if chosen else ""
    for name in MODE_READS[""]:
        value = getattr(args, name)
        if name not in MODE_READS[mode] and value != DEFAULTS.get(name):
            echo = str(value) if len(str(value)) <= 60 else shorten(str(value))
            raise ValueError(f"{_flag(name)} {echo} does not apply to {_flag(mode)}")
    return mode


def id_list(text: str | None, flag: str = "--ids") -> tuple[str, ...]:
    """The ids of ``--ids`` / ``--calibrate-on`` (none when not given); an empty value or item
    is refused (``--ids ''`` is not every case)."""
    if text is None:
        return ()
    ids = tuple(part.strip() for part in text.split(","))
    if not all(ids):
        empty = " (an empty item)" if text.strip() else ""
        raise ValueError(f"{flag} {shorten(text)}: expected comma-separated case ids{empty}")
    return ids


def check_usable(cases_path: Path, cases: list[dict[str, Any]], ids: Sequence[str]) -> None:
    """At least one case (of ``ids``) can be simulated; else a ValueError saying why none can,
    with the first case's missing knobs."""
    from sim.validation.runner import map_cases

    mappings = map_cases(cases, ids)
    if any(m.simulable for m in mappings):
        return
    first, which = mappings[0], "selected " if ids else ""
    missing = "; ".join(first.missing[:2]) or "no plan or measurement"
    more = f"; and {len(first.missing) - 2} more" if len(first.missing) > 2 else ""
    raise ValueError(
        f"{cases_path}: none of the {len(mappings)} {which}cases can be simulated "
        f"(e.g. {first.case_id}: {missing}{more})"
    )
