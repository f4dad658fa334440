"""Inputs whose collective results are exactly predictable, and the check counting wrong elements.

Every element is a small integer chosen so that its reduction over the world stays exactly
representable in the dtype (int8 up to 127, uint8 255, bfloat16 256, float16 2048, ...):

- non-reducing ops: rank r's element at global index g is ``(g + 3 r + rep) % 113``;
- sum / min / max: rank r holds ``v[(k + r) % m]`` at residue ``k = (g + rep) % m`` with
  ``v = 0..m-1`` and the largest ``m <= 8`` whose sum over the world fits; when even ``m = 2`` does
  not fit, sum uses sparse ones (``v = [1, 0, ..., 0]``) with ``m = ceil(n / limit)``;
- prod: ``v = [2, 1, ..., 1]`` with ``m`` large enough that at most ``log2(limit)`` twos meet;
- avg: ``b + d(r)`` with ``b = 1..4`` and ``d = +1, -1`` on rank pairs (0 on the last odd rank),
  so the sum is exactly ``n b`` and the average exactly ``b`` wherever the dtype holds ``5 n``
  (beyond that every rank holds 1). NCCL computes float averages as a pre-multiplied sum
  (x / n summed), which is exact only for power-of-two worlds; elsewhere avg on floats is
  compared within ``2 n`` ulp. Integer avg beyond the dtype's range (int8 over 127 ranks)
  overflows in any implementation and is reported wrong.

The expected result of element g depends only on ``(g + rep) % m``, so it is a table lookup.
``rep`` (the check iteration) shifts the pattern so repeated checks use fresh data.

    >>> pattern = reduce_pattern("sum", 4, "int8")
    >>> pattern.modulus, pattern.expected
    (8, (6, 10, 14, 18, 22, 18, 14, 10))
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from vocab.collectives import get

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
    "int8": torch.int8,
    "uint8": torch.uint8,
}
"""Our dtype names to torch dtypes."""

EXACT_LIMIT: dict[str, int] = {
    "float32": 1 << 24,
    "float16": 1 << 11,
    "bfloat16": 1 << 8,
    "float64": 1 << 53,
    "int32": (1 << 31) - 1,
    "int64": (1 << 63) - 1,
    "int8": 127,
    "uint8": 255,
}
"""Largest integer up to which every integer is exactly representable in the dtype."""

PLAIN_MODULUS = 113
"""Period of the non-reducing pattern (fits int8 and bfloat16 exactly)."""

CORRUPT_ENV = "COMMBENCH_CORRUPT_RANK"
"""Debug: this rank alters one element of every result it checks, to prove checking works."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReducePattern:
    """Per-residue input values and expected reduced values of a reducing op."""

    redop: str
    """Reduction the pattern is built for."""
    modulus: int
    """Period m of the pattern in the element index."""
    values: tuple[int, ...]
    """``v``: rank r holds ``v[(k + r) % m]`` at residue k (avg adds ``d(r)``)."""
    expected: tuple[int, ...]
    """Reduced value at residue k."""
    exact: bool
    """Whether results must match exactly (False only for float avg off powers of two)."""


