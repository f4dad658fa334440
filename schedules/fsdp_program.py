"""FSDP / HSDP / ZeRO-3 step programs: parameters sharded per unit, gathered before use.

``fsdp_program`` builds an FSDP1 / ZeRO-3 step without pipelining, unit by unit: the all-gathers
with the 2-in-flight rate limiter, forward and backward prefetch, the reduce-scatters on the same
FIFO, HSDP's replicate all-reduce and ``clip_grad_norm_``'s all-reduce before the optimizer; with
``CPUOffload(offload_params=True)`` the host copies of ``schedules.fsdp_offload`` around them.
``FsdpStages`` / ``FsdpPipelineState`` add FSDP2 units to the passes of
``schedules.pipeline_program``'s pipeline builder, as ``torch.distributed.pipelining`` runs them
(torch 2.13, torchtitan): every unit of a stage is all-gathered at its first forward (micro-batch
0, the next unit prefetched while the current one computes) and, with ``reshard_after_forward``
False (torchtitan's default under PP), stays unsharded through every micro-batch; backward
passes run with ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)``,
and the stage's ``REDUCE_GRAD`` (``perform_reduce_grad``) reduce-scatters every unit (root first,
then the layers in module order) after the stage's last backward.

    units = FsdpUnits(num_units=4, layer=w, unit_param_bytes=1e8, unit_grad_bytes=1e8)
    program = fsdp_program(FsdpRank(rank=0, num_microbatches=2, units=units, groups=groups))
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from schedules.actions import ChunkWork, Compute, MarkStep, Program, ProgramBuilder, Step
from schedules.fsdp_offload import FsdpHostCopies
from schedules.offload import RankOffload
from schedules.pipeline import Pass

MAX_INFLIGHT_ALL_GATHERS = 2
"""FSDP1's ``_max_num_inflight_all_gathers``: the limiter's free-event queue threshold."""
NO_WORK = ChunkWork(forward=(), backward=())
"""A part of the model with nothing to run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpUnits:
    """One pipeline chunk as FSDP2 units: ``num_units`` layers and a root (embedding, head)."""

    num_units: int
    """Layers of the chunk, each its own ``fully_shard`` unit."""
    layer: ChunkWork
    """One layer's forward, backward, Bi and W recipes."""
    unit_param_bytes: float
    """All-gather output of one layer unit."""
    unit_grad_bytes: float
    """Reduce-scatter input of one layer unit."""
    root_param_bytes: float = 0.0
    """All-gather output of the root (0 for a chunk with neither embedding nor head)."""
    root_grad_bytes: float = 0.0
    """Reduce-scatter input of the root."""
    embed: ChunkWork = NO_WORK
    """Work before the layers in forward and after them in backward (first stage)."""
    head: ChunkWork = NO_WORK
    """Work after the layers in forward and before them in backward (last stage)."""
    moe_units: frozenset[int] = frozenset()
    """The chunk's mixture-of-experts layers (0-based in the chunk): they run ``moe_layer`` and
    gather ``moe_param_bytes`` over the shard group plus ``expert_param_bytes`` over ``edp``."""
    moe_layer: ChunkWork = NO_WORK
    """One MoE layer's recipes."""
    moe_param_bytes: float = 0.0
    """All-gather output of an MoE unit's parameters sharded over the unit's group (all of them
    without expert parallelism; with it, all but the routed experts)."""
    moe_grad_bytes: float = 0.0
    """Reduce-scatter input of those."""
    expert_param_bytes: float = 0.0
    """All-gather output of an MoE unit's routed experts over ``edp`` (expert parallelism), after
    the rest of the unit's on the same stream."""
    expert_grad_bytes: float = 0.0
    """Their reduce-scatter input over ``edp``."""

    def recipes(self, unit: int) -> ChunkWork:
        """The recipes of layer unit ``unit``."""
        return self.moe_layer if unit in self.moe_units else self.layer

    def sizes(self, unit: int) -> tuple[float, float, float, float]:
        """(param, grad, expert param, expert grad) bytes of layer unit ``unit``."""
        if unit in self.moe_units:
            return (
                self.moe_param_bytes,
                self.moe_grad_bytes,
                self.expert_param_bytes,
                self.expert_grad_bytes,
            )
        return self.unit_param_bytes, self.unit_grad_bytes, 0.0, 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpRank:
    """Everything one rank's FSDP1 / ZeRO-3 step program depends on (one unit per layer)."""

    rank: int
    """Global rank."""
    num_microbatches: int
    """Gradient-accumulation micro-batches."""
    units: FsdpUnits
    """The model as FSDP units: one per transformer layer, and the root (embedding, head)."""
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """``dp`` = the shard group; ``hsdp`` = the replicate group (HSDP), ``tp``/``cp`` as usual."""
    backward_prefetch: str = "backward_pre"
    """backward_pre | backward_post | none."""
    forward_prefetch: bool = False
    """FSDP1 ``forward_prefetch``: a unit's pre-forward also issues the next unit's all-gather."""
    limit_all_gathers: bool = True
    """The rate limiter: an all-gather waits until at most one other unit is unsharded."""
    reshard_after_forward: bool = True
    """FULL_SHARD (True: backward all-gathers again) or SHARD_GRAD_OP (False)."""
    optimizer_s: float = 0.0
    """Optimizer step on the local shard."""
    grad_norm_group: str = ""
    """Group of ``clip_grad_norm_``'s all-reduce of the squared norms of the gradient shards,
    before the optimizer (a name in ``groups``); empty: no clipping."""
    offload: RankOffload | None = None
    """``CPUOffload(offload_params=True)``: host copies around each unit's collectives
    (``schedules.fsdp_offload``); None: no offload."""

    def __post_init__(self) -> None:
        if self.offload is not None and self.num_microbatches > 1:
            raise ValueError(
                f"FSDP1's CPUOffload cannot accumulate gradients over {self.num_microbatches} "
                "micro-batches outside no_sync (each backward's copy overwrites the CPU gradient: "
                "FlatParamHandle.prepare_gradient_for_backward), and no_sync is not modelled: "
                "use FSDP2 (fsdp_version: 2) or one micro-batch per step"
            )
        if self.grad_norm_group and self.grad_norm_group not in self.groups:
            raise ValueError(
                f"grad_norm_group={self.grad_norm_group!r} is not one of the groups "
                f"{sorted(self.groups)}"
            )


