"""Pipeline schedules by plan name: one module per schedule, each defining a ``PipelineSchedule``.

A schedule keeps its pass orders, activations in flight, point-to-point mode, plan checks and
head-memory factor in its own module (``one_f_one_b``, ``interleaved``, ``gpipe``,
``zero_bubble``); callers look it up here instead of comparing names. Adding a schedule means
one module and one entry in ``SCHEDULES``.

    orders = pipeline_orders("1f1b", p=4, m=8)
"""

from __future__ import annotations

from schedules.pipeline import RankOrder
from schedules.pipeline_schedules.gpipe import GPIPE
from schedules.pipeline_schedules.interleaved import INTERLEAVED
from schedules.pipeline_schedules.one_f_one_b import ONE_F_ONE_B
from schedules.pipeline_schedules.spec import PipelineSchedule
from schedules.pipeline_schedules.zero_bubble import ZB_H1

SCHEDULES: dict[str, PipelineSchedule] = {
    spec.name: spec for spec in (ONE_F_ONE_B, INTERLEAVED, GPIPE, ZB_H1)
}
"""Pipeline schedules by the name a plan's ``parallel.schedule`` gives (in the order listed)."""


def pipeline_schedule(name: str) -> PipelineSchedule:
    """The schedule called ``name`` (``ValueError`` listing the valid names otherwise)."""
    spec = SCHEDULES.get(name)
    if spec is None:
        raise ValueError(f"unknown pipeline schedule {name!r}; valid: {', '.join(SCHEDULES)}")
    return spec


def pipeline_orders(
    schedule: str, p: int, m: int, v: int = 1, group_size: int | None = None
) -> tuple[RankOrder, ...]:
    """Per-rank pass orders for a schedule name in ``SCHEDULES``.

    With ``p == 1`` every schedule is forward then backward per micro-batch (no pipelining).
    """
    return pipeline_schedule(schedule).orders(p, m, v, group_size)
