"""Timing of back-to-back collective calls, with per-iteration samples, combined across ranks.

nccl-tests times ``n`` back-to-back calls and divides; we do the same and also keep each
iteration's duration for min, median and p99 (nearest rank). On GPUs the marks are CUDA events
recorded between the calls on the current stream (they do not serialise the queue); on CPU,
where gloo calls block, they are ``time.perf_counter`` readings. A barrier precedes the loop.

    timing = time_calls(call, iters=20, warmup_iters=5, device=torch.device("cpu"))
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """Time per call of one (op, size, placement), in seconds."""

    mean_s: float
    """Total time of the timed loop / iterations (nccl-tests' time)."""
    min_s: float
    """Fastest iteration."""
    median_s: float
    """Median iteration."""
    p99_s: float
    """99th-percentile iteration (nearest rank)."""
    num_iters: int
    """Timed iterations."""


def percentile_nearest_rank(samples: Sequence[float], percent: float) -> float:
    """The nearest-rank percentile: the ceil(p/100 * N)-th smallest sample."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = max(math.ceil(percent / 100.0 * len(ordered)), 1)
    return ordered[rank - 1]


def summarize(marks_s: Sequence[float]) -> Timing:
    """Timing from ``iters + 1`` time marks taken before and after each call."""
    samples = [b - a for a, b in pairwise(marks_s)]
    return Timing(
        mean_s=(marks_s[-1] - marks_s[0]) / len(samples),
        min_s=min(samples),
        median_s=statistics.median(samples),
        p99_s=percentile_nearest_rank(samples, 99.0),
        num_iters=len(samples),
    )


def time_calls(
    call: Callable[[], None],
    *,
    iters: int,
    warmup_iters: int,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
) -> Timing:
    """Run ``warmup_iters`` untimed then ``iters`` timed back-to-back calls of ``call``."""
    for _ in range(warmup_iters):
        call()
    if device.type == "cuda":
        return _time_cuda(call, iters, group)
    dist.barrier(group=group)
    clock = time.perf_counter
    marks = [clock()]
    for _ in range(iters):
        call()
        marks.append(clock())
    return summarize(marks)


def _time_cuda(call: Callable[[], None], iters: int, group: dist.ProcessGroup | None) -> Timing:
    torch.cuda.synchronize()
    dist.barrier(group=group)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    events[0].record()
    for i in range(iters):
        call()
        events[i + 1].record()
    torch.cuda.synchronize()
    marks_ms = [0.0] + [events[0].elapsed_time(e) for e in events[1:]]
    return summarize([m / 1e3 for m in marks_ms])


def combine(timing: Timing, average: int, group: dist.ProcessGroup | None = None) -> Timing:
    """Combine every rank's timing per ``-a``: 0 rank 0's, 1 mean, 2 min, 3 max (each statistic)."""
    stats = torch.tensor(
        [timing.mean_s, timing.min_s, timing.median_s, timing.p99_s], dtype=torch.float64
    )
    if average == 0:
        dist.broadcast(stats, src=0, group=group)
    elif average == 1:
        dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
        stats /= dist.get_world_size(group)
    else:
        op = dist.ReduceOp.MIN if average == 2 else dist.ReduceOp.MAX
        dist.all_reduce(stats, op=op, group=group)
    mean_s, min_s, median_s, p99_s = stats.tolist()
    return Timing(
        mean_s=mean_s, min_s=min_s, median_s=median_s, p99_s=p99_s, num_iters=timing.num_iters
    )
