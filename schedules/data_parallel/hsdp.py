"""torch HSDP (hybrid sharding): FSDP inside a shard group of ``hsdp_shard_size`` GPUs (0: the
GPUs of a node), replicas across groups; gradients reduce-scattered in the shard group, then
all-reduced across replicas. Everything else is FSDP's (``schedules.data_parallel.fsdp``).

    HSDP.replica_group_size(plan, 8)
"""

from __future__ import annotations

from schedules.data_parallel import fsdp
from schedules.data_parallel.spec import DataParallelKind
from schedules.params import PARAM_BYTES
from schedules.plan import ParallelConfig, Plan


def replica_group_size(plan: Plan, gpus_per_node: int | None) -> int:
    """GPUs HSDP shards its state over: the shard group (``hsdp_shard_size`` data-parallel ranks
    times cp; 0: the GPUs of a node, so ``gpus_per_node`` must be given then, since schedules
    knows nothing about the hardware), at most dp * cp."""
    parallel = plan.parallel
    group = parallel.dp * parallel.cp
    shard = parallel.hsdp_shard_size
    if shard == 0:
        if gpus_per_node is None:
            raise ValueError("hsdp with hsdp_shard_size=0 needs gpus_per_node to size its groups")
        shard = max(1, gpus_per_node // (parallel.tp * parallel.cp))
    return min(shard * parallel.cp, group)


def check(parallel: ParallelConfig, dp: int) -> None:
    """FSDP's checks, and a shard group that divides the data-parallel ranks."""
    fsdp.check(parallel, dp)
    if parallel.hsdp_shard_size and dp % parallel.hsdp_shard_size:
        raise ValueError(f"parallel.hsdp_shard_size={parallel.hsdp_shard_size} must divide dp={dp}")


HSDP = DataParallelKind(
    name="hsdp",
    framework="torch HSDP (FSDP with HYBRID_SHARD / a 2-D device mesh)",
    sharded_states=("optimizer", "gradients", "weights"),
    grad_bytes_per_param=PARAM_BYTES,
    knobs=(*fsdp.FSDP_KNOBS, "hsdp_shard_size"),
    gathers_units=True,
    torch_fsdp=True,
    program="fsdp",
    buckets=fsdp.one_bucket,
    transient_buffer_bytes=fsdp.transient_buffer_bytes,
    unsharded_bytes=fsdp.unsharded_bytes,
    replica_group_size=replica_group_size,
    check=check,
    check_offload=fsdp.check_offload,
)
"""torch HSDP: FSDP within shard groups, replicated across them."""
