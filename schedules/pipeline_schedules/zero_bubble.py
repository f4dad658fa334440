"""Zero-bubble ZB-H1 (sail-sg's quick implementation on Megatron): 1F1B with a split backward.

Ranks ``r > 0`` split each backward into ``Bi`` (input gradient, on the critical path) and ``W``
(weight gradient) and hold ``r`` W passes back to fill the cooldown bubble. The warmup is 1F1B's,
so the activations in flight are too: ``min(p - r, m)`` micro-batches.

    >>> [str(x) for x in zb_h1(2, 2)[1]]
    ['F0', 'Bi0', 'F1', 'Bi1', 'W0', 'W1']
"""

from __future__ import annotations

from collections import deque

from schedules.pipeline import Pass, RankOrder
from schedules.pipeline_schedules.one_f_one_b import in_flight_1f1b, one_f_one_b
from schedules.pipeline_schedules.spec import one_microbatch, single_chunk


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


ZB_H1 = single_chunk("zb-h1", zb_h1, in_flight=in_flight_1f1b, head_microbatches=one_microbatch)
"""Zero-bubble ZB-H1."""
