"""``DataParallelKind``: everything the simulator knows about one data-parallel framework.

A kind is a frozen value: facts (what it shards, its gradient dtype, which knobs it owns) and
small pure functions of the plan (its buckets, its memory buffers, its checks). The kinds live
in the sibling modules and are found through ``schedules.data_parallel.registry``.

    DataParallelKind(name="ddp", framework="torch DDP", ...)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schedules.grad_sync import GradSync
    from schedules.plan import ParallelConfig, Plan

STATES = ("weights", "gradients", "optimizer")
"""What a kind may shard over its replica group."""
PROGRAMS = ("pipeline", "fsdp", "zero3")
"""Program builders of a step without pipelining: pipeline passes with bucketed gradient sync,
torch FSDP units (FSDP1 or FSDP2 by ``fsdp_version``), DeepSpeed ZeRO-3's hooks. Under pipelining
every kind runs in the pipeline program (FSDP kinds as FSDP2 units per chunk)."""


def no_check(parallel: ParallelConfig, dp: int) -> None:
    """A kind without checks of its own."""


def no_bytes(plan: Plan, stage: int) -> float:
    """A kind without this memory item."""
    return 0.0


def dp_times_cp(plan: Plan, gpus_per_node: int | None) -> int:
    """The replica group of every kind but HSDP: all data-parallel and context-parallel ranks."""
    return plan.parallel.dp * plan.parallel.cp


@dataclass(frozen=True, kw_only=True, slots=True)
class DataParallelKind:
    """One data-parallel framework as the simulator models it."""

    name: str
    """The plan's ``parallel.data_parallel``."""
    framework: str
    """What it is, in the framework's own words (reports, docs)."""
    sharded_states: tuple[str, ...]
    """Which of ``STATES`` it shards over its replica group (empty: every rank holds all)."""
    grad_bytes_per_param: int
    """Bytes of one gradient element as stored and reduced (by default: ``grad_bytes``)."""
    grad_dtype_bytes: Callable[[ParallelConfig], int] | None = None
    """(parallel) -> bytes of one gradient element where a knob sets the dtype (the
    distributed optimizer's ``grad_reduce_in_fp32``); None: ``grad_bytes_per_param``."""
    knobs: tuple[str, ...] = ()
    """``parallel.*`` fields it owns: set away from their default, they need this kind."""
    gathers_units: bool = False
    """Shards the parameters and gathers them unit by unit (FSDP, HSDP, ZeRO-3)."""
    torch_fsdp: bool = False
    """Is torch FSDP (FSDP1 or FSDP2): reduces in ``fsdp_reduce_dtype``, FSDP's CPU offload."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage (1, 2, 3); 0 for other frameworks."""
    pipeline_problem: str = ""
    """Why it cannot run under pipeline parallelism ("" when it can)."""
    moe: bool = False
    """Simulated with mixture-of-experts layers (expert gradients reduced over ``edp``)."""
    default_stack: str = "eager"
    """Kernel stack when ``training.stack`` is not given."""
    autocast_weight_casts: bool = False
    """Keeps fp32 weights that autocast casts to bf16 every forward (plain torch DDP)."""
    program: str = "pipeline"
    """Which of ``PROGRAMS`` replays a step without pipelining."""
    grad_sync: Callable[[ParallelConfig], GradSync] | None = None
    """Its gradient sync in a pipeline program (None: FSDP units reduce their own gradients)."""
    buckets: Callable[[ParallelConfig, int, int, float], tuple[float, ...]] | None = None
    """(parallel, stage, chunk, gradient bytes) -> bucket sizes in ready order (None: one)."""
    transient_buffer_bytes: Callable[[Plan, int], float] = no_bytes
    """Communication buffers alive at the memory peak on a stage."""
    unsharded_bytes: Callable[[Plan, int], float] = no_bytes
    """Parameters and gradients held unsharded beyond the per-unit buffers on a stage."""
    replica_group_size: Callable[[Plan, int | None], int] = dp_times_cp
    """(plan, gpus per node) -> GPUs it shards its states over."""
    check: Callable[[ParallelConfig, int], None] = no_check
    """Its own cross-field checks of a plan with ``dp`` data-parallel ranks."""
    check_offload: Callable[[ParallelConfig], None] | None = None
    """Checks of ``offload_optimizer`` / ``offload_param`` (None: it cannot offload)."""
    label: Callable[[ParallelConfig], str] | None = None
    """Short name in layout labels (default: ``name``)."""

    def __post_init__(self) -> None:
        assert set(self.sharded_states) <= set(STATES), self.sharded_states
        assert self.program in PROGRAMS, self.program

    @property
    def shards_gradients_or_optimizer(self) -> bool:
        """Its ranks hold different shards: a gradient norm needs every rank's part."""
        return bool(self.sharded_states)

    def grad_bytes(self, parallel: ParallelConfig) -> int:
        """Bytes of one gradient element as ``parallel`` stores and reduces it."""
        if self.grad_dtype_bytes is None:
            return self.grad_bytes_per_param
        return self.grad_dtype_bytes(parallel)

    def reduce_bytes_per_param(self, parallel: ParallelConfig) -> float:
        """Bytes per element of its gradient reduction: FSDP's ``reduce_dtype``, else the
        gradient dtype."""
        if self.torch_fsdp:
            return float(parallel.reduce_dtype_bytes)
        return float(self.grad_bytes(parallel))

    def short_name(self, parallel: ParallelConfig) -> str:
        """Its name in layout labels (``fsdp2`` for FSDP run as ``fully_shard``)."""
        return self.name if self.label is None else self.label(parallel)
