"""DeepSpeed ZeRO stages 1 and 2: the optimizer state (stage 1) and the gradients (stage 2)
partitioned over data parallelism; gradients all-reduced in ``reduce_bucket_size`` buckets
(``zero_bucket_elems``), one bucket in flight with ``overlap_comm``, each waited for at once
without it; the updated partitions all-gathered after the step (``stage_1_and_2.py``).

ZeRO-Offload keeps the optimizer (and fp32 master partition) in CPU memory; parameters are
offloaded only by stage 3.

    ZERO2.grad_sync(plan.parallel).every_microbatch  # True
"""

from __future__ import annotations

from schedules.buckets import element_buckets
from schedules.data_parallel.spec import DataParallelKind
from schedules.grad_sync import GradSync
from schedules.params import PARAM_BYTES
from schedules.plan import ParallelConfig, Plan

ZERO_KNOBS = ("zero_bucket_elems", "zero_overlap_comm")
"""Knobs every ZeRO stage reads."""
PIPELINE_PROBLEM = (
    "DeepSpeed's PipelineEngine asserts 'ZeRO-2 and ZeRO-3 are incompatible with "
    "pipeline parallelism'; use zero1, distributed_optimizer or fsdp"
)
"""Why stages 2 and 3 cannot run under pipeline parallelism."""


def zero_buckets(
    parallel: ParallelConfig, stage: int, chunk: int, total: float
) -> tuple[float, ...]:
    """``reduce_bucket_size`` buckets of bf16 gradient elements."""
    knob = f"parallel.zero_bucket_elems={parallel.zero_bucket_elems}"
    return element_buckets(total, parallel.zero_bucket_elems, PARAM_BYTES, knob=knob)


def _sync(parallel: ParallelConfig, *, every_microbatch: bool) -> GradSync:
    overlap = bool(parallel.zero_overlap_comm)  # DeepSpeed default: False for stages 1, 2
    return GradSync(
        op="all_reduce",
        bucketed=overlap or every_microbatch,
        every_microbatch=every_microbatch,
        depth_one=overlap,
        blocking=not overlap,
        param_gather="after_step",
    )


def _sync_per_step(parallel: ParallelConfig) -> GradSync:
    """ZeRO-1 reduces the accumulated gradients once, on the last micro-batch."""
    return _sync(parallel, every_microbatch=False)


def _sync_per_microbatch(parallel: ParallelConfig) -> GradSync:
    """ZeRO-2 reduces into its gradient partition on every micro-batch."""
    return _sync(parallel, every_microbatch=True)


def _transient_buffer_bytes(plan: Plan, stage: int) -> float:
    """The bucket being reduced, and the next one filling with ``overlap_comm``."""
    parallel = plan.parallel
    overlap = bool(parallel.zero_overlap_comm)
    return (2 if overlap else 1) * parallel.zero_bucket_elems * PARAM_BYTES


def _check_offload(parallel: ParallelConfig) -> None:
    """Stages 1 and 2 offload the optimizer to CPU memory only."""
    kind, param = parallel.data_parallel, parallel.offload_param
    if param != "none":
        raise ValueError(
            f"parallel.offload_param={param!r} needs data_parallel zero3: DeepSpeed offloads "
            f"parameters only in stage 3, got data_parallel={kind!r}"
        )
    if parallel.offload_optimizer == "nvme":
        raise ValueError(
            f"parallel.offload_optimizer='nvme' needs data_parallel zero3 (ZeRO-Infinity); "
            f"DeepSpeed stages 1 and 2 keep offloaded states in CPU memory, got {kind!r}"
        )


ZERO1 = DataParallelKind(
    name="zero1",
    framework="DeepSpeed ZeRO stage 1",
    sharded_states=("optimizer",),
    grad_bytes_per_param=PARAM_BYTES,
    knobs=ZERO_KNOBS,
    zero_stage=1,
    moe=True,
    grad_sync=_sync_per_step,
    buckets=zero_buckets,
    transient_buffer_bytes=_transient_buffer_bytes,
    check_offload=_check_offload,
)
"""ZeRO-1: optimizer state partitioned, gradients all-reduced once per step."""

ZERO2 = DataParallelKind(
    name="zero2",
    framework="DeepSpeed ZeRO stage 2",
    sharded_states=("optimizer", "gradients"),
    grad_bytes_per_param=PARAM_BYTES,
    knobs=ZERO_KNOBS,
    zero_stage=2,
    pipeline_problem=PIPELINE_PROBLEM,
    moe=True,
    grad_sync=_sync_per_microbatch,
    buckets=zero_buckets,
    transient_buffer_bytes=_transient_buffer_bytes,
    check_offload=_check_offload,
)
"""ZeRO-2: optimizer state and gradients partitioned, reduced on every micro-batch."""
