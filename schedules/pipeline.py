"""Pipeline-parallel orderings: which pass each pipeline rank runs next, as the frameworks do it.

A pass is a forward ``F``, a full backward ``B``, or a zero-bubble split backward: ``Bi`` (input
gradient, on the critical path) and ``W`` (weight gradient, deferrable). Every schedule is a pure
function returning, per pipeline rank, the ordered tuple of passes (kind, micro-batch, chunk):

- ``one_f_one_b``: Megatron's non-interleaved 1F1B, warmup ``min(p - r - 1, m)`` forwards.
- ``interleaved``: Megatron's interleaved 1F1B with ``v`` model chunks per rank, warmup
  ``2(p - r - 1) + (v - 1) g`` (``g`` = micro-batch group size, default ``p``), all-warmup if
  that reaches ``m v``; micro-batch/chunk order from Megatron's schedule table.
- ``gpipe``: torch.distributed.pipelining's GPipe: every forward, then every backward.
- ``zb_h1``: zero-bubble ZB-H1 (sail-sg quick implementation): 1F1B with the backward split on
  ranks r > 0 and each rank holding back ``r`` weight-gradient passes to fill its cooldown.

    >>> [str(x) for x in one_f_one_b(2, 3)[1]]
    ['F0', 'B0', 'F1', 'B1', 'F2', 'B2']
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

PASS_KINDS = ("F", "B", "Bi", "W")
"""Forward, full backward, input-gradient backward, weight-gradient backward."""

SCHEDULES = ("1f1b", "interleaved", "gpipe", "zb-h1")
"""Pipeline schedule names accepted in a plan's ``parallel.schedule``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pass:
    """One forward or backward pass of one micro-batch through one model chunk of a rank."""

    kind: str
    """One of ``PASS_KINDS``."""
    microbatch: int
    """Micro-batch index, 0-based."""
    chunk: int = 0
    """Model chunk (virtual stage index on this rank), 0-based; 0 without interleaving."""

    def __str__(self) -> str:
        suffix = f".c{self.chunk}" if self.chunk else ""
        return f"{self.kind}{self.microbatch}{suffix}"


RankOrder = tuple[Pass, ...]
"""The ordered passes of one pipeline rank."""


def _check(p: int, m: int) -> None:
    if p < 1:
        raise ValueError(f"pipeline size p must be >= 1, got {p}")
    if m < 1:
        raise ValueError(f"number of micro-batches m must be >= 1, got {m}")


def warmup_1f1b(p: int, r: int, m: int) -> int:
    """Megatron's 1F1B warmup forwards on rank ``r``: ``min(p - r - 1, m)``."""
    return min(p - r - 1, m)


def one_f_one_b(p: int, m: int) -> tuple[RankOrder, ...]:
    """Non-interleaved 1F1B (Megatron ``forward_backward_pipelining_without_interleaving``)."""
    _check(p, m)
    orders = []
    for r in range(p):
        warmup = warmup_1f1b(p, r, m)
        order = [Pass(kind="F", microbatch=i) for i in range(warmup)]
        for i in range(m - warmup):
            order += [Pass(kind="F", microbatch=warmup + i), Pass(kind="B", microbatch=i)]
        order += [Pass(kind="B", microbatch=i) for i in range(m - warmup, m)]
        orders.append(tuple(order))
    return tuple(orders)


def gpipe(p: int, m: int) -> tuple[RankOrder, ...]:
    """GPipe (torch ``ScheduleGPipe``): all forwards, then all backwards in the same order."""
    _check(p, m)
    order = tuple(Pass(kind="F", microbatch=i) for i in range(m)) + tuple(
        Pass(kind="B", microbatch=i) for i in range(m)
    )
    return tuple(order for _ in range(p))


def zb_h1(p: int, m: int) -> tuple[RankOrder, ...]:
    """ZB-H1: 1F1B order; rank r > 0 splits B into Bi + W and keeps ``r`` W passes deferred.

    After the backward of micro-batch ``k >= r`` the oldest deferred W runs; the last ``r`` run
    after the final backward, in the cooldown bubble. Rank 0 never splits.
    """
    orders = []
    for r, base in enumerate(one_f_one_b(p, m)):
        if r == 0:
            orders.append(base)
            continue
        order: list[Pass] = []
        deferred: deque[int] = deque()
        for step in base:
            if step.kind == "F":
                order.append(step)
                continue
            order.append(Pass(kind="Bi", microbatch=step.microbatch))
            deferred.append(step.microbatch)
            if step.microbatch >= r:
                order.append(Pass(kind="W", microbatch=deferred.popleft()))
        order += [Pass(kind="W", microbatch=k) for k in deferred]
        orders.append(tuple(order))
    return tuple(orders)


