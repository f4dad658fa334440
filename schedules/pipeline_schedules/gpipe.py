"""GPipe (torch.distributed.pipelining ``ScheduleGPipe``): every forward, then every backward.

Every rank holds all ``m`` micro-batches' activations (and the last stage all their head inputs)
when its forwards end; point-to-point is blocking as in the 1F1B path.

    >>> [str(x) for x in gpipe(2, 2)[0]]
    ['F0', 'F1', 'B0', 'B1']
"""

from __future__ import annotations

from schedules.pipeline import Pass, RankOrder, check_pipeline_size
from schedules.pipeline_schedules.spec import single_chunk


def gpipe(p: int, m: int) -> tuple[RankOrder, ...]:
    """GPipe (torch ``ScheduleGPipe``): all forwards, then all backwards in the same order."""
    check_pipeline_size(p, m)
    order = tuple(Pass(kind="F", microbatch=i) for i in range(m)) + tuple(
        Pass(kind="B", microbatch=i) for i in range(m)
    )
    return tuple(order for _ in range(p))


def in_flight_gpipe(*, pp: int, vpp: int, stage: int, num_micro: int) -> int:
    """All ``m`` micro-batches, on every rank."""
    return num_micro


def all_microbatches(num_micro: int) -> int:
    """Every micro-batch's head inputs live until the backwards start."""
    return num_micro


GPIPE = single_chunk("gpipe", gpipe, in_flight=in_flight_gpipe, head_microbatches=all_microbatches)
"""torch's GPipe."""
