"""FSDP2 (``fully_shard``) step programs without pipelining, as torchtitan runs them.

torchtitan (``parallelize.py: apply_fsdp``) wraps the token embedding, every transformer block and
``[norm, output]`` as their own ``fully_shard`` units (the last one with ``reshard_after_forward``
False: it would be gathered again at once for backward), then the root. Per micro-batch, torch
2.13's ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`` does:

- **Forward, implicit prefetch**: a unit's all-gather runs on the all-gather stream, its copy-out
  on the compute stream (``wait_for_unshard``). In forward the copy-out event is kept in
  ``comm_ctx.all_gather_state`` and the all-gather streams wait for it only at the *next* unit's
  ``wait_for_unshard``: the all-gather of unit k may start once the copy-out of unit k - 2 ran,
  two buffers in flight, with the CPU running ahead.
- **Backward, explicit prefetch of one**: ``pre_backward`` copies out the unit (the all-gather
  streams wait for that at once, outside forward) and ``_backward_prefetch`` issues the next
  unit's all-gather in backward order: the all-gather of unit k - 1 waits for unit k's copy-out.
- **Reduce-scatter**: ``post_backward`` makes the compute stream wait for the previous unit's
  reduce-scatter (``comm_ctx.reduce_scatter_state.event``, recorded before HSDP's all-reduce:
  its input buffer is freed before the next copy-in), copies this unit's gradients into the
  reduce-scatter input in ``reduce_dtype`` on the compute stream (``foreach_reduce``'s copy-in
  runs before ``reduce_scatter_stream.wait_stream``; torchtitan reduces in fp32,
  ``mixed_precision_reduce``), then reduce-scatters on the reduce-scatter stream; HSDP
  all-reduces the shard over the replicate group. Every micro-batch reduces (torchtitan does not
  disable gradient sync during accumulation) and ends in ``finalize_backward``, where the compute
  stream waits for every reduction of the micro-batch; ``reshard_after_backward`` frees every
  unit after its backward.
- Step end: the gradient-norm all-reduce of ``clip_grad_norm_`` over DTensor shards, then the
  optimizer on the local shard.
- MoE layers under expert parallelism (torchtitan's ``apply_fsdp``): the routed experts are
  sharded over ``edp``; their all-gather follows the rest of the layer's on the all-gather stream
  (and the next layer's follows theirs), their reduce-scatter the rest's. torchtitan sets up
  explicit forward prefetching there, since the host synchronises in each layer's token
  dispatch: that changes when the host issues the next layer's all-gather, not what it waits for
  on the device (``wait_for_unshard`` still gates it two copy-outs back).
- CPU offload (``CPUOffloadPolicy``): each unit's fp32 shard is copied to the GPU before its
  all-gather and its gradient shard to the host after its reduce-scatter, the optimizer runs on
  the CPU (``schedules.fsdp_offload``).

Not modelled: the all-gather copy-in kernels (shard-sized, on a side stream).

    program = fsdp2_program(Fsdp2Rank(rank=0, num_microbatches=2, units=units, groups=groups))
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schedules.actions import Compute, Program, ProgramBuilder, Step
from schedules.fsdp_offload import FsdpHostCopies
from schedules.fsdp_program import reduce_unit
from schedules.offload import RankOffload


@dataclass(frozen=True, slots=True, kw_only=True)
class Fsdp2Unit:
    """One ``fully_shard`` module: its parameters, gradients and work."""

    name: str
    """Label, e.g. ``embed``, ``L3`` or ``head``."""
    param_bytes: float
    """All-gather output (unsharded parameters in the param dtype)."""
    grad_bytes: float
    """Reduce-scatter input (unsharded gradients in the reduce dtype)."""
    forward: tuple[Step, ...]
    """Forward recipe."""
    backward: tuple[Step, ...]
    """Backward recipe."""
    copy_out_s: float = 0.0
    """Compute-stream copy-out of the all-gather output into the parameters."""
    copy_in_s: float = 0.0
    """Compute-stream copy-in of the gradients into the reduce-scatter input (cast to the
    reduce dtype), in ``post_backward`` after waiting for the previous reduce-scatter."""
    reshard_after_forward: bool = True
    """Free the parameters after forward (backward gathers them again)."""
    expert_param_bytes: float = 0.0
    """An MoE layer's routed experts under expert parallelism: all-gathered over ``edp`` (their
    own shard group) after the rest of the unit on the same all-gather stream."""
    expert_grad_bytes: float = 0.0
    """Their gradients, reduce-scattered over ``edp`` after the rest of the unit's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fsdp2Rank:
    """Everything one rank's FSDP2 step program depends on."""

    rank: int
    """Global rank."""
    num_microbatches: int
    """Gradient-accumulation micro-batches."""
    units: tuple[Fsdp2Unit, ...]
    """The model's units in forward order."""
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """``dp`` = the shard group; ``hsdp`` = the replicate group (HSDP), ``tp``/``cp`` as usual,
    the gradient-norm group, and for MoE layers ``edp`` (the experts' shard group) and the
    expert-parallel groups their recipes use."""
    grad_norm_group: str = ""
    """Group of the step-end gradient-norm all-reduce; empty for none."""
    optimizer_s: float = 0.0
    """Optimizer step on the local shard."""
    offload: RankOffload | None = None
    """``CPUOffloadPolicy``: host copies around each unit's collectives
    (``schedules.fsdp_offload``); None: no offload."""


