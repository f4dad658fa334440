"""Read measured collectives into ``Record``s: commbench JSON/CSV, nccl-tests logs, busbw tables.

Torch-free (the simulator's calibration uses it). Formats, detected from the content:

- commbench ``commbench/1`` JSON and its CSV (columns ``records.FIELD_NAMES``);
- nccl-tests text output (``all_reduce_perf`` logs, commbench's own stdout, the ``.txt`` tables):
  every table row gives two records (out-of-place, in-place) with the numbers as printed. The op
  comes from the log's ``# Collective test starting: <op>_perf`` marker, else from the file name
  (``h100_8gpu_all_gather_ring.txt``: op all_gather, algo ring, world 8); the world size from the
  ``#  Rank`` lines of the run's header (from ``# nThread``), else ``nranks N``, else ``<N>gpu``
  in the file name. A line that starts like a row (size, count, dtype) but is not one (too few
  fields, a root that is no integer, ``inf`` / ``nan``) is a ValueError naming the file, line
  and text; a 1-rank run's blocks are skipped with a warning (no bus bandwidth), a ValueError
  when the file holds nothing else. A table whose sizes restart is split into blocks and each
  block's op is checked against its own columns (redop, root, count x dtype x world vs size,
  busbw / algbw): a block that contradicts the declared op is relabelled when exactly one op
  fits (with a warning, and no algo), and skipped with a warning when several do (e.g. redop
  ``none`` rows appended to an all_reduce log fit both all_gather and all_to_all);
- busbw CSV tables (``op,num_nodes,gpus_per_node,size_bytes,busbw_gbps``): busbw as printed,
  algbw and time derived with ``collectives``; dtype float32 (nccl-tests' default) and placement
  from the file's comment (``in-place`` / ``out-of-place``; default out-of-place).

    records = read_results("results/commbench/run.json")
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fileio.strict import load_json, read_input, shorten
from vocab.collectives import (
    NCCL_TESTS_DTYPES,
    OPS,
    canonical_op,
    dtype_bytes,
    get,
)
from vocab.records import (
    FIELD_NAMES,
    MAX_SIZE_BYTES,
    NCCL_ALGO_NAMES,
    SCHEMA,
    UNMODELLED_ALGO_NAMES,
    Record,
    physics_problem,
    row_problem,
)

BUSBW_COLUMNS = ("op", "num_nodes", "gpus_per_node", "size_bytes", "busbw_gbps")
"""Header of the published busbw tables."""

_MARKER = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_RUN_START = re.compile(r"^#\s*nThread\b")
_RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+)\s.*?\son\s+(\S+)")
_NRANKS = re.compile(r"\bnranks\s+(\d+)")
_FILE_WORLD = re.compile(r"(\d+)[-_]?gpus?(?![a-z])", re.IGNORECASE)
_ALGOS = ("nvlstree", "nvls", "ring", "tree", "collnet", "pat")


class UnknownFormatError(ValueError):
    """The file is none of the formats this module reads."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Row:
    """One parsed table line."""

    tokens: tuple[str, ...]
    """The whitespace-separated fields."""
    size_bytes: int
    """The size column."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Section:
    """A run of rows under one header context (one marker, one world, one block of sizes)."""

    declared_op: str | None
    """The op the log or file name says."""
    world_size: int | None
    """Ranks, where the log or file name says."""
    num_nodes: int
    """Distinct hosts in the rank lines (1 when unknown)."""
    rows: tuple[_Row, ...]
    """The rows, sizes increasing."""


def read_results(
    path: str | Path, *, op: str | None = None, world: int | None = None
) -> list[Record]:
    """Every record in ``path`` (any supported format; ValueError naming the file otherwise),
    each checked for what a measurement allows (``records.physics_problem``).

    ``op`` names the collective of an nccl-tests log that does not say it (no ``Collective test
    starting`` line, and a file name that names no op); ``world`` the ranks of a log that neither
    lists them nor says ``nranks`` (a pasted table)."""
    path = Path(path)
    records = _read_any(path, op, world)
    for index, record in enumerate(records):
        problem = physics_problem(record)
        known = (*NCCL_ALGO_NAMES, *UNMODELLED_ALGO_NAMES)
        if record.algo and record.algo.strip().lower() not in known:
            problem = f"algo {shorten(record.algo)} is not an algorithm; valid: {', '.join(known)}"
        if problem is not None:
            what = f"{record.op} {record.size_bytes} B"
            raise ValueError(f"{path}: result {index} ({shorten(what)}): {problem}")
    return records


def _read_any(path: Path, op: str | None, world: int | None = None) -> list[Record]:
    """The records of ``path`` in whichever format it is."""
    text = read_input(path, what="measured results")
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return _read_json(text, path)
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")), "")
    header = tuple(col.strip() for col in first.split(","))
    if header == FIELD_NAMES:
        return _read_commbench_csv(text, path)
    if header == BUSBW_COLUMNS:
        return parse_busbw_csv(text, name=str(path))
    records = parse_nccl_tests_text(text, name=path.name, op=op, world=world)
    if not records:
        has_rows = any(_is_row(line.split()) for line in text.splitlines())
        if (
            has_rows
            and op is None
            and not _MARKER.search(text)
            and _file_hints(path.name)[0] is None
        ):
            raise UnknownFormatError(
                f"{path}: has nccl-tests rows, but neither the log nor its name says which "
                "collective ran; name it with --op (e.g. --op all_reduce)"
            )
        raise UnknownFormatError(f"{path}: no commbench or nccl-tests results found")
    return records


_PRINTED_RELEASE = re.compile(r"NCCL version (\d+\.\d+\.\d+)|nccl-library=(\d{5,})")


def nccl_versions_printed(path: str | Path) -> set[str]:
    """The NCCL releases a results file names, as written: a commbench JSON's
    ``env.nccl_version``; in a log, NCCL's ``NCCL version 2.26.2+cuda12.8`` lines or nccl-tests'
    ``nccl-library=22602`` (``NCCL_VERSION_CODE``). Empty when it names none."""
    text = read_input(path, what="measured results")
    if not text.lstrip().startswith("{"):
        return {a or b for a, b in _PRINTED_RELEASE.findall(text)}
    with contextlib.suppress(ValueError):
        document = load_json(text, name=str(path))
        env = document.get("env") if isinstance(document, dict) else None
        release = env.get("nccl_version") if isinstance(env, dict) else None
        if release not in (None, ""):
            return {str(release)}
    return set()


def read_many(paths: Iterable[str | Path]) -> list[Record]:
    """The records of several files, in order."""
    return [record for path in paths for record in read_results(path)]


def _read_json(text: str, path: Path) -> list[Record]:
    try:
        document = load_json(text, name=str(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: malformed JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        found = document.get("schema") if isinstance(document, dict) else type(document).__name__
        raise UnknownFormatError(f"{path}: schema {found!r} is not {SCHEMA!r}")
    rows = document.get("results")
    if not isinstance(rows, list):
        raise ValueError(f"{path}: 'results' must be a list of records, got {rows!r}")
    return [_record(row, path, index) for index, row in enumerate(rows)]


def _record(row: Any, path: Path, index: int) -> Record:
    """``Record.from_dict(row)``, every field checked; ValueError naming the file, the row, the
    field and the value."""
    where = f"{path}: result {index}"
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a mapping of record fields, got {shorten(row)}")
    problem = row_problem(row)
    if problem is not None:
        raise ValueError(f"{where}: {problem}")
    try:
        return Record.from_dict(row)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _csv_value(name: str, text: str) -> Any:
    if text == "":
        return None
    if name in ("size_bytes", "count", "world_size", "num_nodes", "num_wrong", "root", "num_iters"):
        return int(text)
    if name == "in_place":
        flag = text.strip().lower()
        if flag not in ("true", "false"):
            raise ValueError(f"in_place={shorten(text)} must be true or false")
        return flag == "true"
    if name in ("op", "dtype", "redop", "algo", "source"):
        return text
    return float(text)


def _read_commbench_csv(text: str, path: Path) -> list[Record]:
    reader = csv.DictReader(io.StringIO(text))
    records = []
    for index, row in enumerate(reader):
        if None in row:  # csv.DictReader keeps fields past the header under None
            raise ValueError(f"{path}: result {index}: more fields than the header's")
        try:
            values = {name: _csv_value(name, row[name] or "") for name in FIELD_NAMES}
        except ValueError as exc:
            raise ValueError(f"{path}: result {index}: {exc}") from None
        values["redop"] = values["redop"] or "none"
        values["source"] = values["source"] or "measured"
        records.append(_record(values, path, index))
    return records


def parse_busbw_csv(text: str, *, name: str = "<busbw table>") -> list[Record]:
    """Records of a published busbw table (see the module docstring for derived fields); a row
    with missing or extra fields, a value that is no number, or a bus bandwidth that gives no
    time (zero, or one GPU, where no bus is used) is a ValueError naming ``name`` and the row."""
    comments = " ".join(ln for ln in text.splitlines() if ln.startswith("#")).lower()
    in_place = "in-place" in comments.replace("out-of-place", "")
    rows = csv.DictReader(
        io.StringIO(
            "\n".join(ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))
        )
    )
    records = []
    for index, row in enumerate(rows):
        op, num_nodes, world, size, busbw = _busbw_row(row, f"{name}: row {index + 1}")
        definition = get(op)
        algbw = busbw / definition.busbw_factor(world)
        records.append(
            Record(
                op=op,
                size_bytes=size,
                count=size // dtype_bytes("float32") // (world if definition.sharded else 1),
                dtype="float32",
                world_size=world,
                num_nodes=num_nodes,
                in_place=in_place,
                time_us=size / (algbw * 1e9) * 1e6 if algbw > 0 else 0.0,
                algbw_gbps=algbw,
                busbw_gbps=busbw,
                redop="sum" if definition.prints_redop else "none",
                root=0 if definition.rooted else -1,
                source="nccl-tests",
            )
        )
    return records


def _busbw_row(row: dict[Any, Any], where: str) -> tuple[str, int, int, int, float]:
    """(op, nodes, world, size, busbw) of a busbw-table row, each field checked."""
    if None in row or None in row.values():  # csv.DictReader: extra fields, missing ones
        raise ValueError(
            f"{where}: expected the {len(BUSBW_COLUMNS)} fields {', '.join(BUSBW_COLUMNS)}"
        )
    numbers: dict[str, float] = {}
    for column in BUSBW_COLUMNS[1:]:
        try:
            numbers[column] = float(row[column])
        except ValueError:
            raise ValueError(f"{where}: {column}={shorten(row[column])} is not a number") from None
        whole = column != "busbw_gbps"
        if not (math.isfinite(numbers[column]) and numbers[column] > 0) or (
            whole and not numbers[column].is_integer()
        ):
            kind = "a whole number" if whole else "a finite number"
            raise ValueError(f"{where}: {column}={shorten(row[column])} must be {kind} > 0")
    nodes, world = int(numbers["num_nodes"]), int(numbers["num_nodes"] * numbers["gpus_per_node"])
    op = canonical_op(row["op"])
    if get(op).busbw_factor(world) == 0:
        raise ValueError(
            f"{where}: {op} on {world} GPU has no bus bandwidth (nothing crosses a link): "
            "no time can be derived"
        )
    size = numbers["size_bytes"]
    if size > MAX_SIZE_BYTES:
        raise ValueError(f"{where}: size_bytes={row['size_bytes']} is over {MAX_SIZE_BYTES:,}")
    return op, nodes, world, int(size), numbers["busbw_gbps"]


def _file_hints(name: str) -> tuple[str | None, str | None, int | None]:
    """(op, algo, world) that a file name such as ``h100_8gpu_all_gather_ring.txt`` states."""
    stem = Path(name).stem.lower()
    op = next((o for o in sorted(OPS, key=len, reverse=True) if o in stem), None)
    if op is None:
        compact = stem.replace("_", "")
        aliases = {
            "allreduce": "all_reduce",
            "allgather": "all_gather",
            "reducescatter": "reduce_scatter",
            "alltoall": "all_to_all",
            "sendrecv": "send_recv",
        }
        op = next((v for k, v in aliases.items() if k in compact), None)
    words = re.split(r"[_\-.]", stem)
    algo = next((a for a in _ALGOS if a in words), None)
    world = _FILE_WORLD.search(stem)
    return op, algo, int(world.group(1)) if world else None


ROW_LENGTHS = (13, 19)
"""Fields of a table row: nccl-tests' 13; commbench adds min / median / p99 times (19)."""
_PLACEMENT_COLUMNS = ("time", "algbw", "busbw", "#wrong", "min", "median", "p99")
"""The numbers of one placement, in column order (the last 3 only in 19-field rows)."""
ONE_RANK = "a 1-rank run (world size 1) has no bus bandwidth to calibrate on"
"""Why the tables of a 1-rank run are not read (no data crosses a link; busbw prints 0)."""


