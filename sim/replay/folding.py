"""Symmetric-rank folding: simulate one representative per (pipeline rank, cp rank).

In a dense plan every TP peer and every DP replica of a pipeline stage runs the same program on
the same sizes: the same passes in the same order, collectives on groups of the same shape. Under
the analytical network model a collective's time depends only on its group, so all members of a
TP or DP group reach it and finish it at the same instants. Simulating one member (tp rank 0,
dp rank 0) per pipeline stage and cp rank therefore gives the same timeline: the engine does not
wait for unsimulated members, and ``CommModel`` still times each collective on the full group's
global ranks. CP ranks are kept because they exchange K/V with each other every layer, and
pipeline ranks because they differ (embedding, head, warmup). Under ``flow`` fidelity the
replicas' concurrent traffic is what folding leaves out.

    ranks = representative_ranks(Layout(tp=8, dp=128, pp=16))   # 16 ranks instead of 16,384
"""

from __future__ import annotations

from schedules.layout import Layout


def representative_of(layout: Layout, rank: int) -> int:
    """The simulated rank standing for ``rank``: same pipeline and cp rank, tp = dp = 0."""
    coords = layout.coords(rank)
    return layout.rank(pp=coords["pp"], cp=coords["cp"])


def representative_ranks(layout: Layout) -> tuple[int, ...]:
    """One rank per (pipeline rank, cp rank), in rank order."""
    return tuple(
        sorted({layout.rank(pp=r, cp=c) for r in range(layout.pp) for c in range(layout.cp)})
    )


def simulated_ranks(layout: Layout, *, fold: bool) -> tuple[int, ...]:
    """The ranks a replay simulates: the representatives with ``fold``, else every rank."""
    return representative_ranks(layout) if fold else tuple(range(layout.world_size))


def folded_away(layout: Layout) -> int:
    """How many ranks folding leaves unsimulated."""
    return layout.world_size - len(representative_ranks(layout))
