"""Whole-step programs of one rank: pipeline passes with their p2p and DP sync, or FSDP units.

``pipeline_program`` turns a pipeline order (``schedules.pipeline``) and per-chunk pass recipes
(``schedules.program``) into a rank's program: the point-to-point transfers between stages
(blocking batched send/recv as Megatron's non-interleaved schedule, or async as the interleaved
one), the data-parallel gradient sync of each chunk (``GradSync``: torch DDP buckets, Megatron
distributed optimizer, DeepSpeed ZeRO-1/2) and the optimizer step with its parameter gather.
``fsdp_program`` builds FSDP1 / ZeRO-3 steps unit by unit: the all-gathers with the 2-in-flight
rate limiter, backward prefetch, the reduce-scatters on the same FIFO and HSDP's all-reduce.

    program = pipeline_program(PipelineRank(rank=0, order=one_f_one_b(2, 4)[0], chunks=(w,)))
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from schedules.pipeline import Pass, RankOrder
from schedules.program import (
    ChunkWork,
    Compute,
    ComputeStep,
    MarkStep,
    Program,
    ProgramBuilder,
    Step,
    Transfer,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class GradSync:
    """How and when a rank reduces its gradients over data parallelism."""

    op: str = "all_reduce"
    """``all_reduce`` or ``reduce_scatter``; empty for no DP sync (dp = 1)."""
    bucketed: bool = True
    """Buckets fire as they become ready during the backward (else one call after it)."""
    every_microbatch: bool = False
    """Sync on every micro-batch (ZeRO-2) instead of only the last one per chunk."""
    at_end: bool = False
    """Issue every chunk's sync after the whole schedule (Megatron without overlap)."""
    depth_one: bool = False
    """Compute waits for the previous bucket when the next one is issued (DeepSpeed overlap)."""
    blocking: bool = False
    """Compute waits for every bucket right away (DeepSpeed without overlap_comm)."""
    param_gather: str = ""
    """Parameter all-gather: ``""`` none, ``after_step``, or ``overlapped`` (with the next
    forward: issued at the step's start, each chunk's first forward waits for it)."""


