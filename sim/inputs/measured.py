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
from topologies.config import load_cluster
from topologies.nccl_release import check_nccl_version
from topologies.presets import NODE_PRESETS
from vocab.collectives import canonical_op
from vocab.readers import nccl_versions_printed, read_results
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


def nccl_version_of(path: str) -> str | None:
    """The NCCL release a measured file prints, ``major.minor.patch`` (None: it prints none);
    ValueError naming the file when it prints an unreadable release or several."""
    try:
        releases = {check_nccl_version(text) for text in nccl_versions_printed(path)}
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if len(releases) > 1:
        raise ValueError(f"{path} prints several NCCL releases: {', '.join(sorted(releases))}")
    return releases.pop() if releases else None


def release_from_measured(args: argparse.Namespace, note: Callable[[str], None]) -> None:
    """Run the simulation under the NCCL release the measured files print (``args.measured``),
    when ``--nccl-version`` is not given and ``--topology`` is a preset: sets
    ``args.nccl_version`` and says so; a cluster file keeps its own release, and a note says
    where the files print another. ValueError when the files print different releases."""
    if getattr(args, "nccl_version", ""):
        return
    printed = {path: nccl_version_of(path) for path in args.measured}
    releases = sorted({v for v in printed.values() if v is not None})
    if len(releases) > 1:
        named = ", ".join(f"{v} ({p})" for p, v in printed.items() if v is not None)
        raise ValueError(
            f"the measured files print different NCCL releases: {named}; give them one at a "
            "time, or name one with --nccl-version"
        )
    if not releases:
        return
    if args.topology not in NODE_PRESETS:
        own = load_cluster(args.topology).nccl_version or "none (2.30.7's rules)"
        if own != releases[0]:
            note(
                f"the measured files print NCCL {releases[0]}; the cluster file names {own}, "
                "which is what runs"
            )
        return
    args.nccl_version = releases[0]
    count = sum(v is not None for v in printed.values())
    note(
        f"NCCL {releases[0]}'s tuning tables, as {count} of the {len(printed)} measured "
        "file(s) print it (--nccl-version overrides)"
    )


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
