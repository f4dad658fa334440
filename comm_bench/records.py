"""The result record shared by commbench (measured), nccl-tests logs (read) and commsim (simulated).

One ``Record`` is one row of the nccl-tests table for one placement (out-of-place or in-place).
Its fields are the ``results`` entries of the ``commbench/1`` JSON schema (see README) and the
columns of the CSV. Torch-free: the simulator reads and writes these too.

    >>> Record(op="all_reduce", size_bytes=1024, count=256, dtype="float32", world_size=8,
    ...        num_nodes=1, in_place=False, time_us=10.0, algbw_gbps=0.1, busbw_gbps=0.18).op
    'all_reduce'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

SCHEMA = "commbench/1"
"""Schema tag of commbench / commsim result JSON files."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One measured or simulated (op, size, placement) result."""

    op: str
    """torch.distributed op name (see ``comm_bench.collectives.OPS``)."""
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
