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

from collections.abc import Hashable, Mapping

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


def class_ranks(layout: Layout, signatures: Mapping[int, Hashable]) -> tuple[int, ...]:
    """One rank per class of ranks that a what-if cannot tell apart.

    ``signatures`` says how the what-if treats a rank (ranks not in it are treated alike). Two
    tp ranks are interchangeable when, at every pipeline, cp and dp rank, the ranks with them
    are treated alike (their columns of the signature grid match), and likewise two dp ranks;
    a class is a pipeline rank, a cp rank, a set of interchangeable tp ranks and one of dp
    ranks, simulated by its lowest tp and dp ranks. Every TP, DP, DPxCP, TPxPP and world group
    of a simulated rank then holds exactly the simulated ranks of the classes it meets, so the
    members that are not simulated behave as the simulated ones of their class (under the
    analytical network model, which times a collective on its full group). The expert and HSDP
    groups are slices of the dp axis that these classes do not follow: ``whatif_ranks``
    simulates every rank there.
    """

    def sign(t: int, d: int, p: int, c: int) -> Hashable:
        return signatures.get(layout.rank(tp=t, cp=c, dp=d, pp=p))

    outer = [(p, c) for p in range(layout.pp) for c in range(layout.cp)]
    columns: dict[tuple[Hashable, ...], int] = {}
    for t in range(layout.tp):
        key = tuple(sign(t, d, p, c) for p, c in outer for d in range(layout.dp))
        columns.setdefault(key, t)
    rows: dict[tuple[Hashable, ...], int] = {}
    for d in range(layout.dp):
        key = tuple(sign(t, d, p, c) for p, c in outer for t in range(layout.tp))
        rows.setdefault(key, d)
    return tuple(
        sorted(
            layout.rank(tp=t, cp=c, dp=d, pp=p)
            for p, c in outer
            for t in columns.values()
            for d in rows.values()
        )
    )