def _looks_like_row(tokens: list[str]) -> bool:
    """Starts as a table row does: size, count, an nccl-tests dtype."""
    return (
        len(tokens) >= 3
        and tokens[0].isdigit()
        and tokens[1].isdigit()
        and tokens[2] in NCCL_TESTS_DTYPES
    )


def _is_row(tokens: list[str]) -> bool:
    return _looks_like_row(tokens) and len(_with_root(tokens)) in ROW_LENGTHS


OLD_ROW_LENGTH = 12
"""Fields of a row of nccl-tests before 2.10: no root column, and an ``error`` column (the
largest error, a float) where ``#wrong`` is now."""


def _old_error(token: str) -> bool:
    """An ``error`` cell of a pre-2.10 row: ``%e``-printed (``5e-07``) or ``N/A``."""
    return token == "N/A" or re.fullmatch(r"-?\d(\.\d+)?e[-+]\d+", token) is not None


def _with_root(tokens: list[str]) -> list[str]:
    """A pre-2.10 row (12 fields, a time where the root is) with the root column (-1) added;
    its error columns then read as unchecked (no ``#wrong`` count)."""
    if len(tokens) == OLD_ROW_LENGTH and all(_old_error(tokens[i]) for i in (7, 11)):
        return [*tokens[:4], "-1", *tokens[4:]]
    return tokens


