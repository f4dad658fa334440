"""torch FSDP: FSDP1 (``FullyShardedDataParallel``) and FSDP2 (``fully_shard``), chosen by
``fsdp_version`` (default: FSDP2 under pipelining, FSDP1 without).

Weights, gradients and optimizer state are sharded over the replica group; each unit (one layer;
FSDP1's root or FSDP2's embedding and ``[norm, output]``) is all-gathered before use and its
gradients reduce-scattered in ``fsdp_reduce_dtype`` (FSDP2 default fp32, FSDP1 bf16). Its CPU
offload moves parameters, gradients and optimizer to host memory together.

    FSDP.transient_buffer_bytes(plan, 0)
"""

from __future__ import annotations

from schedules.data_parallel.spec import DataParallelKind
from schedules.data_parallel.units import (
    gathered_units_bytes,
    pipelined_stage_bytes,
    pipelined_unit_bytes,
    root_params_per_gpu,
    unit_gradient_bytes,
)
from schedules.params import PARAM_BYTES, embedding_params_per_gpu, stage_params_per_gpu
from schedules.plan import ParallelConfig, Plan

FSDP_KNOBS = (
    "fsdp_backward_prefetch",
    "fsdp_forward_prefetch",
    "fsdp_limit_all_gathers",
    "fsdp_reshard_after_forward",
    "fsdp_version",
    "fsdp_reduce_dtype",
    "fsdp_pp_reduce",
)
"""Knobs of torch FSDP (FSDP1 and FSDP2)."""
FSDP1_ONLY = ("fsdp_backward_prefetch", "fsdp_forward_prefetch", "fsdp_limit_all_gathers")
"""FullyShardedDataParallel options that ``fully_shard`` does not have."""


def transient_buffer_bytes(plan: Plan, stage: int) -> float:
    """FSDP1: two layers' gathered parameters (the rate limiter's two in flight; every layer
    without it: the CPU runs ahead and issues them all) and one layer's gradients, plus their
    ``reduce_dtype`` copy when it differs. FSDP2: two all-gather outputs in flight (the current
    unit's copy-out and the next one's prefetch) and one unit's unsharded gradients with their
    reduce-scatter input in ``reduce_dtype``. Under pipelining one unit's reduce-scatter input."""
    parallel = plan.parallel
    reduce = parallel.reduce_dtype_bytes
    if parallel.pp > 1:
        return pipelined_unit_bytes(plan, reduce)
    grads = unit_gradient_bytes(plan, reduce)
    if parallel.fsdp_reshard_after_forward is False:
        # SHARD_GRAD_OP keeps the whole stage unsharded between forward and backward.
        return stage_params_per_gpu(plan, stage) * PARAM_BYTES + grads
    limited = parallel.fsdp2 or parallel.fsdp_limit_all_gathers
    return gathered_units_bytes(plan, 2 if limited else plan.model.num_layers) + grads


def unsharded_bytes(plan: Plan, stage: int) -> float:
    """Under pipelining (torch.distributed.pipelining, torch 2.13) the whole stage: its parameters
    stay gathered from the first forward and its gradients accumulate unsharded until the
    stage's ``REDUCE_GRAD``, in ``reduce_dtype`` (FSDP2 upcasts them while gradient sync is off:
    ``FSDPParam.to_accumulated_grad_if_needed``). Without pipelining: FSDP1's root unit
    (embedding, final norm, head) is not resharded after forward, so its parameters and their
    gradients are unsharded through the backward (+4 GiB on Llama 3 8B); FSDP2's ``[norm,
    output]`` unit likewise keeps its parameters until its backward, whose gradients then live
    with their ``reduce_dtype`` copy once ``post_backward`` has resharded the parameters."""
    parallel = plan.parallel
    if parallel.pp > 1:
        return pipelined_stage_bytes(plan, stage, parallel.reduce_dtype_bytes)
    root = root_params_per_gpu(plan, stage)
    grad = PARAM_BYTES
    if not parallel.fsdp2:
        return root * (PARAM_BYTES + grad)
    head = root - min(root, embedding_params_per_gpu(plan.model, parallel.tp))
    # Parameters and bf16 gradients until post_backward reshards the parameters, then the
    # gradients and their reduce-dtype copy: never all three at once.
    return head * max(PARAM_BYTES + grad, grad + parallel.reduce_dtype_bytes)


def check(parallel: ParallelConfig, dp: int) -> None:
    """FSDP1 does not compose with torch.distributed.pipelining; FSDP2 has no FSDP1 knobs."""
    if parallel.fsdp_version == 1 and parallel.pp > 1:
        raise ValueError(
            f"parallel.fsdp_version=1 cannot run under pipeline parallelism (pp={parallel.pp}): "
            "torch.distributed.pipelining composes with FSDP2 (fully_shard) only"
        )
    if parallel.fsdp2:
        defaults = type(parallel)()
        for knob in FSDP1_ONLY:
            value = getattr(parallel, knob)
            if value != getattr(defaults, knob):
                raise ValueError(
                    f"parallel.{knob}={value!r} is an FSDP1 option; FSDP2 (fully_shard) has no "
                    "such knob: it prefetches one unit ahead in forward and backward"
                )


def check_offload(parallel: ParallelConfig) -> None:
    """FSDP offloads parameters, gradients and optimizer together, to CPU memory only; FSDP1's
    ``CPUOffload`` always pins its buffers (``FlatParamHandle._init_flat_param_attributes``)."""
    optimizer, param = parallel.offload_optimizer, parallel.offload_param
    if param != "cpu" or optimizer not in ("none", "cpu"):
        raise ValueError(
            f"FSDP's CPU offload (CPUOffloadPolicy) moves parameters, gradients and the optimizer "
            f"to CPU memory together: set parallel.offload_param='cpu' (offload_optimizer 'none' "
            f"or 'cpu'), got offload_param={param!r}, offload_optimizer={optimizer!r}"
        )
    if not parallel.fsdp2 and parallel.offload_pin_memory is False:
        raise ValueError(
            "parallel.offload_pin_memory=False needs FSDP2 (CPUOffloadPolicy(pin_memory=False)): "
            "FSDP1's CPUOffload(offload_params=True) always pins; set fsdp_version: 2"
        )


def label(parallel: ParallelConfig) -> str:
    """``fsdp2`` when FSDP runs as ``fully_shard``, else ``fsdp``."""
    return "fsdp2" if parallel.fsdp2 else "fsdp"


def one_bucket(parallel: ParallelConfig, stage: int, chunk: int, total: float) -> tuple[float, ...]:
    """FSDP reduces unit by unit, not in buckets: a chunk's gradients are one piece."""
    return (total,)


FSDP = DataParallelKind(
    name="fsdp",
    framework="torch FSDP (FSDP1 FullyShardedDataParallel or FSDP2 fully_shard)",
    sharded_states=("optimizer", "gradients", "weights"),
    grad_bytes_per_param=PARAM_BYTES,
    knobs=FSDP_KNOBS,
    gathers_units=True,
    torch_fsdp=True,
    moe=True,
    program="fsdp",
    buckets=one_bucket,
    transient_buffer_bytes=transient_buffer_bytes,
    unsharded_bytes=unsharded_bytes,
    check=check,
    check_offload=check_offload,
    label=label,
)
"""torch FSDP over the whole data-parallel (x context-parallel) group."""
