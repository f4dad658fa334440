"""Megatron's non-interleaved 1F1B (``forward_backward_pipelining_without_interleaving``).

Rank ``r`` runs ``min(p - r - 1, m)`` warmup forwards, then one forward and one backward per
step, then the remaining backwards; a pass's sends and the next pass's receive form one blocking
batch. At its peak rank ``r`` holds the warmup forwards plus the first steady one: ``min(p - r,
m)`` micro-batches, worst on rank 0.

    >>> [str(x) for x in one_f_one_b(2, 3)[1]]
    ['F0', 'B0', 'F1', 'B1', 'F2', 'B2']
"""

from __future__ import annotations

from schedules.pipeline import Pass, RankOrder, check_pipeline_size
from schedules.pipeline_schedules.spec import one_microbatch, single_chunk


def warmup_1f1b(p: int, r: int, m: int) -> int:
    """Megatron's 1F1B warmup forwards on rank ``r``: ``min(p - r - 1, m)``."""
    return min(p - r - 1, m)


def one_f_one_b(p: int, m: int) -> tuple[RankOrder, ...]:
    """Non-interleaved 1F1B (Megatron ``forward_backward_pipelining_without_interleaving``)."""
    check_pipeline_size(p, m)
    orders = []
    for r in range(p):
        warmup = warmup_1f1b(p, r, m)
        order = [Pass(kind="F", microbatch=i) for i in range(warmup)]
        for i in range(m - warmup):
            order += [Pass(kind="F", microbatch=warmup + i), Pass(kind="B", microbatch=i)]
        order += [Pass(kind="B", microbatch=i) for i in range(m - warmup, m)]
        orders.append(tuple(order))
    return tuple(orders)


def in_flight_1f1b(*, pp: int, vpp: int, stage: int, num_micro: int) -> int:
    """Warmup forwards plus the first steady one, ``min(p - r, m)``; ``vpp`` is 1."""
    return min(pp - stage, num_micro)


ONE_F_ONE_B = single_chunk(
    "1f1b", one_f_one_b, in_flight=in_flight_1f1b, head_microbatches=one_microbatch
)
"""Megatron's non-interleaved 1F1B."""