def fsdp_program(spec: FsdpRank) -> Program:
    """One rank's FSDP1 step (reference §1): per micro-batch a forward and a backward by unit.

    Forward: AG(root), then AG(u) before F(u). Backward: the root is not resharded after forward
    (no AG); BACKWARD_PRE issues AG(u - 1) before B(u), BACKWARD_POST after it (before RS(u)),
    ``none`` at u - 1's own pre-backward; RS(u) follows B(u) on the same FIFO, giving AG(u),
    RS(u+1), AG(u-1), RS(u)... The rate limiter is modelled literally: every reshard that frees
    memory records an event on the compute stream, and an AG is issued only once at most one
    such event is pending (the older ones are waited for).

    ``forward_prefetch`` follows torch 2.13's ``_pre_forward_unshard``: a unit not yet
    prefetched is gathered by ``_unshard``, then ``_prefetch_handle(..., _PrefetchMode.FORWARD)``
    gathers the next handle of the recorded pre-forward order (``_get_handle_to_prefetch`` ->
    ``_ExecOrderData.get_handle_to_forward_prefetch``, limit 1: root -> u0 -> u1 ...). The
    prefetch calls the same ``_unshard``, so it passes the limiter (``_FreeEventQueue.
    dequeue_if_needed``) like any AG; it only comes one free event earlier. The order is
    recorded in the first iteration, so a steady-state step prefetches in every micro-batch.
    Without the limiter the CPU already runs ahead here, and the flag changes only issue order.

    With ``grad_norm_group`` the optimizer waits for ``clip_grad_norm_``'s 8-byte all-reduce,
    issued after the last backward compute and every RS / AR (FSDP1's ``clip_grad_norm_``
    all-reduces the local shards' squared norms).
    """
    builder = _Fsdp(spec)
    outstanding: list[int] = []
    for mb in range(spec.num_microbatches):
        outstanding = builder.forward(mb, outstanding)
        outstanding = builder.backward(mb, outstanding)
    b = builder.b
    waits = [*outstanding, *builder.reduced]
    waits += b.grad_norm(spec.grad_norm_group, b.after_compute(*waits))
    b.add(
        Compute(
            name="optimizer",
            duration_s=spec.optimizer_s,
            kind="optimizer",
            deps=tuple(sorted(set(waits))),
        )
    )
    return b.program()