def check_interleaved(p: int, m: int, v: int, group_size: int) -> None:
    """Megatron's constraints on an interleaved schedule (``ValueError`` naming the values)."""
    _check(p, m)
    if v < 2:
        raise ValueError(f"interleaved schedule needs vpp >= 2 model chunks per rank, got {v}")
    if not p <= group_size <= m:
        raise ValueError(
            f"interleaved schedule needs pp <= microbatch group size <= micro-batches, got "
            f"pp={p}, group size={group_size}, micro-batches={m}"
        )
    if m % group_size != 0 and m % group_size < p:
        raise ValueError(
            f"interleaved schedule needs micro-batches % group size == 0 or >= pp, got "
            f"micro-batches={m}, group size={group_size}, pp={p}"
        )


def schedule_table(m: int, v: int, group_size: int) -> tuple[tuple[int, int], ...]:
    """Megatron's ``get_schedule_table``: (micro-batch, chunk) per virtual micro-batch id.

    Micro-batches are walked in groups of ``group_size`` (the last group takes the remainder);
    within a group every chunk runs every micro-batch of the group before the next chunk.
    """
    table: list[tuple[int, int]] = []
    for first in range(0, m, group_size):
        last = m if first + group_size >= m else first + group_size
        table += [(mb, chunk) for chunk in range(v) for mb in range(first, last)]
    return tuple(table)


def warmup_interleaved(p: int, r: int, m: int, v: int, group_size: int | None = None) -> int:
    """Interleaved warmup forwards on rank ``r``: ``2(p - r - 1) + (v - 1) g``, at most ``m v``."""
    g = p if group_size is None else group_size
    return min(2 * (p - r - 1) + (v - 1) * g, m * v)


def interleaved(p: int, m: int, v: int, group_size: int | None = None) -> tuple[RankOrder, ...]:
    """Interleaved 1F1B (Megatron ``forward_backward_pipelining_with_interleaving``).

    Forward virtual id ``k`` runs ``table[k]``; backward virtual id ``k`` runs ``table[k]`` with
    the chunk reversed (``v - 1 - chunk``). Steady step ``k`` is F(k + warmup) then B(k).
    """
    g = p if group_size is None else group_size
    check_interleaved(p, m, v, g)
    table = schedule_table(m, v, g)
    total = m * v

    def fwd(k: int) -> Pass:
        mb, chunk = table[k]
        return Pass(kind="F", microbatch=mb, chunk=chunk)

    def bwd(k: int) -> Pass:
        mb, chunk = table[k]
        return Pass(kind="B", microbatch=mb, chunk=v - 1 - chunk)

    orders = []
    for r in range(p):
        warmup = warmup_interleaved(p, r, m, v, g)
        order = [fwd(k) for k in range(warmup)]
        for k in range(total - warmup):
            order += [fwd(k + warmup), bwd(k)]
        order += [bwd(k) for k in range(total - warmup, total)]
        orders.append(tuple(order))
    return tuple(orders)


def pipeline_orders(
    schedule: str, p: int, m: int, v: int = 1, group_size: int | None = None
) -> tuple[RankOrder, ...]:
    """Per-rank pass orders for a schedule name in ``SCHEDULES``.

    With ``p == 1`` every schedule is forward then backward per micro-batch (no pipelining).
    """
    builders: dict[str, Callable[[int, int], tuple[RankOrder, ...]]] = {
        "1f1b": one_f_one_b,
        "gpipe": gpipe,
        "zb-h1": zb_h1,
    }
    if schedule == "interleaved":
        return interleaved(p, m, v, group_size)
    if schedule not in builders:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    if v != 1:
        raise ValueError(f"schedule {schedule!r} takes vpp=1, got vpp={v}; use 'interleaved'")
    return builders[schedule](p, m)


def passes_per_kind(order: RankOrder) -> dict[str, int]:
    """How many passes of each kind an order holds (a quick consistency check)."""
    counts = dict.fromkeys(PASS_KINDS, 0)
    for step in order:
        counts[step.kind] += 1
    return counts


def max_in_flight(order: RankOrder) -> int:
    """Peak number of micro-batch chunks whose forward ran and whose backward has not (memory)."""
    live = peak = 0
    for step in order:
        if step.kind == "F":
            live += 1
            peak = max(peak, live)
        elif step.kind in ("B", "Bi"):
            live -= 1
    return peak