def grad_sync_for(
    kind: str,
    *,
    overlap_grad_reduce: bool = True,
    overlap_param_gather: bool = False,
    zero_overlap_comm: bool | None = None,
) -> GradSync:
    """The framework behaviour of a data-parallel kind (schedule_semantics §3, §4, §6)."""
    if kind == "ddp":
        return GradSync(op="all_reduce")
    if kind == "distributed_optimizer":
        gather = "overlapped" if overlap_param_gather else "after_step"
        return GradSync(
            op="reduce_scatter",
            bucketed=overlap_grad_reduce,
            at_end=not overlap_grad_reduce,
            param_gather=gather,
        )
    if kind in ("zero1", "zero2"):
        overlap = bool(zero_overlap_comm)
        return GradSync(
            op="all_reduce",
            bucketed=overlap or kind == "zero2",
            every_microbatch=kind == "zero2",
            depth_one=overlap,
            blocking=not overlap,
            param_gather="after_step",
        )
    raise ValueError(
        f"data_parallel={kind!r} has no pipeline grad sync; valid: ddp, distributed_optimizer, "
        "zero1, zero2 (fsdp, hsdp and zero3 use fsdp_program)"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineRank:
    """Everything one rank's pipeline step program depends on."""

    rank: int
    """Global rank."""
    order: RankOrder
    """Its passes, from ``schedules.pipeline``."""
    chunks: tuple[ChunkWork, ...]
    """Per model chunk: pass recipes and DP buckets."""
    stage: int = 0
    """Pipeline rank r."""
    pp: int = 1
    """Pipeline size p."""
    prev_rank: int | None = None
    """Global rank of pipeline rank r - 1 (mod p)."""
    next_rank: int | None = None
    """Global rank of pipeline rank r + 1 (mod p)."""
    p2p_bytes: float = 0.0
    """One activation (or its gradient) sent between stages."""
    blocking_p2p: bool = True
    """Batched send/recv waited before the next pass (non-interleaved) or async (interleaved)."""
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Process groups by name; ``dp`` is the gradient-reduction group."""
    sync: GradSync = GradSync(op="")
    """Data-parallel gradient sync."""
    optimizer_s: float = 0.0
    """Optimizer step time on this rank's shard."""


def with_marks(steps: tuple[Step, ...], sizes: tuple[float, ...]) -> tuple[Step, ...]:
    """Insert ``MarkStep(i)`` where bucket ``i`` is ready: after the compute fraction
    ``sum(sizes[: i + 1]) / sum(sizes)`` of the pass (gradients appear as the backward runs)."""
    total_s = sum(s.duration_s for s in steps if isinstance(s, ComputeStep))
    total_size = sum(sizes)
    cuts, acc = [], 0.0
    for size in sizes:
        acc += size
        cuts.append(total_s * acc / total_size if total_size > 0 else total_s)
    out: list[Step] = []
    done_s, i = 0.0, 0
    for step in steps:
        if not isinstance(step, ComputeStep):
            out.append(step)
            continue
        start_s, end_s = done_s, done_s + step.duration_s
        while i < len(cuts) and cuts[i] < end_s:
            piece = cuts[i] - start_s
            if piece > 0:
                out.append(ComputeStep(name=step.name, duration_s=piece))
            out.append(MarkStep(index=i))
            start_s, i = cuts[i], i + 1
        out.append(ComputeStep(name=step.name, duration_s=end_s - start_s))
        done_s = end_s
        while i < len(cuts) and cuts[i] <= done_s:
            out.append(MarkStep(index=i))
            i += 1
    out += [MarkStep(index=j) for j in range(i, len(cuts))]
    return tuple(out)


def _grad_passes(spec: PipelineRank) -> set[int]:
    """Positions in the order after which a chunk's gradients are synced."""
    every = spec.sync.every_microbatch
    last: dict[int, int] = {}
    chosen = set()
    for pos, step in enumerate(spec.order):
        if step.kind in ("B", "W"):
            last[step.chunk] = pos
            if every:
                chosen.add(pos)
    return chosen | set(last.values())


class _Pipeline:
    """Builds one rank's pipeline program (builder state, discarded once built)."""

    def __init__(self, spec: PipelineRank) -> None:
        self.spec = spec
        self.b = ProgramBuilder(rank=spec.rank, groups=dict(spec.groups))
        self.synced: list[int] = []
        self.num_vstages = spec.pp * len(spec.chunks)
        self.grad_passes = _grad_passes(spec)
        self.posted: dict[int, int] = {}
        self.batch: list[int] = []

    def sync_hook(self, sizes: tuple[float, ...], label: str) -> Callable[[int], list[int]]:
        """Issue bucket ``i`` at its mark; returns what compute must wait for (DeepSpeed)."""
        sync, issued = self.spec.sync, []

        def on_mark(i: int) -> list[int]:
            index = self.b.collective(
                f"{sync.op} {label} bucket {i}",
                "dp",
                sync.op,
                sizes[i],
                deps=self.b.after_compute(),
            )
            if index is None:
                return []
            issued.append(index)
            self.synced.append(index)
            if sync.blocking:
                return [index]
            return issued[-2:-1] if sync.depth_one else []

        return on_mark

    def transfer(
        self, kind: str, mb: int, vstage: int, *, send: bool, deps: tuple[int, ...]
    ) -> int:
        spec = self.spec
        peer = spec.next_rank if (kind == "F") == send else spec.prev_rank
        assert peer is not None
        src, dst = (spec.rank, peer) if send else (peer, spec.rank)
        verb = "send" if send else "recv"
        return self.b.add(
            Transfer(
                name=f"{verb} {kind}{mb} {src}->{dst}",
                src=src,
                dst=dst,
                tag=(kind, mb, vstage),
                size_bytes=spec.p2p_bytes,
                deps=deps,
            )
        )

    def needs_input(self, step: Pass) -> bool:
        """Whether a pass receives from a neighbour (W passes never do)."""
        vstage = step.chunk * self.spec.pp + self.spec.stage
        if step.kind == "W":
            return False
        return vstage > 0 if step.kind == "F" else vstage < self.num_vstages - 1

    def receive(self, pos: int, step: Pass) -> list[int]:
        """The receive a pass waits for: posted earlier with a batched exchange, or now."""
        if not self.needs_input(step):
            return []
        if pos in self.posted:
            return [self.posted.pop(pos)]
        deps = self.b.after_compute() if self.spec.blocking_p2p else ()
        vstage = step.chunk * self.spec.pp + self.spec.stage
        kind = "F" if step.kind == "F" else "B"
        return [self.transfer(kind, step.microbatch, vstage, send=False, deps=deps)]

    def send(self, pos: int, step: Pass, outstanding: list[int]) -> None:
        """Send a pass's output; blocking mode batches it with the next pass's receive."""
        spec, is_fwd = self.spec, step.kind == "F"
        vstage = step.chunk * spec.pp + spec.stage
        if step.kind == "W":
            return
        deps = self.b.after_compute(*outstanding)
        if vstage < self.num_vstages - 1 if is_fwd else vstage > 0:
            vnext = vstage + 1 if is_fwd else vstage - 1
            kind = "F" if is_fwd else "B"
            self.batch.append(self.transfer(kind, step.microbatch, vnext, send=True, deps=deps))
        if not spec.blocking_p2p:
            return
        later = (q for q in range(pos + 1, len(spec.order)) if spec.order[q].kind != "W")
        nxt = next(later, None)
        if nxt is not None and self.needs_input(spec.order[nxt]):
            nstep = spec.order[nxt]
            kind = "F" if nstep.kind == "F" else "B"
            nvstage = nstep.chunk * spec.pp + spec.stage
            self.posted[nxt] = self.transfer(kind, nstep.microbatch, nvstage, send=False, deps=deps)
            self.batch.append(self.posted[nxt])

    def recipe(self, pos: int, step: Pass) -> tuple[tuple[Step, ...], Callable | None]:
        """A pass's recipe, with bucket marks when its gradients are synced bucket by bucket."""
        work, sync = self.spec.chunks[step.chunk], self.spec.sync
        steps = {
            "F": work.forward,
            "B": work.backward,
            "Bi": work.backward_input,
            "W": work.backward_weight,
        }[step.kind]
        if pos in self.grad_passes and sync.op and sync.bucketed and not sync.at_end:
            marked = with_marks(steps, work.grad_buckets_bytes)
            return marked, self.sync_hook(work.grad_buckets_bytes, f"c{step.chunk}")
        return steps, None

    def build(self) -> Program:
        spec, b = self.spec, self.b
        gathers = self._param_gathers(issue_now=spec.sync.param_gather == "overlapped")
        outstanding: list[int] = []
        first_forward = set()
        for pos, step in enumerate(spec.order):
            deps = list(outstanding) + self.receive(pos, step)
            if step.kind == "F" and step.chunk not in first_forward:
                first_forward.add(step.chunk)
                deps += gathers.get(step.chunk, [])
            if spec.blocking_p2p:
                deps += self.batch
                self.batch = []
            steps, hook = self.recipe(pos, step)
            outstanding = b.run_steps(f"{step}", steps, tuple(deps), hook)
            if hook is not None and spec.sync.every_microbatch:
                outstanding += self.synced
            self.send(pos, step, outstanding)
            if pos in self.grad_passes and spec.sync.op and not spec.sync.bucketed:
                self._sync_whole(step.chunk, outstanding)
        if spec.sync.at_end:
            for chunk in range(len(spec.chunks)):
                self._sync_whole(chunk, outstanding)
        self._finish(sorted({*outstanding, *self.batch, *self.synced}), gathers)
        return b.program(stage=spec.stage)

    def _sync_whole(self, chunk: int, outstanding: list[int]) -> None:
        size = sum(self.spec.chunks[chunk].grad_buckets_bytes)
        sync = self.spec.sync
        index = self.b.collective(
            f"{sync.op} c{chunk} grads",
            "dp",
            sync.op,
            size,
            deps=self.b.after_compute(*outstanding),
        )
        if index is not None:
            self.synced.append(index)
            if sync.blocking:
                outstanding.append(index)

    def _param_gathers(self, *, issue_now: bool) -> dict[int, list[int]]:
        if not issue_now:
            return {}
        gathers = {}
        for chunk, work in enumerate(self.spec.chunks):
            index = self.b.collective(
                f"AG params c{chunk}", "dp", "all_gather", work.param_bytes, deps=()
            )
            gathers[chunk] = [] if index is None else [index]
        return gathers

    def _finish(self, waits: list[int], gathers: dict[int, list[int]]) -> None:
        spec, b = self.spec, self.b
        b.add(
            Compute(
                name="optimizer", duration_s=spec.optimizer_s, kind="optimizer", deps=tuple(waits)
            )
        )
        if spec.sync.param_gather != "after_step":
            return
        issued = [
            b.collective(
                f"AG params c{chunk}",
                "dp",
                "all_gather",
                work.param_bytes,
                deps=b.after_compute(),
                phase="optimizer",
            )
            for chunk, work in enumerate(spec.chunks)
        ]
        ready = tuple(i for i in issued if i is not None)
        if ready:
            b.add(Compute(name="params gathered", duration_s=0.0, kind="optimizer", deps=ready))


def pipeline_program(spec: PipelineRank) -> Program:
    """One rank's step: its pipeline passes, p2p transfers, DP sync and optimizer."""
    if spec.pp > 1 and (spec.prev_rank is None or spec.next_rank is None):
        raise ValueError(f"rank {spec.rank}: pp={spec.pp} needs prev_rank and next_rank")
    return _Pipeline(spec).build()


MAX_INFLIGHT_ALL_GATHERS = 2
"""FSDP1's ``_max_num_inflight_all_gathers``: the limiter's free-event queue threshold."""
NO_WORK = ChunkWork(forward=(), backward=())
"""A part of the model with nothing to run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpRank:
    """Everything one rank's FSDP1 / ZeRO-3 step program depends on (one unit per layer)."""

    rank: int
    """Global rank."""
    num_microbatches: int
    """Gradient-accumulation micro-batches."""
    num_units: int
    """Wrapped units (transformer layers); the root holds embedding, final norm and head."""
    layer: ChunkWork
    """One layer's forward/backward recipes."""
    unit_param_bytes: float
    """All-gather output of one unit."""
    unit_grad_bytes: float
    """Reduce-scatter input of one unit."""
    root_param_bytes: float = 0.0
    """All-gather output of the root unit."""
    root_grad_bytes: float = 0.0
    """Reduce-scatter input of the root unit."""
    embed: ChunkWork = NO_WORK
    """Embedding (start of forward, end of backward)."""
    head: ChunkWork = NO_WORK
    """Final norm, LM head and loss."""
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """``dp`` = the shard group; ``hsdp`` = the replicate group (HSDP), ``tp``/``cp`` as usual."""
    backward_prefetch: str = "backward_pre"
    """backward_pre | backward_post | none."""
    limit_all_gathers: bool = True
    """The rate limiter: an all-gather waits until at most one other unit is unsharded."""
    reshard_after_forward: bool = True
    """FULL_SHARD (True: backward all-gathers again) or SHARD_GRAD_OP (False)."""
    optimizer_s: float = 0.0
    """Optimizer step on the local shard."""


def fsdp_program(spec: FsdpRank) -> Program:
    """One rank's FSDP1 step (reference §1): per micro-batch a forward and a backward by unit.

    Forward: AG(root), then AG(u) before F(u). Backward: the root is not resharded after forward
    (no AG); BACKWARD_PRE issues AG(u - 1) before B(u), BACKWARD_POST after it (before RS(u)),
    ``none`` at u - 1's own pre-backward; RS(u) follows B(u) on the same FIFO, giving AG(u),
    RS(u+1), AG(u-1), RS(u)... The rate limiter is modelled literally: every reshard that frees
    memory records an event on the compute stream, and an AG is issued only once at most one
    such event is pending (the older ones are waited for).
    """
    builder = _Fsdp(spec)
    outstanding: list[int] = []
    for mb in range(spec.num_microbatches):
        outstanding = builder.forward(mb, outstanding)
        outstanding = builder.backward(mb, outstanding)
    b = builder.b
    b.add(
        Compute(
            name="optimizer",
            duration_s=spec.optimizer_s,
            kind="optimizer",
            deps=tuple(sorted({*outstanding, *builder.reduced})),
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

    def gather(self, name: str, size: float, deps: tuple[int, ...] = ()) -> list[int]:
        """All-gather on the shard FIFO, after the rate limiter lets it through."""
        waits = list(deps)
        while self.spec.limit_all_gathers and len(self.frees) >= MAX_INFLIGHT_ALL_GATHERS:
            waits.append(self.frees.popleft())
        index = self.b.collective(name, "dp", "all_gather", size, deps=tuple(sorted(set(waits))))
        return [] if index is None else [index]

    def free(self) -> None:
        """A reshard after the latest compute: its free event joins the limiter's queue."""
        if self.spec.limit_all_gathers and self.b.last_compute is not None:
            self.frees.append(self.b.last_compute)

    def forward(self, mb: int, waits: list[int]) -> list[int]:
        spec, b = self.spec, self.b
        start = b.after_compute()
        root = self.gather(f"AG root mb{mb}", spec.root_param_bytes, start)
        waits = b.run_steps(f"F{mb} embed", spec.embed.forward, (*waits, *root))
        for u in range(spec.num_units):
            ag = self.gather(f"AG u{u} mb{mb}", spec.unit_param_bytes, start)
            waits = b.run_steps(f"F{mb} u{u}", spec.layer.forward, (*waits, *ag))
            if spec.reshard_after_forward:
                self.free()
        return b.run_steps(f"F{mb} head", spec.head.forward, tuple(waits))

    def backward(self, mb: int, waits: list[int]) -> list[int]:
        spec, b, n = self.spec, self.b, self.spec.num_units
        regather, prefetch = spec.reshard_after_forward, spec.backward_prefetch
        gathers: dict[int, list[int]] = {}
        if regather and prefetch != "none" and n > 0:
            gathers[n - 1] = self.gather(f"AG u{n - 1} mb{mb} bwd", spec.unit_param_bytes)
        waits = b.run_steps(f"B{mb} head", spec.head.backward, tuple(waits))
        for u in range(n - 1, -1, -1):
            if regather and u not in gathers:
                gathers[u] = self.gather(f"AG u{u} mb{mb} bwd", spec.unit_param_bytes)
            if regather and prefetch == "backward_pre" and u > 0:
                gathers[u - 1] = self.gather(f"AG u{u - 1} mb{mb} bwd", spec.unit_param_bytes)
            waits = b.run_steps(f"B{mb} u{u}", spec.layer.backward, (*waits, *gathers.get(u, [])))
            self.free()
            if regather and prefetch == "backward_post" and u > 0:
                gathers[u - 1] = self.gather(f"AG u{u - 1} mb{mb} bwd", spec.unit_param_bytes)
            self.reduced += _reduce(b, f"u{u} mb{mb}", spec.unit_grad_bytes, waits)
        waits = b.run_steps(f"B{mb} embed", spec.embed.backward, tuple(waits))
        self.reduced += _reduce(b, f"root mb{mb}", spec.root_grad_bytes, waits)
        return waits


def _reduce(b: ProgramBuilder, label: str, size: float, waits: list[int]) -> list[int]:
    """RS of a unit's gradient on the shard FIFO, then HSDP's all-reduce of the shard."""
    rs = b.collective(f"RS {label}", "dp", "reduce_scatter", size, deps=b.after_compute(*waits))
    out = [] if rs is None else [rs]
    shard = len(b.groups.get("dp", ())) or 1
    ar = b.collective(
        f"AR {label}",
        "hsdp",
        "all_reduce",
        size / shard,
        deps=tuple(out) or b.after_compute(*waits),
    )
    return out + ([] if ar is None else [ar])
