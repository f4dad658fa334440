"""DeepSpeed ZeRO stage 3: parameters, gradients and optimizer state partitioned; each
submodule's parameters fetched (all-gathered) by hooks before use, prefetched in trace order,
released after; gradients reduce-scattered in ``reduce_bucket_size`` buckets. ZeRO-Offload /
ZeRO-Infinity move the optimizer and the parameters to CPU memory or NVMe.

The step's program is ``schedules.zero3_program`` (with ``zero3_spec``, ``zero3_fetch`` and
``zero3_units``); this module holds what the rest of the simulator asks of the kind.

    ZERO3.transient_buffer_bytes(plan, 0)
"""

from __future__ import annotations

from schedules.data_parallel.spec import DataParallelKind
from schedules.data_parallel.units import pipelined_stage_bytes, pipelined_unit_bytes
from schedules.data_parallel.zero import PIPELINE_PROBLEM, ZERO_KNOBS, zero_buckets
from schedules.params import PARAM_BYTES
from schedules.plan import ParallelConfig, Plan
from schedules.zero3_units import zero3_runtime_bytes

ZERO3_PEAK_BUFFERS = ("ipg_bucket", "reduce_scatter_copy", "live_params", "persistent_params")
"""ZeRO-3's buffers alive with the activations (its gradient partition is ``gradients``; the
fp32 copy of a sub-group's gradients exists only during the optimizer step)."""


def transient_buffer_bytes(plan: Plan, stage: int) -> float:
    """Its gradient bucket, the reduce-scatter's copy of the largest bucket, the most parameters
    its prefetcher keeps gathered and the persistent (small) parameters
    (``schedules.zero3_fetch.zero3_buffer_bytes``)."""
    parallel = plan.parallel
    if parallel.pp > 1:
        return pipelined_unit_bytes(plan, PARAM_BYTES)
    runtime = zero3_runtime_bytes(plan, dp=parallel.dp * parallel.cp)
    return sum(runtime[k] for k in ZERO3_PEAK_BUFFERS)


def unsharded_bytes(plan: Plan, stage: int) -> float:
    """Nothing beyond its fetched parameters, except under pipelining (the whole stage)."""
    if plan.parallel.pp > 1:
        return pipelined_stage_bytes(plan, stage, PARAM_BYTES)
    return 0.0


def check_offload(parallel: ParallelConfig) -> None:
    """ZeRO-3 offloads the optimizer and the parameters, to CPU memory or NVMe."""


ZERO3 = DataParallelKind(
    name="zero3",
    framework="DeepSpeed ZeRO stage 3",
    sharded_states=("optimizer", "gradients", "weights"),
    grad_bytes_per_param=PARAM_BYTES,
    knobs=(
        *ZERO_KNOBS,
        "zero_prefetch_bucket_elems",
        "zero_max_live_parameters",
        "zero_param_persistence_threshold",
        "zero_fetch",
    ),
    gathers_units=True,
    zero_stage=3,
    pipeline_problem=PIPELINE_PROBLEM,
    program="zero3",
    buckets=zero_buckets,
    transient_buffer_bytes=transient_buffer_bytes,
    unsharded_bytes=unsharded_bytes,
    check_offload=check_offload,
)
"""ZeRO-3: everything partitioned, parameters fetched per submodule."""
