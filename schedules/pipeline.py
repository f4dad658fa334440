"""Pipeline-parallel passes: what each pipeline rank runs, and the helpers every schedule shares.

A pass is a forward ``F``, a full backward ``B``, a zero-bubble split backward: ``Bi`` (input
gradient, on the critical path) and ``W`` (weight gradient, deferrable), or ``FB``: a forward and
another micro-batch's backward run as one pass, layer by layer, so that each one's
expert-parallel all-to-alls hide behind the other's compute (Megatron-Core's combined 1F1B,
``schedules.pipeline_schedules.a2a_overlap``). A schedule is a pure
function returning, per pipeline rank, the ordered tuple of passes (kind, micro-batch, chunk);
each lives in its own module of ``schedules.pipeline_schedules`` (1F1B, interleaved, GPipe,
ZB-H1), found by name there.

    >>> str(Pass(kind="B", microbatch=3, chunk=1))
    'B3.c1'
"""

from __future__ import annotations

from dataclasses import dataclass

SINGLE_PASS_KINDS = ("F", "B", "Bi", "W")
"""Forward, full backward, input-gradient backward, weight-gradient backward."""
PASS_KINDS = (*SINGLE_PASS_KINDS, "FB")
"""The single kinds and ``FB``, a forward combined with a backward."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pass:
    """One forward or backward pass of one micro-batch through one model chunk of a rank."""

    kind: str
    """One of ``PASS_KINDS``."""
    microbatch: int
    """Micro-batch index, 0-based."""
    chunk: int = 0
    """Model chunk (virtual stage index on this rank), 0-based; 0 without interleaving."""
    paired: Pass | None = None
    """Of an ``FB`` pass, the backward it runs (``microbatch`` and ``chunk`` are its forward's)."""

    def __str__(self) -> str:
        suffix = f".c{self.chunk}" if self.chunk else ""
        if self.kind == "FB" and self.paired is not None:
            return f"F{self.microbatch}{suffix}+{self.paired}"
        return f"{self.kind}{self.microbatch}{suffix}"

    @property
    def forward(self) -> Pass | None:
        """The forward this pass runs: itself (``F``), its forward half (``FB``), or None."""
        if self.kind == "F":
            return self
        if self.kind == "FB":
            return Pass(kind="F", microbatch=self.microbatch, chunk=self.chunk)
        return None

    @property
    def backward(self) -> Pass | None:
        """The backward this pass runs (``B``, ``Bi``, ``W`` or an ``FB``'s half), or None."""
        if self.kind == "FB":
            return self.paired
        return None if self.kind == "F" else self


RankOrder = tuple[Pass, ...]
"""The ordered passes of one pipeline rank."""


def check_pipeline_size(p: int, m: int) -> None:
    """At least one pipeline rank and one micro-batch (``ValueError`` naming the value)."""
    if p < 1:
        raise ValueError(f"pipeline size p must be >= 1, got {p}")
    if m < 1:
        raise ValueError(f"number of micro-batches m must be >= 1, got {m}")


def passes_per_kind(order: RankOrder) -> dict[str, int]:
    """How many passes of each kind an order holds (a quick consistency check); a combined
    ``FB`` pass counts as its forward and its backward."""
    counts = dict.fromkeys(SINGLE_PASS_KINDS, 0)
    for step in order:
        for half in (step.forward, step.backward):
            if half is not None:
                counts[half.kind] += 1
    return counts


def max_in_flight(order: RankOrder) -> int:
    """Peak number of micro-batch chunks whose forward ran and whose backward has not (memory)."""
    live = peak = 0
    for step in order:
        if step.kind in ("F", "FB"):  # a combined pass's forward starts before its backward ends
            live += 1
            peak = max(peak, live)
        if step.kind in ("B", "Bi", "FB"):
            live -= 1
    return peak
