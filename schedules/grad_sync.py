"""How a rank of a pipeline program reduces its gradients over data parallelism (``GradSync``).

Each data-parallel kind that runs in pipeline programs (``schedules.data_parallel``) says how its
framework syncs (torch DDP buckets, Megatron's distributed optimizer, DeepSpeed ZeRO-1/2);
``schedules.pipeline_program`` turns that into collectives.

    GradSync(op="reduce_scatter", param_gather="after_step")
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class GradSync:
    """How and when a rank reduces its gradients over data parallelism."""

    op: str = "all_reduce"
    """``all_reduce`` or ``reduce_scatter``; empty for no DP sync (dp = 1)."""
    bucketed: bool = True
    """Buckets fire as they become ready during the backward (else one call after it)."""
    every_microbatch: bool = False
    """Sync on every micro-batch (ZeRO-2) instead of only the last one per chunk."""
    at_end: bool = False
    """Issue every chunk's sync after the whole schedule (Megatron without overlap)."""
    depth_one: bool = False
    """Compute waits for the previous bucket when the next one is issued (DeepSpeed overlap)."""
    blocking: bool = False
    """Compute waits for every bucket right away (DeepSpeed without overlap_comm)."""
    param_gather: str = ""
    """Parameter all-gather: ``""`` none, ``after_step``, or ``overlapped`` (with the next
    forward: issued at the step's start, each chunk's first forward waits for it)."""
