"""Megatron's interleaved 1F1B (``forward_backward_pipelining_with_interleaving``).

Each rank runs ``v`` model chunks (virtual stages). Rank ``r`` runs ``2(p - r - 1) + (v - 1) g``
warmup forwards (``g`` = micro-batch group size, default ``p``), all of them if that reaches
``m v``; the (micro-batch, chunk) of each virtual micro-batch comes from Megatron's schedule
table. Sends and receives are async: a pass waits only for its own input. At its peak rank ``r``
holds the warmup chunks plus the first steady one (Korthikanti et al. 2022, Sec. 4.2.3).

    >>> [str(x) for x in interleaved(2, 2, 2)[1]]
    ['F0', 'F1', 'F0.c1', 'B0.c1', 'F1.c1', 'B1.c1', 'B0', 'B1']
"""

from __future__ import annotations

from collections.abc import Callable

from schedules.pipeline import Pass, RankOrder, check_pipeline_size
from schedules.pipeline_schedules.spec import PipelineSchedule, one_microbatch


def check_interleaved(p: int, m: int, v: int, group_size: int) -> None:
    """Megatron's constraints on an interleaved schedule (``ValueError`` naming the values)."""
    check_pipeline_size(p, m)
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


def virtual_passes(
    table: tuple[tuple[int, int], ...], v: int
) -> tuple[Callable[[int], Pass], Callable[[int], Pass]]:
    """The forward and the backward of virtual micro-batch ``k``: ``table[k]``, the backward's
    chunk reversed (``v - 1 - chunk``)."""

    def fwd(k: int) -> Pass:
        mb, chunk = table[k]
        return Pass(kind="F", microbatch=mb, chunk=chunk)

    def bwd(k: int) -> Pass:
        mb, chunk = table[k]
        return Pass(kind="B", microbatch=mb, chunk=v - 1 - chunk)

    return fwd, bwd


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
    fwd, bwd = virtual_passes(table, v)
    orders = []
    for r in range(p):
        warmup = warmup_interleaved(p, r, m, v, g)
        order = [fwd(k) for k in range(warmup)]
        for k in range(total - warmup):
            order += [fwd(k + warmup), bwd(k)]
        order += [bwd(k) for k in range(total - warmup, total)]
        orders.append(tuple(order))
    return tuple(orders)


def interleaved_in_flight_chunks(*, pp: int, vpp: int, stage: int, num_micro: int) -> int:
    """Model chunks (L/(p v) layers each) rank ``stage`` holds at its peak under interleaving.

    Megatron warm-up W = 2(p - r - 1) + (v - 1)p forward chunks, plus the one of the first steady
    step, capped at all m v chunks. On rank 0: pv + p - 1 chunks, i.e. L(1 + (p - 1)/(pv)) layers
    (Korthikanti et al. 2022, Sec. 4.2.3).
    """
    warmup = 2 * (pp - stage - 1) + (vpp - 1) * pp
    return min(warmup + 1, num_micro * vpp)


def check_interleaved_plan(*, pp: int, vpp: int, num_micro: int) -> None:
    """A plan's interleaved layout: pp > 1, vpp > 1, and m a multiple of pp with m >= pp."""
    if pp < 2 or vpp < 2:
        raise ValueError(f"schedule 'interleaved' needs pp > 1 and vpp > 1, got pp={pp}, vpp={vpp}")
    # Megatron (current): p <= g <= m and (m % g == 0 or m % g >= p) with g = p by default,
    # which reduces to m % p == 0 and m >= p.
    if num_micro % pp or num_micro < pp:
        raise ValueError(
            f"schedule 'interleaved' needs the micro-batch count to be a multiple of pp "
            f"(Megatron), got micro-batches={num_micro}, pp={pp}, vpp={vpp}"
        )


INTERLEAVED = PipelineSchedule(
    name="interleaved",
    orders=interleaved,
    in_flight_microbatches=interleaved_in_flight_chunks,
    virtual_stages=True,
    blocking_p2p=False,
    check=check_interleaved_plan,
    head_microbatches=one_microbatch,
)
"""Megatron's interleaved 1F1B."""
