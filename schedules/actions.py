"""Per-rank programs: the ordered actions one GPU runs in a training step, with their dependencies.

A ``Program`` is a tuple of actions of three kinds: ``Compute`` (on the rank's compute stream, in
program order), ``Collective`` (on the FIFO of its process group, in program order; it starts once
every member has issued it) and ``Transfer`` (a point-to-point send/recv, matched between the two
ranks by its tag). ``deps`` are indices of earlier actions of the same program that must finish
first: that is how streams wait on each other (CUDA events, blocking waits, issue points).

This module holds the data types, the pass steps (``ComputeStep``, ``CommStep``, ``MarkStep``)
and the ``ProgramBuilder`` that turns them into actions; the per-pass recipes of tensor/sequence
parallelism are ``schedules.tp_steps``, the process-group layout (Megatron's tp-cp-dp-pp rank
order) is ``schedules.layout``. The step programs (pipeline with DP sync, FSDP) are built from
them in ``schedules.pipeline_program``.

    builder = ProgramBuilder(rank=0, groups={"tp": (0, 1)})
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

GROUPS = ("tp", "cp", "dp", "hsdp", "pp", "ep", "etp", "edp", "tpep")
GRAD_NORM_BYTES = 8.0
"""The step-end all-reduce before the optimizer (``clip_grad_norm_``, Megatron's norm and
found-inf check): an fp32 squared gradient norm and an fp32 found-inf flag, latency-bound."""
"""Process-group names used by programs (``pp`` for point-to-point transfers)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Compute:
    """Work on the rank's compute stream (kernels run one after another in program order), or on
    its host thread (``stream="host"``: framework Python and launch loops, one after another)."""

    name: str
    """Label, e.g. ``F3.c0``."""
    duration_s: float
    """Busy time of the compute stream."""
    deps: tuple[int, ...] = ()
    """Earlier actions (indices in the program) that must finish before it starts."""
    kind: str = "compute"
    """``compute``, ``optimizer`` (counted apart in the breakdown) or ``host``."""
    stream: str = "compute"
    """``compute`` (the GPU's compute stream) or ``host`` (the rank's CPU thread: a compute that
    waits for it is charged to the host in the breakdown)."""
    launch_s: float = 0.0
    """Host time to launch its kernels (compute stream only): the rank's host thread issues
    them in program order, running ahead of the GPU, which waits when the host is behind."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Collective:
    """A collective on one process group; same-group collectives run one at a time, in order."""

    name: str
    """Label, e.g. ``AR(bucket 2)``."""
    group: str
    """Process-group name (``tp``, ``cp``, ``dp``, ``hsdp``)."""
    ranks: tuple[int, ...]
    """Global ranks of the whole group (the communicator; timed on all of them)."""
    op: str
    """torch.distributed op name (vocab.collectives.OPS)."""
    size_bytes: float
    """Message size with nccl-tests' semantics."""
    repeat: int = 1
    """Back-to-back identical calls this action stands for (aggregated layers)."""
    deps: tuple[int, ...] = ()
    """Earlier actions that must finish before it is issued."""
    phase: str = ""
    """``optimizer`` for the post-step parameter gather (counted with the optimizer); ``p2p``
    for the TP all-gather completing a scatter-gather pipeline receive (counted with ``pp``)."""
    sm_free: bool = False
    """It moves its data with the copy engines and takes no SMs: the compute beside it keeps its
    rate (Transformer Engine's ring-exchange userbuffers, ``TE_RING_EXCHANGE_ON_COPY_ENGINES``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer:
    """One point-to-point message; the sender and the receiver both list it with the same tag."""

    name: str
    """Label, e.g. ``send F3 -> 5``."""
    src: int
    """Sending global rank."""
    dst: int
    """Receiving global rank."""
    tag: Hashable
    """Identifies the message on both sides, e.g. ``("F", 3, 1)`` (kind, micro-batch, stage)."""
    size_bytes: float
    """Message size."""
    deps: tuple[int, ...] = ()
    """On the sender: what produces the data; on the receiver: when the receive is posted."""


Action = Compute | Collective | Transfer
"""Anything a program does."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Program:
    """The ordered actions of one global rank for one training step."""

    rank: int
    """Global rank."""
    actions: tuple[Action, ...]
    """Actions; deps point to lower indices."""
    stage: int = 0
    """Pipeline rank (for reports and traces)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeStep:
    """A stretch of compute-stream work inside a pass."""

    name: str
    """Label suffix, e.g. ``fwd`` or ``wgrad qkv``."""
    duration_s: float
    """Busy time."""
    launch_s: float = 0.0
    """Host time to launch its kernels (``Compute.launch_s``)."""

    def part(self, duration_s: float) -> ComputeStep:
        """The first ``duration_s`` of this step, with its share of the launch time."""
        share = duration_s / self.duration_s if self.duration_s > 0 else 0.0
        return ComputeStep(name=self.name, duration_s=duration_s, launch_s=self.launch_s * share)


@dataclass(frozen=True, slots=True, kw_only=True)
class CommStep:
    """A collective inside a pass, issued after the preceding compute step."""

    name: str
    """Label suffix, e.g. ``AR``."""
    group: str
    """Process-group name the collective runs on (``tp``, ``cp``)."""
    op: str
    """Collective op."""
    size_bytes: float
    """Message size (nccl-tests semantics)."""
    repeat: int = 1
    """Back-to-back identical calls (one per layer and occurrence)."""
    overlap: bool = False
    """False: the next compute step waits for it (critical path). True: it runs beside the
    next compute step, and the one after that waits for it (async dgrad collectives)."""
    sm_free: bool = False
    """It runs on the copy engines and takes no SMs, so it does not slow the compute beside it
    (``Collective.sm_free``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostStep:
    """Host-thread work inside a pass that starts once the GPU has run everything before it (a
    device synchronisation and what the host does after it before it launches again): nothing
    after it, kernel or collective, starts before it ends."""

    name: str
    """Label suffix, e.g. ``moe sync``."""
    duration_s: float
    """Host time from the moment the GPU is done."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MarkStep:
    """A point inside a pass where something else is issued (e.g. a gradient bucket is ready)."""

    index: int
    """Which mark (e.g. the bucket number)."""


Step = ComputeStep | CommStep | HostStep | MarkStep
"""One element of a pass recipe."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkWork:
    """What one model chunk of one rank runs per micro-batch, as step recipes, plus its DP state."""

    forward: tuple[Step, ...]
    """Forward pass."""
    backward: tuple[Step, ...]
    """Full backward (input and weight gradients, recompute included)."""
    backward_input: tuple[Step, ...] = ()
    """Zero-bubble input-gradient pass (Bi)."""
    backward_weight: tuple[Step, ...] = ()
    """Zero-bubble weight-gradient pass (W)."""
    grad_buckets_bytes: tuple[float, ...] = ()
    """DP gradient buckets of this chunk in ready order (last layers first), reduce dtype."""
    param_bytes: float = 0.0
    """This chunk's parameter bytes (post-step all-gather output)."""
    grad_bucket_groups: tuple[str, ...] = ()
    """Group each bucket is reduced on (``dp``, or ``edp`` for routed-expert gradients); empty
    means every bucket on ``dp``."""
    expert_param_bytes: float = 0.0
    """Part of ``param_bytes`` that is routed experts (gathered over ``edp``)."""

    def bucket_group(self, index: int) -> str:
        """Group of gradient bucket ``index``."""
        return self.grad_bucket_groups[index] if self.grad_bucket_groups else "dp"


@dataclass(slots=True)
class ProgramBuilder:
    """Appends actions and tracks what the compute stream must wait for next (builder state)."""

    rank: int
    """Global rank being built."""
    groups: dict[str, tuple[int, ...]]
    """Process-group ranks by name (``tp``, ``cp``, ``dp``, ...)."""
    actions: list[Action] = field(default_factory=list)
    """Actions so far."""
    last_compute: int | None = None
    """Index of the latest compute action."""

    def add(self, action: Action) -> int:
        """Append an action; returns its index."""
        self.actions.append(action)
        index = len(self.actions) - 1
        if isinstance(action, Compute) and action.stream == "compute":
            self.last_compute = index
        return index

    def after_compute(self, *extra: int) -> tuple[int, ...]:
        """Deps for something issued now: the latest compute plus ``extra``."""
        base = () if self.last_compute is None else (self.last_compute,)
        if not extra:
            return base
        return tuple(sorted({*base, *extra}))

    def collective(
        self,
        name: str,
        group: str,
        op: str,
        size_bytes: float,
        *,
        deps: tuple[int, ...],
        repeat: int = 1,
        phase: str = "",
        sm_free: bool = False,
    ) -> int | None:
        """Add a collective on a named group; ``None`` (nothing added) for a one-rank group."""
        ranks = self.groups.get(group, ())
        if len(ranks) < 2 or repeat < 1 or size_bytes <= 0:
            return None
        return self.add(
            Collective(
                name=name,
                group=group,
                ranks=ranks,
                op=op,
                size_bytes=size_bytes,
                repeat=repeat,
                deps=deps,
                phase=phase,
                sm_free=sm_free,
            )
        )

    def run_steps(
        self,
        label: str,
        steps: tuple[Step, ...],
        deps: tuple[int, ...] = (),
        on_mark: Callable[[int], list[int]] | None = None,
    ) -> list[int]:
        """Append a pass recipe; returns the collectives the next compute must still wait for.

        ``deps`` gate the pass's first compute and any collective before it. At a ``MarkStep``
        ``on_mark(index)`` issues what is due there and returns what the next compute waits for.
        """
        waits, lead = list(deps), list(deps)
        hidden: list[int] = []
        for step in steps:
            if isinstance(step, ComputeStep):
                self.add(
                    Compute(
                        name=f"{label} {step.name}",
                        duration_s=step.duration_s,
                        deps=tuple(waits) if len(waits) < 2 else tuple(sorted(set(waits))),
                        launch_s=step.launch_s,
                    )
                )
                waits, hidden, lead = hidden, [], []
            elif isinstance(step, CommStep):
                issued = self.collective(
                    f"{label} {step.name}",
                    step.group,
                    step.op,
                    step.size_bytes,
                    repeat=step.repeat,
                    deps=self.after_compute(*lead),
                    sm_free=step.sm_free,
                )
                if issued is not None:
                    (hidden if step.overlap else waits).append(issued)
            elif isinstance(step, HostStep):
                if step.duration_s > 0:
                    synced = self.add(
                        Compute(
                            name=f"{label} {step.name}",
                            duration_s=step.duration_s,
                            kind="host",
                            stream="host",
                            deps=self.after_compute(*waits, *lead),
                        )
                    )
                    waits, lead = [synced], [synced]
            elif on_mark is not None:
                waits += on_mark(step.index)
        return sorted({*waits, *hidden})

    def grad_norm(self, group: str, deps: tuple[int, ...]) -> list[int]:
        """Issue the step-end gradient-norm all-reduce on ``group`` after ``deps``; returns its
        index to wait for (none for an empty or one-rank group)."""
        if not group:
            return []
        index = self.collective(
            "AR grad norm", group, "all_reduce", GRAD_NORM_BYTES, deps=deps, phase="optimizer"
        )
        return [] if index is None else [index]

    def program(self, stage: int = 0) -> Program:
        """The finished program."""
        return Program(rank=self.rank, actions=tuple(self.actions), stage=stage)
