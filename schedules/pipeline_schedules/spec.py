"""What one pipeline schedule contributes: pass orders, activations in flight, checks, p2p mode.

Each schedule module (``one_f_one_b``, ``interleaved``, ``gpipe``, ``zero_bubble``) defines one
``PipelineSchedule``; ``schedules.pipeline_schedules`` finds it by its plan name. The helpers
here are the checks the single-chunk schedules share.

    orders = pipeline_schedule("1f1b").orders(4, 8, 1, None)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from schedules.pipeline import RankOrder


class Orders(Protocol):
    """Per-rank pass orders for ``p`` ranks, ``m`` micro-batches, ``v`` chunks per rank."""

    def __call__(self, p: int, m: int, v: int, group_size: int | None) -> tuple[RankOrder, ...]:
        """The orders; ``group_size`` is Megatron's micro-batch group (None: ``p``)."""
        ...


class InFlight(Protocol):
    """Activations a pipeline rank holds at its peak, counted in micro-batches (or chunks)."""

    def __call__(self, *, pp: int, vpp: int, stage: int, num_micro: int) -> int:
        """The count on rank ``stage``."""
        ...


class Check(Protocol):
    """A plan's constraints on the pipeline degrees (``ValueError`` naming the values)."""

    def __call__(self, *, pp: int, vpp: int, num_micro: int) -> None:
        """Raise on a layout the schedule cannot run."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineSchedule:
    """One pipeline schedule, everything the plan, memory and replay need of it."""

    name: str
    """The plan's ``parallel.schedule`` value."""
    orders: Orders
    """Per-rank pass orders ``(p, m, vpp, group_size)``; ``ValueError`` on a bad size or vpp."""
    in_flight_microbatches: InFlight
    """Micro-batches whose activations a rank holds at its peak (chunks if ``virtual_stages``)."""
    virtual_stages: bool
    """Whether a rank runs ``vpp`` model chunks, each ``1 / vpp`` of its layers."""
    blocking_p2p: bool
    """Whether sends and receives block (Megatron's batched exchange) rather than run async."""
    check: Check
    """The plan's constraints on ``pp``, ``vpp`` and the micro-batch count."""
    head_microbatches: Callable[[int], int]
    """Micro-batches whose LM-head inputs the last stage holds at once, of ``num_micro``."""


def one_microbatch(num_micro: int) -> int:
    """One micro-batch at a time: its backward runs before the next forward reaches the head."""
    return 1


def require_one_chunk(schedule: str, vpp: int) -> None:
    """A single-chunk schedule's orders take ``vpp == 1`` (``ValueError`` otherwise)."""
    if vpp != 1:
        raise ValueError(f"schedule {schedule!r} takes vpp=1, got vpp={vpp}; use 'interleaved'")


def check_one_chunk(schedule: str, vpp: int) -> None:
    """A plan with ``vpp > 1`` needs the interleaved schedule (``ValueError`` otherwise)."""
    if vpp > 1:
        raise ValueError(f"vpp={vpp} > 1 needs schedule 'interleaved', got schedule={schedule!r}")


def single_chunk(
    name: str,
    build: Callable[[int, int], tuple[RankOrder, ...]],
    *,
    in_flight: InFlight,
    head_microbatches: Callable[[int], int],
) -> PipelineSchedule:
    """A schedule of one model chunk per rank with blocking point-to-point: orders from
    ``build(p, m)``; ``vpp > 1`` refused in the plan and in the orders."""

    def orders(p: int, m: int, v: int, group_size: int | None) -> tuple[RankOrder, ...]:
        require_one_chunk(name, v)
        return build(p, m)

    def check(*, pp: int, vpp: int, num_micro: int) -> None:
        check_one_chunk(name, vpp)

    return PipelineSchedule(
        name=name,
        orders=orders,
        in_flight_microbatches=in_flight,
        virtual_stages=False,
        blocking_p2p=True,
        check=check,
        head_microbatches=head_microbatches,
    )
