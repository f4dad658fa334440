"""The result record shared by commbench (measured), nccl-tests logs (read) and commsim (simulated).

One ``Record`` is one row of the nccl-tests table for one placement (out-of-place or in-place).
Its fields are the ``results`` entries of the ``commbench/1`` JSON schema (see README) and the
columns of the CSV; ``row_problem`` checks a row field by field (type, finiteness, bounds,
allowed values) before a record is made of it. Torch-free: the simulator reads and writes these.

    >>> Record(op="all_reduce", size_bytes=1024, count=256, dtype="float32", world_size=8,
    ...        num_nodes=1, in_place=False, time_us=10.0, algbw_gbps=0.1, busbw_gbps=0.18).op
    'all_reduce'
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from fileio.strict import shorten
from vocab.collectives import DTYPE_BYTES, OPS, REDUCTIONS

SCHEMA = "commbench/1"
"""Schema tag of commbench / commsim result JSON files."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One measured or simulated (op, size, placement) result."""

    op: str
    """torch.distributed op name (see ``vocab.collectives.OPS``)."""
    size_bytes: int
    """nccl-tests' size column (all_gather: output buffer; reduce_scatter: input buffer)."""
    count: int
    """nccl-tests' count column (elements; per rank for all_gather/reduce_scatter/all_to_all)."""
    dtype: str
    """Element type (``float32``, ``bfloat16``, ...)."""
    world_size: int
    """Ranks taking part."""
    num_nodes: int
    """Hosts the ranks span."""
    in_place: bool
    """Whether output and input buffers overlap (nccl-tests' right-hand block)."""
    time_us: float
    """Mean time per call in microseconds (combined across ranks per ``-a``)."""
    algbw_gbps: float
    """size / time, in 1e9 B/s."""
    busbw_gbps: float
    """algbw x the op's bus factor, in 1e9 B/s."""
    num_wrong: int | None = None
    """Wrong elements summed over ranks (None: not checked)."""
    redop: str = "none"
    """Reduction (``sum``...) or ``none`` for non-reducing ops."""
    root: int = -1
    """Root rank, -1 for rootless ops."""
    time_min_us: float | None = None
    """Fastest iteration in microseconds."""
    time_median_us: float | None = None
    """Median iteration in microseconds."""
    time_p99_us: float | None = None
    """99th-percentile (nearest-rank) iteration in microseconds."""
    num_iters: int | None = None
    """Timed iterations behind ``time_us``."""
    algo: str | None = None
    """Algorithm, where known (``ring``, ``nvls``, ...)."""
    source: str = "measured"
    """``measured`` (commbench), ``nccl-tests`` (read from a log/table) or ``simulated``."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON/CSV row for this record."""
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Record:
        """Build a record from a JSON/CSV row; unknown keys are an error naming them."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(row) - names)
        if unknown:
            raise ValueError(f"unknown result field(s) {unknown}; valid: {sorted(names)}")
        return cls(**row)


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Record))
"""Record fields in declaration order: the CSV header."""


SOURCES = ("measured", "nccl-tests", "simulated")
"""Values of a record's ``source``."""


@dataclass(frozen=True, slots=True)
class _FieldRule:
    """What one record field may hold."""

    kind: type
    """``int``, ``float``, ``str`` or ``bool`` (ints are accepted where floats are)."""
    low: float | None = None
    """Smallest number allowed."""
    choices: tuple[str, ...] = ()
    """Allowed strings (empty: any)."""
    optional: bool = False
    """Whether null / missing is allowed."""


