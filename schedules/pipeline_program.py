"""Whole-step programs of one rank: pipeline passes with their p2p and DP sync, or FSDP units.

``pipeline_program`` turns a pipeline order (``schedules.pipeline_schedules``) and per-chunk
pass recipes (``schedules.actions``) into a rank's program: the point-to-point transfers between
stages (blocking batched send/recv as Megatron's non-interleaved schedule, or async as the
interleaved one), the data-parallel gradient sync of each chunk (``GradSync``: torch DDP
buckets, Megatron distributed optimizer, DeepSpeed ZeRO-1/2) and the optimizer step with its
parameter gather.
With ``PipelineRank.fsdp`` the chunks are FSDP2 units instead (``schedules.fsdp_program``): their
all-gathers and reduce-scatters join the passes as torch.distributed.pipelining issues them. The
non-pipelined FSDP1 / ZeRO-3 step is ``schedules.fsdp_program.fsdp_program``.

    program = pipeline_program(PipelineRank(rank=0, order=one_f_one_b(2, 4)[0], chunks=(w,)))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from schedules.actions import (
    ChunkWork,
    Compute,
    ComputeStep,
    MarkStep,
    Program,
    ProgramBuilder,
    Step,
    Transfer,
)
from schedules.fsdp_program import FsdpPipelineState, FsdpStages
from schedules.grad_sync import GradSync
from schedules.offload import RankOffload, add_copies
from schedules.pipeline import Pass, RankOrder


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
    scatter_gather_p2p: bool = False
    """Megatron's scatter-gather p2p: each TP rank sends 1/t of the activation and the receiver
    all-gathers the full tensor over ``tp`` before using it."""
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Process groups by name; ``dp`` is the gradient-reduction group."""
    sync: GradSync = GradSync(op="")
    """Data-parallel gradient sync."""
    optimizer_s: float = 0.0
    """Optimizer step time on this rank's shard."""
    fsdp: FsdpStages | None = None
    """FSDP2 units of every chunk (then ``sync`` is empty: the units gather and reduce)."""
    tied_embedding_grad_bytes: float = 0.0
    """Word-embedding gradient all-reduced over ``embd`` (first and last stage, which both hold
    a copy of a tied embedding under PP) before the optimizer, as Megatron does; 0: none."""
    grad_norm_group: str = ""
    """Group of the step-end all-reduce of the gradient norm (and found-inf flag) that every
    stage waits for before its optimizer step (Megatron, torchtitan under PP); empty: none."""
    offload: RankOffload | None = None
    """Host copies of an offloaded optimizer (``schedules.offload``): after each gradient
    bucket's reduction (on its stream, before the next bucket's) and after the CPU step."""
    combined: dict[tuple[int, int], tuple[Step, ...]] = field(default_factory=dict)
    """Recipes of the order's ``FB`` passes by (forward chunk, backward chunk): a forward and
    another micro-batch's backward interleaved (``sim.replay.combined``); their backward
    compute steps are named ``COMBINED_BACKWARD_PREFIX`` first."""


COMBINED_BACKWARD_PREFIX = "b "
"""Name prefix of a combined pass's backward compute steps (``PipelineRank.combined``)."""


