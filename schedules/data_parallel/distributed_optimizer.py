"""Megatron-LM's distributed optimizer: fp32 main gradients reduce-scattered over data
parallelism, the optimizer state sharded, the updated parameters all-gathered after the step
(or, with ``overlap_param_gather``, with the next forward).

Buckets (``distributed_data_parallel_config.py``): max(40M, 1M * dp) elements, on the first
model chunk of the first stage only when ``overlap_grad_reduce``; one bucket otherwise. The
gradients are fp32 unless ``grad_reduce_in_fp32`` is off; the optimizer's state and the FP8
weights are ``schedules.optimizer_states``'.

    DISTRIBUTED_OPTIMIZER.grad_sync(plan.parallel)
"""

from __future__ import annotations

from schedules.buckets import split_buckets
from schedules.data_parallel.spec import DataParallelKind
from schedules.grad_sync import GradSync
from schedules.optimizer_states import FP32_GRAD_BYTES, grad_bytes
from schedules.plan import ParallelConfig

MEGATRON_MIN_BUCKET_ELEMS = 40_000_000
"""Megatron's bucket size: max(40M, 1M * dp) elements (distributed_data_parallel_config.py)."""


def _buckets(parallel: ParallelConfig, stage: int, chunk: int, total: float) -> tuple[float, ...]:
    if stage > 0 or chunk > 0 or not parallel.overlap_grad_reduce:
        return (total,)
    elems = max(MEGATRON_MIN_BUCKET_ELEMS, 1_000_000 * parallel.dp)
    return split_buckets(
        total, elems * grad_bytes(parallel), knob=f"Megatron's bucket of {elems} elements"
    )


def _grad_sync(parallel: ParallelConfig) -> GradSync:
    gather = "overlapped" if parallel.overlap_param_gather else "after_step"
    return GradSync(
        op="reduce_scatter",
        bucketed=parallel.overlap_grad_reduce,
        at_end=not parallel.overlap_grad_reduce,
        param_gather=gather,
    )


DISTRIBUTED_OPTIMIZER = DataParallelKind(
    name="distributed_optimizer",
    framework="Megatron-LM distributed optimizer",
    sharded_states=("optimizer",),
    grad_bytes_per_param=FP32_GRAD_BYTES,
    grad_dtype_bytes=grad_bytes,
    knobs=(
        "overlap_param_gather",
        "grad_reduce_in_fp32",
        "use_precision_aware_optimizer",
        "main_params_dtype",
        "exp_avg_dtype",
        "exp_avg_sq_dtype",
    ),
    moe=True,
    default_stack="megatron",
    grad_sync=_grad_sync,
    buckets=_buckets,
)
"""Megatron's distributed optimizer: gradients reduce-scattered (fp32 by default), optimizer
sharded."""