def _rank_counts(world_size: int, modulus: int) -> list[int]:
    """How many ranks r < n have ``r % m == t``, for each t."""
    return [(world_size - t + modulus - 1) // modulus for t in range(modulus)]


def _reduce_residues(redop: str, values: list[int], world_size: int) -> tuple[int, ...]:
    m = len(values)
    counts = _rank_counts(world_size, m)
    table = []
    for k in range(m):
        seen = [(values[(k + t) % m], c) for t, c in enumerate(counts) if c > 0]
        if redop == "sum":
            table.append(sum(v * c for v, c in seen))
        elif redop == "prod":
            table.append(math.prod(v**c for v, c in seen))
        elif redop == "min":
            table.append(min(v for v, _ in seen))
        else:
            table.append(max(v for v, _ in seen))
    return tuple(table)


def reduce_pattern(redop: str, world_size: int, dtype: str) -> ReducePattern:
    """The exactly-checkable input pattern of ``redop`` over ``world_size`` ranks in ``dtype``."""
    n, limit = world_size, EXACT_LIMIT[dtype]
    if redop == "avg":
        base = (1, 2, 3, 4) if 5 * n <= limit else (1,)  # (1,): every rank 1, the sum is n
        floating = dtype.startswith(("float", "bfloat"))
        exact = max(base) * n <= limit and (not floating or n & (n - 1) == 0)
        return ReducePattern(
            redop=redop, modulus=len(base), values=base, expected=base, exact=exact
        )
    if redop in ("min", "max"):
        values = list(range(8))
    elif redop == "prod":
        max_twos = int(math.log2(limit))
        values = _marks(max(2, math.ceil(n / max_twos)), 2, 1)
    else:
        fitting = [m for m in range(2, 9) if n * (m - 1) <= limit]
        values = list(range(max(fitting))) if fitting else _marks(math.ceil(n / limit), 1, 0)
    table = _reduce_residues(redop, values, n)
    return ReducePattern(
        redop=redop, modulus=len(values), values=tuple(values), expected=table, exact=True
    )


def _marks(modulus: int, mark: int, rest: int) -> list[int]:
    return [mark] + [rest] * (modulus - 1)


def _avg_offset(rank: int, world_size: int) -> int:
    if world_size % 2 == 1 and rank == world_size - 1:
        return 0
    return 1 if rank % 2 == 0 else -1


def _index(
    start: int, num_elems: int, rep: int, modulus: int, device: torch.device
) -> torch.Tensor:
    return (torch.arange(start, start + num_elems, device=device) + rep) % modulus


def reduce_input(
    pattern: ReducePattern, rank: int, world_size: int, num_elems: int, rep: int, out: torch.Tensor
) -> None:
    """Fill ``out`` (``num_elems`` elements) with rank ``rank``'s input of a reducing op."""
    m = pattern.modulus
    rank_values = [pattern.values[(k + rank) % m] for k in range(m)]
    if pattern.redop == "avg" and m > 1:
        rank_values = [v + _avg_offset(rank, world_size) for v in pattern.values]
    elif pattern.redop == "avg":
        rank_values = list(pattern.values)
    table = torch.tensor(rank_values, dtype=out.dtype, device=out.device)
    out.copy_(table[_index(0, num_elems, rep, m, out.device)])


def reduce_expected(
    pattern: ReducePattern, start: int, num_elems: int, rep: int, like: torch.Tensor
) -> torch.Tensor:
    """Expected reduced values of global elements ``start .. start + num_elems``."""
    table = torch.tensor(pattern.expected, dtype=like.dtype, device=like.device)
    return table[_index(start, num_elems, rep, pattern.modulus, like.device)]


def plain_values(
    owner: int, start: int, num_elems: int, rep: int, like: torch.Tensor
) -> torch.Tensor:
    """Rank ``owner``'s non-reducing data at global elements ``start .. start + num_elems``."""
    index = torch.arange(start, start + num_elems, device=like.device) + 3 * owner + rep
    return (index % PLAIN_MODULUS).to(like.dtype)


def fill_input(
    op: str, send: torch.Tensor, rank: int, world_size: int, rep: int, pattern: ReducePattern | None
) -> None:
    """Fill rank ``rank``'s send buffer of ``op`` for check iteration ``rep``."""
    num_elems = send.numel()
    if get(op).reduces:
        assert pattern is not None, "reducing ops need a pattern"
        reduce_input(pattern, rank, world_size, num_elems, rep, send)
    elif op == "all_gather":
        send.copy_(plain_values(rank, rank * num_elems, num_elems, rep, send))
    else:
        send.copy_(plain_values(rank, 0, num_elems, rep, send))


def expected_output(
    op: str,
    recv: torch.Tensor,
    rank: int,
    world_size: int,
    root: int,
    rep: int,
    pattern: ReducePattern | None,
) -> torch.Tensor | None:
    """What rank ``rank``'s receive buffer must hold, or None where nothing is defined."""
    num_elems = recv.numel()
    if get(op).reduces:
        assert pattern is not None, "reducing ops need a pattern"
        if op == "reduce" and rank != root:
            return None
        start = rank * num_elems if op == "reduce_scatter" else 0
        return reduce_expected(pattern, start, num_elems, rep, recv)
    if op == "all_gather":
        chunk = num_elems // world_size
        parts = [plain_values(s, s * chunk, chunk, rep, recv) for s in range(world_size)]
        return torch.cat(parts)
    if op == "all_to_all":
        chunk = num_elems // world_size
        parts = [plain_values(s, rank * chunk, chunk, rep, recv) for s in range(world_size)]
        return torch.cat(parts)
    owner = root if op == "broadcast" else (rank - 1) % world_size
    return plain_values(owner, 0, num_elems, rep, recv)


def count_wrong(
    result: torch.Tensor, expected: torch.Tensor | None, rank: int, *, ulps: int = 0
) -> int:
    """Elements of ``result`` off ``expected`` by more than ``ulps`` units (0: exact)."""
    if expected is None:
        return 0
    if os.environ.get(CORRUPT_ENV) == str(rank) and result.numel() > 0:
        result.view(-1)[0] += 1
    if ulps == 0:
        return int((result != expected).sum().item())
    tolerance = ulps * torch.finfo(result.dtype).eps * expected.abs().double()
    return int(((result.double() - expected.double()).abs() > tolerance).sum().item())
