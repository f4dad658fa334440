"""Measured collectives the user gives: files read (``vocab.readers``), filtered and checked.

Files are commbench JSON/CSV, nccl-tests logs or busbw tables; ``--only`` selectors
(``sim.network.compare``) keep the matching records; records the benchmark found wrong
(``#wrong`` > 0) are refused unless allowed. What the reader notices on the way is passed to
``note``, one line each.

    records = read_measured(["run.json"], ["op=all_reduce"], note=print)
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable

from sim.network.compare import any_matches, parse_selector
from vocab.collectives import canonical_op
from vocab.readers import read_results
from vocab.records import Record


def add_reading_arguments(parser: argparse.ArgumentParser) -> None:
    """``--op`` and ``--allow-wrong``: how measured files are read (calibrate, compare)."""
    parser.add_argument(
        "--op", default=None,
        help="collective of nccl-tests logs that do not name it (in the log or the file name)",
    )  # fmt: skip
    parser.add_argument(
        "--allow-wrong", action="store_true",
        help="use records whose #wrong > 0 (results the benchmark found wrong); refused by default",
    )  # fmt: skip


def read_measured(
    paths: list[str],
    only: list[str],
    *,
    op: str | None = None,
    allow_wrong: bool = False,
    note: Callable[[str], None],
) -> list[Record]:
    """Records of every file, filtered by the ``--only`` selectors; reader warnings to ``note``.
    Records with ``#wrong`` > 0 are counted, and refused unless ``allow_wrong``."""
    if op is not None:
        op = canonical_op(op)
    selectors = [parse_selector(text) for text in only]
    records: list[Record] = []
    wrong: list[tuple[str, Record]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for path in paths:
            found = read_results(path, op=op)
            wrong += [(path, r) for r in found if r.num_wrong]
            records.extend(found)
    for warning in caught:
        note(str(warning.message))
    if wrong:
        path, first = wrong[0]
        example = f"{first.op} {first.size_bytes} B in {path} ({first.num_wrong} wrong)"
        if not allow_wrong:
            raise ValueError(
                f"{len(wrong)} record(s) have #wrong > 0 (the benchmark computed wrong results), "
                f"e.g. {example}; rerun, or pass --allow-wrong to use them anyway"
            )
        note(f"using {len(wrong)} record(s) with #wrong > 0 (--allow-wrong), e.g. {example}")
    if selectors:
        records = [r for r in records if any_matches(selectors, r)]
    if not records:
        raise ValueError(f"no measured records in {', '.join(paths)} (after --only {only})")
    return records