_RULES: dict[str, _FieldRule] = {
    "op": _FieldRule(str, choices=OPS),
    "size_bytes": _FieldRule(int, 0),
    "count": _FieldRule(int, 0),
    "dtype": _FieldRule(str, choices=tuple(DTYPE_BYTES)),
    "world_size": _FieldRule(int, 1),
    "num_nodes": _FieldRule(int, 1),
    "in_place": _FieldRule(bool),
    "time_us": _FieldRule(float, 0),
    "algbw_gbps": _FieldRule(float, 0),
    "busbw_gbps": _FieldRule(float, 0),
    "num_wrong": _FieldRule(int, 0, optional=True),
    "redop": _FieldRule(str, choices=("none", *REDUCTIONS)),
    "root": _FieldRule(int, -1),
    "time_min_us": _FieldRule(float, 0, optional=True),
    "time_median_us": _FieldRule(float, 0, optional=True),
    "time_p99_us": _FieldRule(float, 0, optional=True),
    "num_iters": _FieldRule(int, 1, optional=True),
    "algo": _FieldRule(str, optional=True),
    "source": _FieldRule(str, choices=SOURCES),
}
"""Every field of the ``commbench/1`` record, checked on reading."""
_REQUIRED = tuple(
    f.name for f in fields(Record) if f.default is MISSING and f.default_factory is MISSING
)
"""Fields a record must have (the others have defaults)."""


def _check_field(name: str, value: Any, rule: _FieldRule) -> str | None:
    """Why ``value`` is not a valid ``name`` (None when it is)."""
    if value is None:
        return None if rule.optional else "is required"
    if rule.kind is bool:
        return None if isinstance(value, bool) else "must be true or false"
    if rule.kind is str:
        if not isinstance(value, str):
            return "must be a string"
        if rule.choices and value not in rule.choices:
            return f"must be one of {', '.join(rule.choices)}"
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "must be a number"
    if rule.kind is int and not isinstance(value, int):
        return "must be an integer"
    if not math.isfinite(value):
        return "must be finite"
    if rule.low is not None and value < rule.low:
        return f"must be >= {rule.low:g}"
    return None


MAX_SIZE_BYTES = 1 << 50
"""Largest message a measured record may claim (1 PiB: a thousand times the largest buffer a
GPU holds; ``1e35`` B is a typo or a fuzzer)."""
MAX_TIME_US = 3.6e9
"""Longest time one collective may claim (an hour)."""


NCCL_ALGO_NAMES = {
    "ring": "ring",
    "tree": "tree",
    "nvls": "nvls",
    "nvlstree": "nvlstree",
    "nvls_tree": "nvlstree",
    "collnetdirect": "collnet_direct",
    "collnet_direct": "collnet_direct",
    "collnetchain": "collnet_chain",
    "collnet_chain": "collnet_chain",
    "hierarchical": "hierarchical",
    "direct": "direct",
    "gloo": "gloo",
}
"""Algorithm names found in measurements (ours or NCCL's ``NCCL_ALGO`` spellings) to ours."""
UNMODELLED_ALGO_NAMES = ("auto", "pat")
"""Names a measurement may carry that no algorithm of the model stands for: ``auto`` (none
forced) and NCCL's PAT; a record reads with them, a fit that needs its algorithm refuses it."""


def physics_problem(record: Record) -> str | None:
    """What a record claims that a measurement cannot (a size or time of zero, below or past any
    collective's, a bandwidth that is not a finite number, a root outside the world), or None."""
    if not 1 <= record.num_nodes <= record.world_size:
        return (
            f"world_size={record.world_size} and num_nodes={record.num_nodes} must satisfy "
            "1 <= num_nodes <= world_size"
        )
    if not 0 < record.size_bytes <= MAX_SIZE_BYTES:
        return f"size_bytes={record.size_bytes!r} must be in 1..{MAX_SIZE_BYTES:,} (1 PiB)"
    if not 0 < record.time_us <= MAX_TIME_US:  # False for nan
        return f"time_us={record.time_us!r} must be > 0 and at most {MAX_TIME_US:g} (an hour)"
    for name in ("algbw_gbps", "busbw_gbps"):
        value = getattr(record, name)
        if not (math.isfinite(value) and value >= 0):
            return f"{name}={value!r} must be a finite number >= 0"
    if record.root >= record.world_size:
        return f"root={record.root} is not a rank of a {record.world_size}-rank world"
    return None


def row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with a JSON/CSV row of record fields (``field=value must ...``), or None."""
    for name, rule in _RULES.items():
        if name not in row:
            if name in _REQUIRED:
                return f"missing field {name}"
            continue
        problem = _check_field(name, row[name], rule)
        if problem is not None:
            return f"{name}={shorten(row[name])} {problem}"
    return None
