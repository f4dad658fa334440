"""What each collective is, independent of how it runs: the single source of its arithmetic.

Per op this module defines the buffer sizes, what the "size" column means, the bandwidth
factors and the bytes each rank puts on the wire, exactly as nccl-tests defines them
(``src/<op>.cu`` ``*GetCollByteCount`` / ``*GetBw`` and ``doc/PERFORMANCE.md``):

- all_reduce: size = the buffer; busbw = algbw * 2(n-1)/n (a reduce-scatter then an all-gather)
- all_gather: size = the *output* buffer (n x per-rank input); busbw factor (n-1)/n
- reduce_scatter: size = the *input* buffer (n x per-rank output); busbw factor (n-1)/n
- all_to_all: size = the whole send buffer (n x per-peer chunk); busbw factor (n-1)/n
- broadcast, reduce, send_recv: size = the buffer; busbw factor 1 (the root's / one link)

algbw = size / time. GB/s are 1e9 bytes/s. The benchmark reports with this module and the
simulator models with it; nothing else in the project writes ``2*(n-1)/n``.

It is torch-free so that ``sim`` can import it.

    >>> get("all_gather").counts(1024, 4, 8)
    Counts(send_elems=32, recv_elems=256, count=32, size_bytes=1024)
"""

from __future__ import annotations

from dataclasses import dataclass

OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "send_recv",
)
"""Every op commbench measures and commsim simulates, in report order."""

REDUCTIONS = ("sum", "prod", "min", "max", "avg")
"""Reduction ops accepted by ``-o`` (nccl-tests' names)."""

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int32": 4,
    "int64": 8,
    "int8": 1,
    "uint8": 1,
}
"""Element size of each dtype accepted by ``-d``."""

NCCL_TESTS_DTYPES: dict[str, str] = {
    "float": "float32",
    "half": "float16",
    "bfloat16": "bfloat16",
    "double": "float64",
    "int32": "int32",
    "int": "int32",
    "int64": "int64",
    "int8": "int8",
    "char": "int8",
    "uint8": "uint8",
    "float32": "float32",
    "float16": "float16",
    "float64": "float64",
}
"""nccl-tests' type column (``float``, ``half``, ...) to our dtype names."""

DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "fp32": "float32",
    "f32": "float32",
    "single": "float32",
    "fp64": "float64",
    "f64": "float64",
    "i8": "int8",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
}
"""Short names people type for ``-d`` (torch's and the frameworks' ``bf16``, ``fp16``, ...)."""

MIN_WORLD_SIZE = {"send_recv": 2}
"""Fewest ranks an op runs on, where more than one: send_recv needs a peer other than itself."""

ALIGN_BYTES = 16
"""nccl-tests rounds per-rank counts down to a multiple of 16 bytes."""


@dataclass(frozen=True, slots=True)
class Counts:
    """Buffer element counts of one collective call, as nccl-tests sizes them."""

    send_elems: int
    """Elements in each rank's send (input) buffer."""
    recv_elems: int
    """Elements in each rank's receive (output) buffer."""
    count: int
    """The ``count`` column of the nccl-tests table."""
    size_bytes: int
    """The ``size`` column: max(send, recv) bytes, after rounding."""


