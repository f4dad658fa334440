"""torch DistributedDataParallel (and Megatron's DDP): every rank keeps every state and
all-reduces its gradients in reverse-order buckets while the backward runs.

Buckets: ``bucket_cap_mb`` (25 MiB) after a first bucket of 1 MiB (``ddp_first_bucket_mb``);
``gradient_as_bucket_view`` drops the gradients' copy into the buckets (schedule_semantics §3).

    DDP.buckets(plan.parallel, 0, 0, 1e9)
"""

from __future__ import annotations

from schedules.buckets import MIB, split_buckets
from schedules.data_parallel.spec import DataParallelKind
from schedules.grad_sync import GradSync
from schedules.params import PARAM_BYTES, stage_params_per_gpu
from schedules.plan import ParallelConfig, Plan


def _buckets(parallel: ParallelConfig, stage: int, chunk: int, total: float) -> tuple[float, ...]:
    knob = f"parallel.ddp_bucket_mb={parallel.ddp_bucket_mb}"
    cap, first = parallel.ddp_bucket_mb * MIB, parallel.ddp_first_bucket_mb * MIB
    return split_buckets(total, cap, first, knob=knob)


def _grad_sync(parallel: ParallelConfig) -> GradSync:
    # torch DDP always overlaps; Megatron's DDP without --overlap-grad-reduce (and its 2021
    # local DDP) all-reduces every gradient once, after the whole backward.
    overlap = parallel.overlap_grad_reduce
    return GradSync(op="all_reduce", bucketed=overlap, at_end=not overlap)


def _transient_buffer_bytes(plan: Plan, stage: int) -> float:
    """The buckets' copy of every gradient, unless the gradients are views into them (or there
    is no replica to reduce with: a one-GPU loop runs without DDP)."""
    if plan.parallel.ddp_gradient_as_bucket_view or plan.parallel.dp * plan.parallel.cp <= 1:
        return 0.0
    return stage_params_per_gpu(plan, stage) * PARAM_BYTES


DDP = DataParallelKind(
    name="ddp",
    framework="torch DistributedDataParallel",
    sharded_states=(),
    grad_bytes_per_param=PARAM_BYTES,
    knobs=("ddp_bucket_mb", "ddp_first_bucket_mb", "ddp_gradient_as_bucket_view"),
    moe=True,
    autocast_weight_casts=True,
    grad_sync=_grad_sync,
    buckets=_buckets,
    transient_buffer_bytes=_transient_buffer_bytes,
)
"""torch DDP: replicated states, bucketed all-reduce overlapped with the backward."""