class _Fsdp:
    """Builds one rank's FSDP program (builder state: the limiter's free-event queue)."""

    def __init__(self, spec: FsdpRank) -> None:
        self.spec = spec
        self.b = ProgramBuilder(rank=spec.rank, groups=dict(spec.groups))
        self.frees: deque[int] = deque()
        self.reduced: list[int] = []
        self.host = FsdpHostCopies(self.b, spec.offload)

    def gather(self, name: str, size: float, deps: tuple[int, ...] = ()) -> list[int]:
        """All-gather on the shard FIFO, after the rate limiter lets it through (and, with CPU
        offload, after the shard's copy to the GPU, which ``pre_unshard`` issues before it)."""
        if size <= 0:  # no parameters, no handle: ``_unshard`` is never called
            return []
        ready = self.host.fetch(name.removeprefix("AG "), size, deps)
        waits = list(ready)
        while self.spec.limit_all_gathers and len(self.frees) >= MAX_INFLIGHT_ALL_GATHERS:
            waits.append(self.frees.popleft())
            self.host.held(waits[-1])
        index = self.b.collective(name, "dp", "all_gather", size, deps=tuple(sorted(set(waits))))
        if index is None:  # one-rank group: the compute waits for the copy itself
            return [] if ready == deps else list(ready)
        return [index]

    def free(self) -> None:
        """A reshard after the latest compute: its free event joins the limiter's queue."""
        if self.spec.limit_all_gathers and self.b.last_compute is not None:
            self.frees.append(self.b.last_compute)

    def forward(self, mb: int, waits: list[int]) -> list[int]:
        """Pre-forward of the root, then of each unit: AG (unless prefetched), prefetch, F, free.

        The AGs are issued from ``start`` (the root's pre-forward makes the all-gather stream
        wait for the compute stream; the CPU then runs ahead) and only the limiter holds them
        back, so ``forward_prefetch`` moves AG(u + 1) before F(u) in issue order: the limiter
        sees one free event fewer, and AG(u) waits for F(u - 3) instead of F(u - 2).
        """
        spec, units, b = self.spec, self.spec.units, self.b
        start = b.after_compute()
        gathers = {ROOT: self.gather(f"AG root mb{mb}", units.root_param_bytes, start)}
        # A root without parameters has no handle, so its pre-forward prefetches nothing.
        if spec.forward_prefetch and units.root_param_bytes > 0 and units.num_units > 0:
            gathers[0] = self.gather(f"AG u0 mb{mb}", units.unit_param_bytes, start)
        waits = b.run_steps(f"F{mb} embed", units.embed.forward, (*waits, *gathers[ROOT]))
        for u in range(units.num_units):
            if u not in gathers:
                gathers[u] = self.gather(f"AG u{u} mb{mb}", units.unit_param_bytes, start)
            if spec.forward_prefetch and u + 1 < units.num_units:
                gathers[u + 1] = self.gather(f"AG u{u + 1} mb{mb}", units.unit_param_bytes, start)
            waits = b.run_steps(f"F{mb} u{u}", units.layer.forward, (*waits, *gathers[u]))
            if spec.reshard_after_forward:
                self.free()
        return b.run_steps(f"F{mb} head", units.head.forward, tuple(waits))

    def backward(self, mb: int, waits: list[int]) -> list[int]:
        spec, units, b = self.spec, self.spec.units, self.b
        n = units.num_units
        regather, prefetch = spec.reshard_after_forward, spec.backward_prefetch
        gathers: dict[int, list[int]] = {}
        if regather and prefetch != "none" and n > 0:
            gathers[n - 1] = self.gather(f"AG u{n - 1} mb{mb} bwd", units.unit_param_bytes)
        waits = b.run_steps(f"B{mb} head", units.head.backward, tuple(waits))
        for u in range(n - 1, -1, -1):
            if regather and u not in gathers:
                gathers[u] = self.gather(f"AG u{u} mb{mb} bwd", units.unit_param_bytes)
            if regather and prefetch == "backward_pre" and u > 0:
                gathers[u - 1] = self.gather(f"AG u{u - 1} mb{mb} bwd", units.unit_param_bytes)
            waits = b.run_steps(f"B{mb} u{u}", units.layer.backward, (*waits, *gathers.get(u, [])))
            self.free()
            if regather and prefetch == "backward_post" and u > 0:
                gathers[u - 1] = self.gather(f"AG u{u - 1} mb{mb} bwd", units.unit_param_bytes)
            self.reduce(f"u{u} mb{mb}", units.unit_grad_bytes, waits, mb)
        waits = b.run_steps(f"B{mb} embed", units.embed.backward, tuple(waits))
        self.reduce(f"root mb{mb}", units.root_grad_bytes, waits, mb)
        return waits

    def reduce(self, label: str, size: float, waits: list[int], mb: int) -> None:
        """RS (and HSDP's AR) of a unit's gradient, then its copy to the host when offloaded."""
        reduced = reduce_unit(self.b, label, size, waits, tail=self.host.tail)
        copies, _ = self.host.grads(label, size, reduced, waits, mb)  # FSDP1 never blocks
        self.reduced += reduced + copies