@dataclass(frozen=True, slots=True)
class Collective:
    """The definition of one collective op (see the module docstring)."""

    name: str
    """torch.distributed's name for the op."""
    reduces: bool
    """Whether the op combines values with a reduction (``-o``)."""
    rooted: bool
    """Whether the op has a root rank (``-r``)."""
    sharded: bool
    """Whether each rank owns 1/n of the size (all_gather, reduce_scatter, all_to_all)."""
    bus_kind: str
    """Which busbw factor applies: ``"allreduce"``, ``"shard"`` or ``"one"``."""

    @property
    def prints_redop(self) -> bool:
        """Whether nccl-tests prints the ``-o`` reduction in the redop column: the reducing ops,
        and sendrecv, which loops over the reductions although it reduces nothing
        (NVIDIA/nccl-tests ``src/sendrecv.cu``; all_gather, alltoall and broadcast print
        ``none``)."""
        return self.reduces or self.name == "send_recv"

    def busbw_factor(self, world_size: int) -> float:
        """busbw / algbw for ``world_size`` ranks (nccl-tests' ``*GetBw``)."""
        n = _check_world(world_size)
        if self.bus_kind == "allreduce":
            return 2.0 * (n - 1) / n
        if self.bus_kind == "shard":
            return (n - 1) / n
        return 1.0

    def wire_bytes(self, size_bytes: float, world_size: int) -> float:
        """Bytes each rank sends under a bandwidth-optimal algorithm (= size x busbw factor)."""
        return size_bytes * self.busbw_factor(world_size)

    def counts(self, size_bytes: int, elem_bytes: int, world_size: int) -> Counts:
        """Element counts for a requested ``size_bytes`` (rounded down as nccl-tests does)."""
        n = _check_world(world_size)
        if size_bytes < 0:
            raise ValueError(f"size must be >= 0 bytes, got {size_bytes}")
        total = size_bytes // elem_bytes
        if not self.sharded:
            return Counts(total, total, total, total * elem_bytes)
        align = max(ALIGN_BYTES // elem_bytes, 1)
        per_rank = (total // n) // align * align
        full = per_rank * n
        if self.name == "all_gather":
            return Counts(per_rank, full, per_rank, full * elem_bytes)
        if self.name == "reduce_scatter":
            return Counts(full, per_rank, per_rank, full * elem_bytes)
        return Counts(full, full, per_rank, full * elem_bytes)  # all_to_all: count is per peer

    def size_from_count(self, count: int, elem_bytes: int, world_size: int) -> int:
        """The ``size`` column for a ``count`` column (the inverse used when reading logs)."""
        n = _check_world(world_size)
        return count * elem_bytes * (n if self.sharded else 1)


COLLECTIVES: dict[str, Collective] = {
    "all_reduce": Collective("all_reduce", True, False, False, "allreduce"),
    "all_gather": Collective("all_gather", False, False, True, "shard"),
    "reduce_scatter": Collective("reduce_scatter", True, False, True, "shard"),
    "all_to_all": Collective("all_to_all", False, False, True, "shard"),
    "broadcast": Collective("broadcast", False, True, False, "one"),
    "reduce": Collective("reduce", True, True, False, "one"),
    "send_recv": Collective("send_recv", False, False, False, "one"),
}

_ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "sendrecv": "send_recv",
    "bcast": "broadcast",
}


def _check_world(world_size: int) -> int:
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    return world_size


def canonical_op(name: str) -> str:
    """Our name for an op given ours, nccl-tests' (``allreduce``) or a ``*_perf`` binary name."""
    key = name.strip().lower().removesuffix("_perf")
    key = _ALIASES.get(key.replace("_", ""), key)
    if key not in COLLECTIVES:
        raise ValueError(f"unknown op {name!r}; valid ops: {', '.join(OPS)}")
    return key


def get(name: str) -> Collective:
    """The definition of op ``name`` (ValueError naming the valid ops otherwise)."""
    return COLLECTIVES[canonical_op(name)]


def parse_ops(text: str) -> list[str]:
    """``"all_gather,reduce_scatter"`` or ``"all"`` to a list of op names, in the order given."""
    if text.strip().lower() == "all":
        return list(OPS)
    names = [part for part in (p.strip() for p in text.split(",")) if part]
    if not names:
        raise ValueError(f"no op given in {text!r}; valid ops: all, {', '.join(OPS)}")
    ops: list[str] = []
    for name in names:
        op = canonical_op(name)
        if op not in ops:
            ops.append(op)
    return ops


def dtype_bytes(dtype: str) -> int:
    """Element size of ``dtype`` (ValueError naming the valid dtypes otherwise)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def algbw_gbps(size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 B/s): size / time."""
    if time_s <= 0:
        return 0.0
    return size_bytes / time_s / 1e9


def busbw_gbps(op: str, size_bytes: float, time_s: float, world_size: int) -> float:
    """Bus bandwidth in GB/s: algbw x the op's busbw factor."""
    return algbw_gbps(size_bytes, time_s) * get(op).busbw_factor(world_size)


def time_from_busbw_s(op: str, size_bytes: float, busbw: float, world_size: int) -> float:
    """Seconds a collective takes given its busbw in GB/s (the inverse of ``busbw_gbps``)."""
    if busbw <= 0:
        raise ValueError(f"busbw must be > 0 GB/s, got {busbw}")
    return size_bytes * get(op).busbw_factor(world_size) / (busbw * 1e9)