def _row_problem(tokens: list[str]) -> str | None:
    """Why a line that starts like a table row is not one (None when it is)."""
    if len(tokens) not in ROW_LENGTHS:
        return f"{len(tokens)} fields, where a row has 13 (19 with min/median/p99 times)"
    if not re.fullmatch(r"-?\d+", tokens[4]):
        return f"root {tokens[4]!r} is not an integer"
    half = (len(tokens) - 5) // 2
    for placement, start in (("out-of-place", 5), ("in-place", 5 + half)):
        for column, token in zip(_PLACEMENT_COLUMNS, tokens[start : start + half], strict=False):
            value = _number(token)
            if value is not None and not math.isfinite(value):
                return f"{placement} {column} {token!r} is not finite"
            if value is None and token != "N/A" and column in ("time", "algbw", "busbw"):
                return f"{placement} {column} {token!r} is not a number"  # N/A: not run
    return None


def _split_sections(
    text: str, file_op: str | None, file_world: int | None, name: str
) -> list[_Section]:
    """Rows grouped by marker and by restarts of the size sequence; ValueError naming the file,
    line and text of a line that starts like a row but is not one (too few fields, inf, nan)."""
    sections: list[_Section] = []
    marker_op: str | None = None
    hosts: dict[int, str] = {}
    nranks: int | None = None
    rows: list[_Row] = []

    def close() -> None:
        if rows:
            world = len(hosts) or nranks or file_world
            sections.append(
                _Section(
                    declared_op=marker_op or file_op,
                    world_size=world,
                    num_nodes=len(set(hosts.values())) or 1,
                    rows=tuple(rows),
                )
            )
            rows.clear()

    for number, line in enumerate(text.splitlines(), start=1):
        if marker := _MARKER.search(line):
            close()
            marker_op = canonical_op(marker.group(1))
        elif _RUN_START.match(line):
            close()
            hosts, nranks = {}, None
        elif rank := _RANK_LINE.match(line):
            hosts[int(rank.group(1))] = rank.group(2)
        elif (count := _NRANKS.search(line)) and not line.startswith("#"):
            if int(count.group(1)) < 1:
                raise ValueError(f"{name} line {number}: nranks {count.group(1)}: no rank ran")
            nranks = max(nranks or 0, int(count.group(1)))
        elif not line.startswith("#") and _looks_like_row(tokens := _with_root(line.split())):
            if problem := _row_problem(tokens):
                raise ValueError(f"{name} line {number}: {problem}: {' '.join(tokens)}")
            size = int(tokens[0])
            if rows and size <= rows[-1].size_bytes:
                close()
            rows.append(_Row(tokens=tuple(tokens), size_bytes=size))
    close()
    return sections