def reduce_unit(
    b: ProgramBuilder, label: str, size: float, waits: list[int], *, tail: tuple[int, ...] = ()
) -> list[int]:
    """RS of a unit's gradient on the shard FIFO, then HSDP's all-reduce of the shard.

    ``tail``: earlier work on the stream the last of the two runs on (the reduce-scatter stream,
    or HSDP's all-reduce stream), which it queues behind: an offloaded gradient's copy to the
    host (``schedules.fsdp_offload``).
    """
    hsdp = len(b.groups.get("hsdp", ())) > 1
    rs_deps = b.after_compute(*waits, *(() if hsdp else tail))
    rs = b.collective(f"RS {label}", "dp", "reduce_scatter", size, deps=rs_deps)
    out = [] if rs is None else [rs]
    shard = len(b.groups.get("dp", ())) or 1
    ar = b.collective(
        f"AR {label}",
        "hsdp",
        "all_reduce",
        size / shard,
        deps=tuple(sorted({*(tuple(out) or b.after_compute(*waits)), *tail})),
    )
    return out + ([] if ar is None else [ar])


ROOT = -1
"""Unit id of a chunk's root (the stage module itself: embedding, final norm and head)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpStages:
    """FSDP2 inside a pipeline: the units of every chunk of a rank and when they communicate."""

    chunks: tuple[FsdpUnits, ...]
    """Per model chunk of the rank, in chunk order."""
    reshard_after_forward: bool = False
    """Free layer parameters after each forward (then gathered again before the next pass)."""
    reduce_during_last_backward: bool = False
    """Reduce-scatter each unit as its gradient is ready in the chunk's last backward (older
    pipelining: ``set_requires_gradient_sync(last_backward)``) instead of all of them after it
    (torch 2.13's ``REDUCE_GRAD``)."""
    reduce_before_send: bool = False
    """Run every unit's post-backward after the chunk's last backward but before its send, each
    making the compute stream wait for the previous FSDP group's reduce-scatter (torch before
    ``REDUCE_GRAD``, read at 2.6.0: ``backward_maybe_with_nosync``'s ``run_post_backward``;
    ``FSDPParamGroup.post_backward`` waits on ``reduce_scatter_state.event``); plan key
    ``parallel.fsdp_pp_reduce: before_send``."""


def _pass_parts(units: FsdpUnits, kind: str) -> list[tuple[int, tuple[Step, ...]]]:
    """(unit, recipe) in execution order for a pass kind; ROOT parts are embedding/head work."""
    n = units.num_units
    if kind == "F":
        return [
            (ROOT, units.embed.forward),
            *((u, units.recipes(u).forward) for u in range(n)),
            (ROOT, units.head.forward),
        ]
    if kind == "W":
        return [(u, units.recipes(u).backward_weight) for u in range(n - 1, -1, -1)]
    field_name = "backward" if kind == "B" else "backward_input"
    return [
        (ROOT, getattr(units.head, field_name)),
        *((u, getattr(units.recipes(u), field_name)) for u in range(n - 1, -1, -1)),
        (ROOT, getattr(units.embed, field_name)),
    ]


class FsdpPipelineState:
    """Which units of each chunk are sharded, as passes run (builder state of one rank)."""

    def __init__(self, b: ProgramBuilder, stages: FsdpStages) -> None:
        self.b = b
        self.stages = stages
        self.sharded = [True] * len(stages.chunks)
        self.root_gathered = [False] * len(stages.chunks)
        self.reduced: list[int] = []
        self.expert_gather: tuple[int, ...] = ()
        """The last routed experts' all-gather: the next one on the all-gather stream follows it."""
        self.expert_scatter: tuple[int, ...] = ()
        """The last routed experts' reduce-scatter: the next one on its stream follows it."""

    def _gathers(self, chunk: int, kind: str) -> list[int]:
        """Units this pass must all-gather, in the order their compute needs them."""
        units = self.stages.chunks[chunk]
        order = [u for u, _ in _pass_parts(units, kind) if u != ROOT]
        needed = [ROOT] if not self.root_gathered[chunk] and units.root_param_bytes > 0 else []
        return needed + (order if self.sharded[chunk] and kind != "W" else [])

    def recipe(
        self, step: Pass, *, last: bool, deps: tuple[int, ...] = ()
    ) -> tuple[tuple[Step, ...], Callable[[int], list[int]]] | None:
        """A pass's per-unit recipe with its gather/reduce marks, or None if it has none.

        ``deps`` are the pass's own dependencies (received activations): the root's pre-forward
        makes the all-gather streams wait for the compute stream, which waits for them.
        """
        units = self.stages.chunks[step.chunk]
        gathers = self._gathers(step.chunk, step.kind)
        reduce = last and self.stages.reduce_during_last_backward and step.kind != "F"
        if not gathers and not reduce:
            return None
        steps: list[Step] = []
        marks: list[tuple[str, int]] = []
        if ROOT in gathers:
            steps.append(MarkStep(index=len(marks)))
            marks.append(("wait", ROOT))
        for unit, recipe in _pass_parts(units, step.kind):
            if unit != ROOT and unit in gathers:
                steps.append(MarkStep(index=len(marks)))
                marks.append(("wait", unit))
            steps += recipe
            if reduce and unit != ROOT:
                steps.append(MarkStep(index=len(marks)))
                marks.append(("reduce", unit))
        if reduce:
            steps.append(MarkStep(index=len(marks)))
            marks.append(("reduce", ROOT))
        return tuple(steps), self._hook(step, gathers, marks, deps)

    def _hook(
        self, step: Pass, gathers: list[int], marks: list[tuple[str, int]], deps: tuple[int, ...]
    ) -> Callable[[int], list[int]]:
        """Issue AG(g) and prefetch AG(next) where g's compute starts; RS where grads are ready."""
        issued: dict[int, list[int]] = {}
        units = self.stages.chunks[step.chunk]
        tag = f"{step}"

        def issue(unit: int) -> None:
            if unit in issued:
                return
            if unit == ROOT:
                size, experts = units.root_param_bytes, 0.0
            else:
                size, _, experts, _ = units.sizes(unit)
            label = "root" if unit == ROOT else f"u{unit}"
            ready = self.b.after_compute(*deps, *self.expert_gather)  # one all-gather stream
            index = self.b.collective(f"AG {label} {tag}", "dp", "all_gather", size, deps=ready)
            issued[unit] = [] if index is None else [index]
            if experts > 0:  # an MoE unit's routed experts, next on the all-gather stream
                after = tuple(issued[unit]) or ready
                name = f"AG {label} experts {tag}"
                expert = self.b.collective(name, "edp", "all_gather", experts, deps=after)
                if expert is not None:
                    issued[unit].append(expert)
                    self.expert_gather = (expert,)

        def on_mark(i: int) -> list[int]:
            what, unit = marks[i]
            if what == "reduce":
                self.reduced += self._reduce_unit(step.chunk, unit, tag, [])
                return []
            position = gathers.index(unit)
            issue(unit)
            if position + 1 < len(gathers):
                issue(gathers[position + 1])
            return list(issued[unit])

        return on_mark

    def after_pass(self, step: Pass) -> None:
        """Shard state once a pass ran: forward reshards if asked, backward keeps unsharded."""
        if step.kind == "F":
            self.root_gathered[step.chunk] = True
            self.sharded[step.chunk] = self.stages.reshard_after_forward
        elif step.kind in ("B", "Bi"):
            self.sharded[step.chunk] = False

    def _reduce_unit(self, chunk: int, unit: int, tag: str, waits: list[int]) -> list[int]:
        units = self.stages.chunks[chunk]
        size, experts = units.root_grad_bytes, 0.0
        if unit != ROOT:
            _, size, _, experts = units.sizes(unit)
        label = f"{'root' if unit == ROOT else f'u{unit}'} c{chunk}" + (f" {tag}" if tag else "")
        issued = reduce_unit(self.b, label, size, [*waits, *self.expert_scatter])  # one stream
        if experts > 0:  # the routed experts' over edp, next on the reduce-scatter stream
            deps = tuple(issued[:1]) or self.b.after_compute(*waits, *self.expert_scatter)
            expert = self.b.collective(
                f"RS {label} experts", "edp", "reduce_scatter", experts, deps=deps
            )
            if expert is not None:
                issued.append(expert)
                self.expert_scatter = (expert,)
        return issued

    def reduce_grad(self, chunk: int, waits: list[int]) -> None:
        """Every unit's reduce-scatter after the chunk's last backward, root then layers in
        order: torch 2.13's REDUCE_GRAD; with ``reduce_before_send`` each after the compute
        stream waited for the one before (``FsdpStages.reduce_before_send``)."""
        if self.stages.reduce_during_last_backward:
            return
        units = self.stages.chunks[chunk]
        previous: tuple[str, list[int]] = ("", [])
        for unit in (ROOT, *range(units.num_units)):
            name, events = previous
            if self.stages.reduce_before_send and events:
                wait = Compute(name=f"wait RS {name} c{chunk}", duration_s=0.0, deps=tuple(events))
                self.b.add(wait)
            issued = self._reduce_unit(chunk, unit, "", waits)
            self.reduced += issued
            # the group's reduce-scatter event (recorded before HSDP's all-reduce); an MoE unit's
            # experts are an FSDP group of their own, reduced after the rest
            experts = unit != ROOT and units.sizes(unit)[3] > 0 and len(issued) > 1
            events = issued[-1:] if experts else issued[:1]
            previous = ("root" if unit == ROOT else f"u{unit}", events)