class _Fsdp2:
    """Builds one rank's FSDP2 program (state: which units are sharded, pending events)."""

    def __init__(self, spec: Fsdp2Rank) -> None:
        self.spec = spec
        self.b = ProgramBuilder(rank=spec.rank, groups=dict(spec.groups))
        self.sharded = [True] * len(spec.units)
        self.copy_outs: list[int] = []
        self.reduced: list[int] = []
        self.pending_rs: list[int] = []
        self.last_expert_gather: int | None = None
        self.host = FsdpHostCopies(self.b, spec.offload)

    def gather(self, unit: int, tag: str, after_copy_out: int) -> list[int]:
        """All-gather of a unit once the copy-out ``after_copy_out`` places back has run (with
        CPU offload, after the shard's copy to the GPU on the copy-in stream, gated alike)."""
        back = len(self.copy_outs) - after_copy_out
        deps = (self.copy_outs[back],) if back >= 0 else ()
        u = self.spec.units[unit]
        ready = self.host.fetch(f"{u.name} {tag}", u.param_bytes, deps)
        after = () if self.last_expert_gather is None else (self.last_expert_gather,)
        index = self.b.collective(
            f"AG {u.name} {tag}", "dp", "all_gather", u.param_bytes,
            deps=tuple(sorted({*ready, *after})),
        )  # fmt: skip
        gathered = [] if index is None else [index]
        if u.expert_param_bytes > 0:  # the experts next, on the same all-gather stream
            experts = self.b.collective(
                f"AG {u.name} experts {tag}",
                "edp",
                "all_gather",
                u.expert_param_bytes,
                deps=tuple(gathered) or ready,
            )
            if experts is not None:  # the next unit's all-gather queues behind it
                gathered.append(experts)
                self.last_expert_gather = experts
        if not gathered:  # one-rank groups: the copy-out waits for the copy itself
            return [] if ready == deps else list(ready)
        return gathered

    def copy_out(self, unit: int, tag: str, gathered: list[int], waits: list[int]) -> list[int]:
        """The compute-stream copy-out of a gathered unit; returns what the next compute waits."""
        u = self.spec.units[unit]
        deps = tuple(sorted({*gathered, *waits}))
        index = self.b.add(
            Compute(name=f"copy-out {u.name} {tag}", duration_s=u.copy_out_s, deps=deps)
        )
        self.copy_outs.append(index)
        return []

    def forward(self, mb: int, waits: list[int]) -> list[int]:
        units, b = self.spec.units, self.b
        for i, u in enumerate(units):
            if self.sharded[i]:
                gathered = self.gather(i, f"mb{mb}", after_copy_out=2)
                waits = self.copy_out(i, f"mb{mb}", gathered, waits)
            waits = b.run_steps(f"F{mb} {u.name}", u.forward, tuple(waits))
            self.sharded[i] = u.reshard_after_forward
        return waits

    def backward(self, mb: int, waits: list[int]) -> list[int]:
        units, b = self.spec.units, self.b
        mb_reduced: list[int] = []
        order = list(range(len(units) - 1, -1, -1))
        gathers: dict[int, list[int]] = {}
        need = [i for i in order if self.sharded[i]]
        if need and need[0] == order[0]:
            gathers[need[0]] = self.gather(need[0], f"mb{mb} bwd", after_copy_out=1)
        for i in order:
            u = units[i]
            if self.sharded[i]:
                gathered = gathers.pop(i, None)
                if gathered is None:
                    gathered = self.gather(i, f"mb{mb} bwd", after_copy_out=1)
                waits = self.copy_out(i, f"mb{mb} bwd", gathered, waits)
            later = [j for j in need if j < i]
            if later:  # _backward_prefetch: the next unit in backward order, after this copy-out
                gathers[later[0]] = self.gather(later[0], f"mb{mb} bwd", after_copy_out=1)
                need.remove(later[0])
            waits = b.run_steps(f"B{mb} {u.name}", u.backward, tuple(waits))
            # post_backward: the compute stream waits for the previous unit's reduce-scatter, then
            # casts this unit's gradients into the reduce-scatter input (foreach_reduce copy-in)
            deps = tuple(sorted({*waits, *self.pending_rs}))
            name = f"copy-in {u.name} mb{mb}"
            copy_in = b.add(Compute(name=name, duration_s=u.copy_in_s, deps=deps))
            label = f"{u.name} mb{mb}"
            issued = reduce_unit(b, label, u.grad_bytes, [copy_in], tail=self.host.tail)
            self.pending_rs = issued[:1]  # its event; HSDP's all-reduce is not waited for here
            if u.expert_grad_bytes > 0:  # the experts' after the rest, on the same stream
                rs_deps = tuple(self.pending_rs) or b.after_compute(copy_in)
                experts = b.collective(
                    f"RS {label} experts", "edp", "reduce_scatter", u.expert_grad_bytes,
                    deps=rs_deps,
                )  # fmt: skip
                if experts is not None:
                    issued.append(experts)
                    self.pending_rs = [experts]
            copies, held = self.host.grads(label, u.grad_bytes, issued, [copy_in], mb)
            self.reduced += issued + copies
            mb_reduced += issued + copies
            waits = held  # a blocking copy to the host (and its CPU add) holds the host
            self.sharded[i] = True
        # finalize_backward, every micro-batch: the compute stream waits for all its reductions
        return mb_reduced

    def finish(self, waits: list[int]) -> None:
        spec, b = self.spec, self.b
        deps = sorted({*waits, *self.reduced})
        deps += b.grad_norm(spec.grad_norm_group, tuple(deps))
        b.add(
            Compute(
                name="optimizer", duration_s=spec.optimizer_s, kind="optimizer", deps=tuple(deps)
            )
        )


def fsdp2_program(spec: Fsdp2Rank) -> Program:
    """One rank's FSDP2 step: per micro-batch a forward and a backward unit by unit."""
    builder = _Fsdp2(spec)
    waits: list[int] = []
    for mb in range(spec.num_microbatches):
        waits = builder.forward(mb, waits)
        waits = builder.backward(mb, waits)
    builder.finish(waits)
    return builder.b.program()