def _row_fits(op: str, row: _Row, world: int) -> bool:
    """Whether a row's redop, root, count/size and busbw/algbw are those of ``op``."""
    definition = get(op)
    t = row.tokens
    elem = dtype_bytes(NCCL_TESTS_DTYPES[t[2]])
    # sendrecv's redop column reads as nccl-tests prints it ("sum") or as older tables did
    redop_as_printed = definition.prints_redop == (t[3] != "none") or op == "send_recv"
    if not redop_as_printed or definition.rooted != (int(t[4]) >= 0):
        return False
    if definition.size_from_count(int(t[1]), elem, world) != row.size_bytes:
        return False
    half = (len(t) - 5) // 2
    for start in (5, 5 + half):
        algbw, busbw = _number(t[start + 1]), _number(t[start + 2])
        if algbw is None or busbw is None or algbw < 1.0:
            continue  # too small to tell factors apart after rounding to 0.01
        if abs(busbw - algbw * definition.busbw_factor(world)) > 0.02:
            return False
    return True


def _resolve_op(section: _Section, world: int, where: str) -> str | None:
    """The op of a block: the declared one if its columns agree, else the only one that fits."""
    candidates = [op for op in OPS if all(_row_fits(op, row, world) for row in section.rows)]
    declared = section.declared_op
    if declared in candidates:
        return declared
    if set(candidates) == {"all_reduce", "send_recv"}:
        # two ranks: all_reduce's busbw factor is 1, as send_recv's, and both print the
        # reduction; a block that does not say it is a sendrecv reads as the all_reduce
        candidates = ["all_reduce"]
    if len(candidates) == 1:
        named = f"not {declared}" if declared else "no op named"
        warnings.warn(
            f"{where}: columns are those of {candidates[0]}, {named}; "
            f"read as {candidates[0]} (algorithm unknown)",
            stacklevel=3,
        )
        return candidates[0]
    why = f"fits {' or '.join(candidates)}" if candidates else "fits no op"
    warnings.warn(f"{where}: declared {declared}, but the block {why}; skipped", stacklevel=3)
    return None