def with_marks(
    steps: tuple[Step, ...], sizes: tuple[float, ...], prefix: str = ""
) -> tuple[Step, ...]:
    """Insert ``MarkStep(i)`` where bucket ``i`` is ready: after the compute fraction
    ``sum(sizes[: i + 1]) / sum(sizes)`` of the pass (gradients appear as the backward runs);
    with ``prefix``, of its compute steps so named only (a combined pass's backward)."""

    def counted(step: Step) -> bool:
        return isinstance(step, ComputeStep) and step.name.startswith(prefix)

    total_s = sum(s.duration_s for s in steps if isinstance(s, ComputeStep) and counted(s))
    total_size = sum(sizes)
    cuts, acc = [], 0.0
    for size in sizes:
        acc += size
        cuts.append(total_s * acc / total_size if total_size > 0 else total_s)
    out: list[Step] = []
    done_s, i = 0.0, 0
    for step in steps:
        if not isinstance(step, ComputeStep) or not counted(step):
            out.append(step)
            continue
        start_s, end_s = done_s, done_s + step.duration_s
        while i < len(cuts) and cuts[i] < end_s:
            piece = cuts[i] - start_s
            if piece > 0:
                out.append(step.part(piece))
            out.append(MarkStep(index=i))
            start_s, i = cuts[i], i + 1
        out.append(step.part(end_s - start_s))
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
        backward = step.backward
        if backward is not None and backward.kind in ("B", "W"):
            last[backward.chunk] = pos
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
        self.fsdp = FsdpPipelineState(self.b, spec.fsdp) if spec.fsdp else None

    def sync_hook(
        self, work: ChunkWork, label: str, microbatch: int = 0
    ) -> Callable[[int], list[int]]:
        """Issue bucket ``i`` at its mark; returns what compute must wait for (DeepSpeed)."""
        sync, sizes = self.spec.sync, work.grad_buckets_bytes
        issued: list[int] = []
        copied = self.spec.offload is not None  # host copies share the reduction stream

        def on_mark(i: int) -> list[int]:
            index = self.b.collective(
                f"{sync.op} {label} bucket {i}",
                work.bucket_group(i),
                sync.op,
                sizes[i],
                deps=self.b.after_compute(*(issued[-1:] if copied else ())),
            )
            index = self.offload_copies(f"{label} bucket {i}", sizes[i], index, microbatch)
            if index is None:
                return []
            issued.append(index)
            self.synced.append(index)
            if sync.blocking:
                return [index]
            return issued[-2:-1] if sync.depth_one else []

        return on_mark

    def offload_copies(
        self, label: str, size: float, reduced: int | None, microbatch: int
    ) -> int | None:
        """The host copies after a gradient reduction (after the backward so far when there is
        no reduction: one rank); returns the last one, or ``reduced`` without offload."""
        offload = self.spec.offload
        if offload is None:
            return reduced
        deps = (reduced,) if reduced is not None else self.b.after_compute()
        last = add_copies(self.b, label, offload.bucket(size, microbatch), deps)
        return reduced if last is None else last

    def transfer(
        self, kind: str, mb: int, vstage: int, *, send: bool, deps: tuple[int, ...]
    ) -> int:
        spec = self.spec
        peer = spec.next_rank if (kind == "F") == send else spec.prev_rank
        assert peer is not None
        src, dst = (spec.rank, peer) if send else (peer, spec.rank)
        verb = "send" if send else "recv"
        split = len(spec.groups.get("tp", ())) if spec.scatter_gather_p2p else 1
        index = self.b.add(
            Transfer(
                name=f"{verb} {kind}{mb} {src}->{dst}",
                src=src,
                dst=dst,
                tag=(kind, mb, vstage),
                size_bytes=spec.p2p_bytes / max(split, 1),
                deps=deps,
            )
        )
        if send or split < 2:
            return index
        gathered = self.b.collective(
            f"recv {kind}{mb} all_gather",
            "tp",
            "all_gather",
            spec.p2p_bytes,
            deps=(index,),
            phase="p2p",
        )
        return index if gathered is None else gathered

    def needs_input(self, step: Pass) -> bool:
        """Whether a pass receives from a neighbour (W passes never do)."""
        vstage = step.chunk * self.spec.pp + self.spec.stage
        if step.kind == "W":
            return False
        return vstage > 0 if step.kind == "F" else vstage < self.num_vstages - 1

    def receive(self, pos: int, step: Pass) -> list[int]:
        """The receive a pass waits for: posted earlier with a batched exchange, or now (both
        halves' of a combined pass)."""
        if step.kind == "FB":
            assert step.forward is not None and step.paired is not None
            return [*self.receive(pos, step.forward), *self.receive(pos, step.paired)]
        if not self.needs_input(step):
            return []
        if pos in self.posted:
            return [self.posted.pop(pos)]
        deps = self.b.after_compute() if self.spec.blocking_p2p else ()
        vstage = step.chunk * self.spec.pp + self.spec.stage
        kind = "F" if step.kind == "F" else "B"
        return [self.transfer(kind, step.microbatch, vstage, send=False, deps=deps)]

    def send(self, pos: int, step: Pass, outstanding: list[int]) -> None:
        """Send a pass's output; blocking mode batches it with the next pass's receive (a
        combined pass, run without blocking exchanges, sends both halves' outputs)."""
        if step.kind == "FB":
            assert step.forward is not None and step.paired is not None
            self.send(pos, step.forward, outstanding)
            self.send(pos, step.paired, outstanding)
            return
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

    def recipe(
        self, pos: int, step: Pass, deps: tuple[int, ...] = ()
    ) -> tuple[tuple[Step, ...], Callable | None]:
        """A pass's recipe, with bucket marks when its gradients are synced bucket by bucket."""
        work, sync = self.spec.chunks[step.chunk], self.spec.sync
        if step.kind == "FB":
            assert step.paired is not None
            work = self.spec.chunks[step.paired.chunk]
            steps = self.spec.combined[(step.chunk, step.paired.chunk)]
            if pos in self.grad_passes and sync.op and sync.bucketed and not sync.at_end:
                marked = with_marks(steps, work.grad_buckets_bytes, COMBINED_BACKWARD_PREFIX)
                label = f"c{step.paired.chunk}"
                return marked, self.sync_hook(work, label, step.paired.microbatch)
            return steps, None
        if self.fsdp is not None:
            units = self.fsdp.recipe(step, last=pos in self.grad_passes, deps=deps)
            if units is not None:
                return units
        steps = {
            "F": work.forward,
            "B": work.backward,
            "Bi": work.backward_input,
            "W": work.backward_weight,
        }[step.kind]
        if pos in self.grad_passes and sync.op and sync.bucketed and not sync.at_end:
            marked = with_marks(steps, work.grad_buckets_bytes)
            return marked, self.sync_hook(work, f"c{step.chunk}", step.microbatch)
        return steps, None

    def build(self) -> Program:
        spec, b = self.spec, self.b
        gathers = self._param_gathers(issue_now=spec.sync.param_gather == "overlapped")
        outstanding: list[int] = []
        first_forward = set()
        for pos, step in enumerate(spec.order):
            deps = list(outstanding) + self.receive(pos, step)
            if step.forward is not None and step.chunk not in first_forward:
                first_forward.add(step.chunk)
                deps += gathers.get(step.chunk, [])
            if spec.blocking_p2p:
                deps += self.batch
                self.batch = []
            steps, hook = self.recipe(pos, step, tuple(deps))
            outstanding = b.run_steps(f"{step}", steps, tuple(deps), hook)
            if hook is not None and spec.sync.every_microbatch:
                outstanding += self.synced
            before_send = self.fsdp is not None and self.fsdp.stages.reduce_before_send
            if before_send and pos in self.grad_passes:
                assert self.fsdp is not None
                self.fsdp.reduce_grad(step.chunk, [*outstanding])
            self.send(pos, step, outstanding)
            whole = spec.sync.op and not spec.sync.bucketed and not spec.sync.at_end
            if pos in self.grad_passes and whole:
                backward = step.backward
                self._sync_whole(step.chunk if backward is None else backward.chunk, outstanding)
            if self.fsdp is not None:
                self.fsdp.after_pass(step)
                if pos in self.grad_passes and not before_send:
                    self.fsdp.reduce_grad(step.chunk, [*outstanding, *self.batch])
        if spec.sync.at_end:
            for chunk in range(len(spec.chunks)):
                self._sync_whole(chunk, outstanding)
        if self.fsdp is not None:
            self.synced += self.fsdp.reduced
        self._finish(sorted({*outstanding, *self.batch, *self.synced}), gathers)
        return b.program(stage=spec.stage)

    def _sync_whole(self, chunk: int, outstanding: list[int]) -> None:
        work, sync = self.spec.chunks[chunk], self.spec.sync
        sizes: dict[str, float] = {}
        for i, size in enumerate(work.grad_buckets_bytes):
            sizes[work.bucket_group(i)] = sizes.get(work.bucket_group(i), 0.0) + size
        deps = self.b.after_compute(*outstanding)
        for group, size in sizes.items():
            name = f"{sync.op} c{chunk} grads" + ("" if group == "dp" else f" ({group})")
            index = self.b.collective(name, group, sync.op, size, deps=deps)
            last = self.spec.offload.num_micro - 1 if self.spec.offload else 0
            index = self.offload_copies(f"c{chunk} grads", size, index, last)
            if index is not None:
                self.synced.append(index)
                if sync.blocking:
                    outstanding.append(index)

    def _param_gathers(self, *, issue_now: bool) -> dict[int, list[int]]:
        if not issue_now:
            return {}
        gathers = {}
        for chunk, work in enumerate(self.spec.chunks):
            gathers[chunk] = self._gather_params(chunk, work, deps=(), phase="")
        return gathers

    def _gather_params(
        self, chunk: int, work: ChunkWork, *, deps: tuple[int, ...], phase: str
    ) -> list[int]:
        """All-gather a chunk's updated parameters: dense over dp, routed experts over edp."""
        parts = (
            ("dp", work.param_bytes - work.expert_param_bytes),
            ("edp", work.expert_param_bytes),
        )
        issued = []
        for group, size in parts:
            suffix = "" if group == "dp" else f" ({group})"
            index = self.b.collective(
                f"AG params c{chunk}{suffix}", group, "all_gather", size, deps=deps, phase=phase
            )
            issued += [] if index is None else [index]
        return issued

    def _finish(self, waits: list[int], gathers: dict[int, list[int]]) -> None:
        spec, b = self.spec, self.b
        if spec.tied_embedding_grad_bytes > 0:
            tied = b.collective(
                "AR tied embedding grads",
                "embd",
                "all_reduce",
                spec.tied_embedding_grad_bytes,
                deps=tuple(waits),
                phase="optimizer",
            )
            waits = [*waits, *([] if tied is None else [tied])]
        waits = [*waits, *b.grad_norm(spec.grad_norm_group, tuple(waits))]
        optimizer = b.add(
            Compute(
                name="optimizer", duration_s=spec.optimizer_s, kind="optimizer", deps=tuple(waits)
            )
        )
        if spec.offload is not None:
            copied = add_copies(b, "params", spec.offload.step(), (optimizer,), phase="optimizer")
            if copied is not None:
                b.add(
                    Compute(name="params copied", duration_s=0.0, kind="optimizer", deps=(copied,))
                )
        if spec.sync.param_gather != "after_step":
            return
        ready = tuple(
            index
            for chunk, work in enumerate(spec.chunks)
            for index in self._gather_params(chunk, work, deps=b.after_compute(), phase="optimizer")
        )
        if ready:
            b.add(Compute(name="params gathered", duration_s=0.0, kind="optimizer", deps=ready))


def pipeline_program(spec: PipelineRank) -> Program:
    """One rank's step: its pipeline passes, p2p transfers, DP sync and optimizer."""
    if spec.pp > 1 and (spec.prev_rank is None or spec.next_rank is None):
        raise ValueError(f"rank {spec.rank}: pp={spec.pp} needs prev_rank and next_rank")
    if spec.fsdp is not None and len(spec.fsdp.chunks) != len(spec.chunks):
        raise ValueError(
            f"rank {spec.rank}: {len(spec.fsdp.chunks)} FSDP chunks for {len(spec.chunks)} chunks"
        )
    return _Pipeline(spec).build()
