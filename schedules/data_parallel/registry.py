"""The data-parallel kinds by name, and the checks and records every kind shares.

``data_parallel_kind`` is how the rest of the simulator learns what a plan's
``parallel.data_parallel`` does; ``check_data_parallel`` runs the kind's checks in resolve;
``offload_of`` builds the plan's resolved offload settings with the kind's defaults.

    kind = data_parallel_kind(plan.parallel)
"""

from __future__ import annotations

from schedules.data_parallel.ddp import DDP
from schedules.data_parallel.distributed_optimizer import DISTRIBUTED_OPTIMIZER
from schedules.data_parallel.fsdp import FSDP
from schedules.data_parallel.hsdp import HSDP
from schedules.data_parallel.spec import DataParallelKind
from schedules.data_parallel.zero import ZERO1, ZERO2
from schedules.data_parallel.zero3 import ZERO3
from schedules.offload import Offload, check_offload_devices, check_offload_swaps
from schedules.plan import DATA_PARALLEL_KINDS, ParallelConfig, Plan

DATA_PARALLEL: dict[str, DataParallelKind] = {
    kind.name: kind for kind in (DDP, ZERO1, ZERO2, ZERO3, FSDP, HSDP, DISTRIBUTED_OPTIMIZER)
}
"""Every kind, in the order the plan format lists them."""
assert tuple(DATA_PARALLEL) == DATA_PARALLEL_KINDS, "the plan's choices are the registry's kinds"


def data_parallel_kind(what: ParallelConfig | str) -> DataParallelKind:
    """The kind of a plan's ``parallel`` section (or of a name)."""
    name = what if isinstance(what, str) else what.data_parallel
    if name not in DATA_PARALLEL:
        raise ValueError(
            f"parallel.data_parallel={name!r} is not one of {', '.join(DATA_PARALLEL)}"
        )
    return DATA_PARALLEL[name]


def kinds_where(flag: str) -> tuple[str, ...]:
    """Names of the kinds whose ``flag`` attribute is true, in registry order."""
    return tuple(name for name, kind in DATA_PARALLEL.items() if getattr(kind, flag))


def owners_of(knob: str) -> tuple[str, ...]:
    """Names of the kinds that own a ``parallel.*`` knob."""
    return tuple(name for name, kind in DATA_PARALLEL.items() if knob in kind.knobs)


OWNED_KNOBS = tuple(field for field in ParallelConfig.__dataclass_fields__ if owners_of(field))
"""Every knob some kind owns, in the plan's field order."""


def replica_group_size(plan: Plan, *, gpus_per_node: int | None = None) -> int:
    """GPUs the plan's kind shards its state over: dp * cp, or HSDP's shard group."""
    return data_parallel_kind(plan.parallel).replica_group_size(plan, gpus_per_node)


def check_data_parallel(parallel: ParallelConfig, dp: int) -> None:
    """Knobs set away from their default belong to the kind; the kind runs under the plan's
    pipeline; the kind's own checks."""
    defaults = type(parallel)()
    kind = data_parallel_kind(parallel)
    for knob in OWNED_KNOBS:
        value = getattr(parallel, knob)
        if value != getattr(defaults, knob) and knob not in kind.knobs:
            raise ValueError(
                f"parallel.{knob}={value!r} applies only to data_parallel "
                f"{' | '.join(owners_of(knob))}, got data_parallel={kind.name!r}"
            )
    if kind.pipeline_problem and parallel.pp > 1:
        raise ValueError(
            f"data_parallel={kind.name} cannot run under pipeline parallelism "
            f"(pp={parallel.pp}): {kind.pipeline_problem}"
        )
    kind.check(parallel, dp)


def check_offload(parallel: ParallelConfig) -> None:
    """The offload keys name a device and fit the data-parallel kind; one-line ValueErrors."""
    offloaded = check_offload_devices(parallel)
    if offloaded is None:
        return
    key, value = offloaded
    kind = data_parallel_kind(parallel)
    if kind.check_offload is None:
        raise ValueError(
            f"parallel.{key}={value!r} needs data_parallel "
            f"{' | '.join(n for n, k in DATA_PARALLEL.items() if k.check_offload)} (DeepSpeed "
            f"ZeRO-Offload / ZeRO-Infinity, FSDP CPU offload), got data_parallel={kind.name!r}"
        )
    kind.check_offload(parallel)
    check_offload_swaps(parallel)
    if kind.gathers_units and parallel.pp > 1:
        raise ValueError(
            f"parallel.{key}={value!r} with data_parallel={kind.name} is simulated without "
            f"pipeline parallelism only, got pp={parallel.pp}"
        )


def offload_of(parallel: ParallelConfig) -> Offload | None:
    """The plan's offload, or None when nothing is offloaded."""
    if parallel.offload_optimizer == "none" and parallel.offload_param == "none":
        return None
    kind = data_parallel_kind(parallel)
    fsdp = kind.torch_fsdp
    pin = parallel.offload_pin_memory
    return Offload(
        zero_stage=kind.zero_stage,
        optimizer="cpu" if fsdp else parallel.offload_optimizer,
        param=parallel.offload_param,
        pin_memory=fsdp if pin is None else pin,
        pipeline_read=parallel.offload_pipeline_read,
        pipeline_write=parallel.offload_pipeline_write,
        fsdp2=fsdp and parallel.fsdp2,
    )