MAX_INFERRED_WORLD = 65_536
"""Largest world size read off a table's busbw / algbw ratio."""
BUS_FACTOR_TOLERANCE = 0.002
"""Relative match of busbw / algbw to a bus factor (the tables print 2 decimals)."""


def world_from_bus_factor(op: str, rows: tuple[_Row, ...]) -> int | None:
    """The one world size whose busbw factor (``collectives``) the rows' median busbw / algbw
    matches; None when several match (large worlds) or the factor does not depend on the world
    (broadcast, reduce, send_recv)."""
    definition = get(op)
    if definition.busbw_factor(2) == definition.busbw_factor(MAX_INFERRED_WORLD):
        return None
    ratios = []
    for row in rows:
        algbw, busbw = (_number(v) for v in row.tokens[6:8])
        if algbw is not None and busbw is not None and algbw > 0:
            ratios.append(busbw / algbw)
    if not ratios:
        return None
    ratio = sorted(ratios)[len(ratios) // 2]
    matches = []
    for world in range(2, MAX_INFERRED_WORLD + 1):
        factor = definition.busbw_factor(world)
        if abs(factor - ratio) <= BUS_FACTOR_TOLERANCE * factor:
            matches.append(world)
        elif factor > ratio or len(matches) > 1:
            break
    return matches[0] if len(matches) == 1 else None  # large worlds are too close to tell


def _number(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


def _wrong(token: str) -> int | None:
    return int(token) if token.isdigit() else None


def _row_records(
    op: str, row: _Row, section: _Section, world: int, algo: str | None, source: str
) -> list[Record]:
    t = row.tokens
    half = (len(t) - 5) // 2
    records = []
    for in_place, start in ((False, 5), (True, 5 + half)):
        block = t[start : start + half]
        time_us, algbw, busbw = (_number(v) for v in block[:3])
        if time_us is None or algbw is None or busbw is None:
            continue
        extras = [_number(v) for v in block[4:7]] if half == 7 else [None, None, None]
        definition = get(op)
        records.append(
            Record(
                op=op,
                size_bytes=row.size_bytes,
                count=int(t[1]),
                dtype=NCCL_TESTS_DTYPES[t[2]],
                world_size=world,
                num_nodes=section.num_nodes,
                in_place=in_place,
                time_us=time_us,
                algbw_gbps=algbw,
                busbw_gbps=busbw,
                num_wrong=_wrong(block[3]),
                redop=t[3] if definition.prints_redop else "none",
                root=int(t[4]),
                time_min_us=extras[0],
                time_median_us=extras[1],
                time_p99_us=extras[2],
                algo=algo,
                source=source,
            )
        )
    return records


def parse_nccl_tests_text(
    text: str, *, name: str = "", op: str | None = None, world: int | None = None
) -> list[Record]:
    """Records of an nccl-tests (or commbench stdout) text log; ``name`` supplies file hints,
    ``op`` the collective and ``world`` the ranks where neither the log nor the name says them."""
    file_op, file_algo, file_world = _file_hints(name) if name else (None, None, None)
    if world is not None:
        file_world = world
    if op is not None:
        file_op = canonical_op(op)
    source = "measured" if "# commbench " in text else "nccl-tests"
    records: list[Record] = []
    one_rank: list[str] = []
    for index, section in enumerate(_split_sections(text, file_op, file_world, name or "log")):
        where = f"{name or 'log'} block {index + 1} (sizes from {section.rows[0].size_bytes})"
        if section.world_size is None and file_op is not None:
            world = world_from_bus_factor(file_op, section.rows)
            if world is not None:
                section = dataclasses.replace(section, world_size=world)
        if section.world_size is None:
            warnings.warn(
                f"{where}: world size unknown (no Rank lines, nranks or <N>gpu in "
                "the file name); skipped",
                stacklevel=2,
            )
            continue
        if section.world_size == 1:
            one_rank.append(where)
            continue
        block_op = _resolve_op(section, section.world_size, where)
        if block_op is None:
            continue
        algo = file_algo if block_op == file_op else None
        for row in section.rows:
            records.extend(_row_records(block_op, row, section, section.world_size, algo, source))
    if one_rank and not records:
        raise ValueError(f"{name or 'log'}: {ONE_RANK}; measure with 2 or more ranks")
    for where in one_rank:
        warnings.warn(f"{where}: {ONE_RANK}; skipped", stacklevel=2)
    return records
