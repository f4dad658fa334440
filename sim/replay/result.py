"""What a simulated training step produces: the timeline spans and the plan result.

``Span`` is one interval of work on one GPU stream (a compute kernel, a collective, a pipeline
send); a replay returns them in a ``Timeline`` that reports, traces and plots read. ``PlanResult``
is the answer of ``commsim plan``; ``to_json()`` gives the keys documented in the README.

    >>> span = Span(rank=0, stream="compute", name="F0", kind="compute", start_s=0.0, end_s=1.0)
    >>> span.duration_s
    1.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

SPAN_KINDS = ("compute", "collective", "p2p", "optimizer", "wait")
"""Kinds of work a span can be."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One interval of work on one rank's stream."""

    rank: int
    """Global rank of the GPU that ran it (the representative rank when folded)."""
    stream: str
    """Stream or queue it ran on: ``compute``, or a process group name (``tp``, ``dp``, ``pp``)."""
    name: str
    """Label, e.g. ``F3.c0`` (forward of micro-batch 3, chunk 0) or ``AG(unit 5)``."""
    kind: str
    """One of ``SPAN_KINDS``."""
    start_s: float
    """Start time in seconds from the step's start."""
    end_s: float
    """End time in seconds from the step's start."""
    size_bytes: float = 0.0
    """Bytes moved (communication spans), else 0."""
    group: str | None = None
    """Process-group name for communication spans."""
    op: str = ""
    """torch.distributed op of a collective span (``all_reduce``), else ''."""

    @property
    def duration_s(self) -> float:
        """End minus start, in seconds."""
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Breakdown:
    """Where one step's time goes on the critical rank."""

    compute_s: float
    """Time the compute stream was busy."""
    exposed_comm_s: dict[str, float]
    """Per process group: time the compute stream waited on that group's communication."""
    bubble_s: float
    """Pipeline bubble: compute-stream idle time not explained by communication."""
    optimizer_s: float = 0.0
    """Optimizer step (and its parameter all-gather when not overlapped)."""
    overlap_slowdown_s: float = 0.0
    """Part of compute_s and optimizer_s lost to communication running beside the compute."""
    host_s: float = 0.0
    """Time the compute stream waited for the host thread (framework Python and launch loops
    that the GPU could not run ahead of)."""
    in_step_slowdown_s: float = 0.0
    """Part of compute_s that is the in-step slowdown (``ComputeModel.in_step_slowdown``: the
    fitted multi-GPU factor, or a calibration's): the forward and backward kernels' time beyond
    their curves, a fraction s / (1 + s) of their modelled time."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """The prediction for one training step of a plan (``commsim plan --json``)."""

    step_time_s: float
    """Seconds per optimizer step (all micro-batches of the global batch)."""
    tokens_per_s: float
    """Global batch tokens / step time."""
    tflops_per_gpu: float
    """Model FLOPs per GPU per second / 1e12, FLOPs as named in ``flops_definition``."""
    mfu: float
    """tflops_per_gpu / the GPU's dense peak for the plan's precision."""
    flops_definition: str
    """How FLOPs were counted (e.g. "6N + attention, causal, no recompute")."""
    memory_gib: dict[str, float]
    """Peak memory per GPU by component (GiB = 2**30 B), with a ``total`` entry."""
    fits_in_memory: bool
    """Whether ``memory_gib['reserved']`` (the live peak plus the caching allocator's reserve)
    fits in the GPU's HBM."""
    breakdown: Breakdown
    """Compute, exposed communication per group and bubble on the critical rank."""
    num_gpus: int = 0
    """World size of the plan."""
    num_simulated_ranks: int = 0
    """Ranks actually simulated after folding symmetric ones."""
    spans: Sequence[Span] = field(default=(), repr=False)
    """The timeline (not part of the JSON; a replay's is built on first use: ``LazySpans``)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Further figures (e.g. micro-batch count, peak activation micro-batches)."""
    hfu: float = 0.0
    """Hardware FLOP utilisation: model FLOPs plus recomputation, over the dense peak."""
    basis: dict[str, str] = field(default_factory=dict)
    """What the figures rest on: ``compute``, ``network`` (defaults or calibrations), ``stack``."""
    bottleneck: str = ""
    """The largest share of the critical rank's step (or memory when the plan does not fit)."""
    offload: dict[str, Any] = field(default_factory=dict)
    """An offloading plan's host side (``sim.replay.offload.offload_summary``): PCIe and NVMe
    bytes per GPU per step, the CPU optimizer step, host memory per node and whether it fits;
    empty without offload."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object of ``commsim plan --json`` (keys as in DESIGN.md)."""
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "flops_definition": self.flops_definition,
            "memory_gib": dict(self.memory_gib),
            "fits_in_memory": self.fits_in_memory,
            "breakdown": {
                "compute_s": self.breakdown.compute_s,
                "exposed_comm_s": dict(self.breakdown.exposed_comm_s),
                "bubble_s": self.breakdown.bubble_s,
                "optimizer_s": self.breakdown.optimizer_s,
                "overlap_slowdown_s": self.breakdown.overlap_slowdown_s,
                "host_s": self.breakdown.host_s,
                "in_step_slowdown_s": self.breakdown.in_step_slowdown_s,
            },
            "bottleneck": self.bottleneck,
            "basis": dict(self.basis),
            "num_gpus": self.num_gpus,
            "num_simulated_ranks": self.num_simulated_ranks,
            **({"extra": dict(self.extra)} if self.extra else {}),
            **({"offload": dict(self.offload)} if self.offload else {}),
        }


class LazySpans(Sequence[Span]):
    """A replay's spans, built on first use: the step's figures need none of them, only the
    trace, the timeline plot and the reports that read them. Pickled as the tuple they are."""

    __slots__ = ("_build", "_spans")

    def __init__(self, build: Callable[[], tuple[Span, ...]]) -> None:
        self._build: Callable[[], tuple[Span, ...]] | None = build
        self._spans: tuple[Span, ...] | None = None

    def _all(self) -> tuple[Span, ...]:
        if self._spans is None:
            assert self._build is not None
            self._spans, self._build = self._build(), None
        return self._spans

    @overload
    def __getitem__(self, index: int) -> Span: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Span, ...]: ...

    def __getitem__(self, index: int | slice) -> Span | tuple[Span, ...]:
        return self._all()[index]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[Span]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return self._all() == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (tuple, (self._all(),))

    def __repr__(self) -> str:
        return f"LazySpans({len(self)} spans)"
