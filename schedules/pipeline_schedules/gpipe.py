"""GPipe (torch.distributed.pipelining ``ScheduleGPipe``): every forward, then every backward.

Every rank holds all ``m`` micro-batches' activations (and the last stage all their head inputs)
when its forwards end; point-to-point is blocking as in the 1F1B path.

    >>> [str(x) for x in gpipe(2, 2)[0]]
    ['F0', 'F1', 'B0', 'B1']
"""

from __future__ import annotations

from schedules.pipeline import Pass, RankOrder, check_pipeline_size
from schedules.pipeline_schedules.spec import PipelineSchedule, check_one_chunk, require_one_chunk


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


def _orders(p: int, m: int, v: int, group_size: int | None) -> tuple[RankOrder, ...]:
    require_one_chunk("gpipe", v)
    return gpipe(p, m)


def _check(*, pp: int, vpp: int, num_micro: int) -> None:
    check_one_chunk("gpipe", vpp)


GPIPE = PipelineSchedule(
    name="gpipe",
    orders=_orders,
    in_flight_microbatches=in_flight_gpipe,
    virtual_stages=False,
    blocking_p2p=True,
    check=_check,
    head_microbatches=all_microbatches,
)
"""torch's GPipe."""
