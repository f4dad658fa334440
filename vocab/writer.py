"""Results files: the ``commbench/1`` JSON and its CSV twin, rewritten atomically as sizes finish.

Torch-free. Every ``add`` rewrites both files through ``fileio.output`` (a temporary file renamed
over a regular file), so a run that dies keeps everything measured up to its last finished size
and never leaves a half-written file. A device or FIFO (``--output /dev/null``) gets the JSON
written in place and no CSV twin.

    writer = ResultsWriter(Path("run.json"), env={...}, config={...}); writer.add(records)
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fileio.output import Target, check_output, twin, write_text
from vocab.records import FIELD_NAMES, SCHEMA, Record

DEFAULT_DIR = Path("results") / "commbench"
"""Where results go without ``--output`` (relative to the current directory)."""


def default_output_path(ops: Iterable[str], now: float | None = None) -> Path:
    """``results/commbench/commbench-<ops>-<YYYYmmdd-HHMMSS>.json``, made unique if taken; the
    folder is created."""
    DEFAULT_DIR.mkdir(parents=True, exist_ok=True)
    ops = list(ops)
    label = ops[0] if len(ops) == 1 else f"{len(ops)}ops"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    path = DEFAULT_DIR / f"commbench-{label}-{stamp}.json"
    suffix = 1
    while path.exists():
        path = DEFAULT_DIR / f"commbench-{label}-{stamp}-{suffix}.json"
        suffix += 1
    return path


def csv_path(json_path: Path) -> Path:
    """The CSV written beside a results JSON."""
    return json_path.with_suffix(".csv")


def results_json(
    env: Mapping[str, Any], config: Mapping[str, Any], records: Iterable[Record]
) -> str:
    """The JSON document of a run."""
    document = {
        "schema": SCHEMA,
        "env": dict(env),
        "config": dict(config),
        "results": [r.to_dict() for r in records],
    }
    return json.dumps(document, indent=1) + "\n"


def results_csv(records: Iterable[Record]) -> str:
    """The CSV of a run: one row per record, columns ``records.FIELD_NAMES``."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=FIELD_NAMES, lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow(record.to_dict())
    return buffer.getvalue()


class ResultsWriter:
    """Accumulates a run's records and keeps the JSON and CSV files up to date on disk."""

    def __init__(
        self, output: Target | Path | str, *, env: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None:
        """Check the output (``fileio.output``) and write an empty result set right away."""
        self.target = (
            output if isinstance(output, Target) else check_output(output, formats=(".json",))
        )
        self.csv_target = twin(self.target, ".csv")
        self.env = dict(env)
        self.config = dict(config)
        self.records: list[Record] = []
        self._flush()

    def add(self, records: Iterable[Record]) -> None:
        """Append ``records`` and rewrite both files."""
        self.records.extend(records)
        self._flush()

    def _flush(self) -> None:
        write_text(self.target, results_json(self.env, self.config, self.records))
        if self.csv_target is not None:
            write_text(self.csv_target, results_csv(self.records))
