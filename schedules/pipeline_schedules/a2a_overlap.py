"""Megatron-Core's combined 1F1B: expert-parallel all-to-alls hidden behind another micro-batch.

With ``--overlap-moe-expert-parallel-comm`` (``parallel.overlap_moe_expert_parallel_comm``)
Megatron-Core runs each steady-state forward and backward of a rank as one pass
(``combined_1f1b.py``, ``model_chunk_schedule_plan.py``): layer by layer, the forward of one
micro-batch and the backward of another, each one's token dispatch and combine on a
communication stream beside the other's compute (``sim.replay.recipes.combined_recipe``).
Which passes pair up (``pipeline_parallel/schedules.py``):

- without pipelining (``combined_1f1b_schedule_for_no_pipelining``): the first micro-batch's
  forward alone, then each backward with the next micro-batch's forward, then the last backward
  alone;
- interleaved (``combined_1f1b_schedule_for_interleaved_pipelining``): one more warmup forward
  than the interleaved schedule runs (``get_pp_rank_microbatches``: "so that the forward and
  backward computations are independent in all 1f1b steps"), then each steady step's forward
  (virtual micro-batch k + warmup) with its backward (k) as one pass;
- other pipeline schedules: refused by Megatron (PP needs virtual stages), and here.

    >>> [str(x) for x in combined_1f1b(1, 3, 1)[0]]
    ['F0', 'F1+B0', 'F2+B1', 'B2']
"""

from __future__ import annotations

from schedules.pipeline import Pass, RankOrder, check_pipeline_size
from schedules.pipeline_schedules.interleaved import (
    check_interleaved,
    schedule_table,
    virtual_passes,
    warmup_interleaved,
)

EXTRA_WARMUP = 1
"""Forwards Megatron-Core adds to a rank's warmup under the combined schedule."""


def combined_1f1b(p: int, m: int, v: int, group_size: int | None = None) -> tuple[RankOrder, ...]:
    """Per-rank orders of the combined schedule: ``p == 1`` without pipelining (``v`` must be
    1), else interleaved 1F1B (``v >= 2``) with one more warmup forward; each steady forward and
    backward become one ``FB`` pass."""
    if p == 1:
        check_pipeline_size(p, m)
        if v != 1:
            raise ValueError(f"vpp={v} without pipelining (pp=1): nothing to interleave")
        table: tuple[tuple[int, int], ...] = tuple((mb, 0) for mb in range(m))
        warmups = [min(EXTRA_WARMUP, m)]
    else:
        g = p if group_size is None else group_size
        check_interleaved(p, m, v, g)
        table = schedule_table(m, v, g)
        warmups = [min(warmup_interleaved(p, r, m, v, g) + EXTRA_WARMUP, m * v) for r in range(p)]
    total = len(table)
    fwd, bwd = virtual_passes(table, v)
    orders = []
    for warmup in warmups:
        order = [fwd(k) for k in range(warmup)]
        for k in range(total - warmup):
            f = fwd(k + warmup)
            order.append(Pass(kind="FB", microbatch=f.microbatch, chunk=f.chunk, paired=bwd(k)))
        order += [bwd(k) for k in range(total - warmup, total)]
        orders.append(tuple(order))
    return tuple(orders)


COMBINED_EXTRA_LAYERS = 1
"""Layers of activations a rank holds at its peak beyond the schedule the combined one
replaces: its extra warmup forward leaves one more chunk in flight as the first combined pass
starts, where the plain schedule's steady forward would add its chunk; the combined pass then
frees the backward's layers one by one as it adds the forward's (``ScheduleNode`` releases each
layer's state after its backward), so the forward's first layer comes on top of them."""


def combined_in_flight_chunks(*, pp: int, vpp: int, stage: int, num_micro: int) -> int:
    """Model chunks in flight at some point of rank ``stage``'s combined order, counting each
    combined pass's forward before its backward (``schedules.pipeline.max_in_flight``): one
    more than the schedule it replaces (its extra warmup forward), capped at every chunk. The
    memory it takes is smaller (``COMBINED_EXTRA_LAYERS``)."""
    if pp == 1:
        return min(EXTRA_WARMUP + 1, num_micro)
    warmup = 2 * (pp - stage - 1) + (vpp - 1) * pp + EXTRA_WARMUP
    return min(warmup + 1, num_micro * vpp)


def check_combined(*, schedule: str, pp: int, vpp: int) -> None:
    """The layouts Megatron-Core runs the combined schedule with: no pipelining, or the
    interleaved schedule with virtual stages."""
    if pp > 1 and (schedule != "interleaved" or vpp < 2):
        raise ValueError(
            f"parallel.overlap_moe_expert_parallel_comm with pp={pp}, schedule {schedule}, "
            f"vpp={vpp}: Megatron-Core runs it without pipelining or on the interleaved schedule "
            "with virtual stages (vpp >= 2)"
        )
