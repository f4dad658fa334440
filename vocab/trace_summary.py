"""One training step of a torch.profiler trace, summed as ``commbench --step`` sums its profile.

``vocab.kineto`` reads the file and finds the step; this module sums the GPU work launched in it:
time by kernel class (each kernel's duration, as ``commbench --step``), busy time (the union of
the intervals: side streams counted once), idle time (the step's wall time less busy), busy time
per phase; the host's launch calls and its time per launch (the step's host span less the time
the host sat in synchronising calls, over the launches: a profiled figure, the profiler's own
cost included); the (m, n, k) of the GEMMs whose operator recorded its input shapes; NCCL kernels
per collective (torch.distributed names) with the message bytes newer PyTorch records on them;
and what could not be classified (class ``other``) or placed (no launch call found, so its phase
comes from its GPU time).

A CPU-only trace (``device="cpu"``) is summed from its ATen operators' self times instead, as
``commbench --step`` does on a CPU.

    step = read_step("trace.json.gz"); step.classes_s["gemm"], step.host_s_per_launch
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vocab.kernel_classes import CLASSES, busy_time_s, kernel_gap_s
from vocab.kineto import (
    LAUNCH_CATEGORIES,
    PHASES,
    Activity,
    StepWindow,
    Trace,
    load_trace,
    operator_work,
    training_step,
)

US = 1e-6
"""Seconds per trace microsecond."""
DTYPE_BYTES = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int": 4, "long": 8,
               "byte": 1, "char": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}  # fmt: skip
"""Bytes per element of the dtype names PyTorch records on collectives (lower-cased)."""
GEMM_WRAPPERS = frozenset({"aten::linear", "aten::matmul"})
"""Operators that call a GEMM operator (``aten::mm``, ``aten::addmm``) rather than being one: a
CPU trace's work lists both, and the call is counted once."""
_NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
_NCCL_OPS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter":
             "reduce_scatter", "alltoall": "all_to_all", "broadcast": "broadcast",
             "reduce": "reduce", "sendrecv": "send_recv", "send": "send_recv",
             "recv": "send_recv"}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveKernels:
    """The NCCL kernels of one collective in the step."""

    count: int
    """Kernels."""
    time_s: float
    """Their summed duration."""
    size_bytes: float
    """Summed message bytes as nccl-tests counts them (0 where the trace did not record it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceStep:
    """One training step of one rank, from a profiler trace."""

    source: str
    """The trace file."""
    rank: int
    """Its rank (``distributedInfo``)."""
    world_size: int
    """Its world size."""
    device: str
    """The device the trace names ('' for none)."""
    marker: str
    """How the step was found (``ProfilerStep#N`` or ``optimizer steps``)."""
    work: str
    """What was summed: ``GPU kernels``, or ``CPU operators`` for a CPU-only trace."""
    wall_s: float
    """From the step's host start to its last GPU work's end (or the host end, if later)."""
    busy_s: float
    """Union of the step's GPU work intervals."""
    classes_s: Mapping[str, float]
    """Summed kernel time per class (``vocab.kernel_classes.CLASSES``)."""
    phases_s: Mapping[str, float]
    """Busy time per phase (``vocab.kineto.PHASES``)."""
    num_kernels: int
    """GPU activities (kernels, memsets, memcopies) launched in the step."""
    num_launches: int
    """Host calls that put them on the GPU (a CUDA graph launch puts many)."""
    host_s: float
    """The step's host span less its synchronising calls."""
    launch_calls: Mapping[str, int] = field(default_factory=dict)
    """Launch calls by name (``cudaLaunchKernel``, ``cuLaunchKernelEx``, ``cudaMemsetAsync``)."""
    gemm_shapes: tuple[tuple[int, int, int], ...] = ()
    """(m, n, k) of each GEMM operator call whose input shapes were recorded."""
    num_gemm_calls: int = 0
    """GEMM operator calls (launching a ``gemm`` kernel), shapes recorded or not."""
    unclassified: Mapping[str, int] = field(default_factory=dict)
    """Kernels of class ``other``, by name."""
    unplaced: int = 0
    """Kernels with no launch call in the trace (their phase guessed from their GPU time)."""
    collectives: Mapping[str, CollectiveKernels] = field(default_factory=dict)
    """NCCL kernels per collective."""
    communication_only_s: float = 0.0
    """GPU time in which only communication kernels ran (the exposed communication)."""
    kernel_gap_s: float = 0.0
    """The GPU's gap between consecutive compute kernels while the host was ahead
    (``vocab.kernel_classes.kernel_gap_s``); 0 for a CPU trace."""
    phase_kernels: Mapping[str, int] = field(default_factory=dict)
    """GPU activities per phase (``vocab.kineto.PHASES``)."""
    attention_heads: tuple[int, int] | None = None
    """(query heads, K/V heads) the step's first ``scaled_dot_product_attention`` call was given
    (its recorded input shapes), or None: fewer K/V heads means the loop hands SDPA the grouped
    heads (``enable_gqa``) rather than repeating them first."""

    @property
    def idle_s(self) -> float:
        """Wall time with no GPU work."""
        return max(0.0, self.wall_s - self.busy_s)

    @property
    def host_s_per_launch(self) -> float:
        """Host time per launch call (0 without launches)."""
        return self.host_s / self.num_launches if self.num_launches else 0.0

    def profile(self) -> dict[str, Any]:
        """The ``profile`` object of a ``commbench --step`` file for this step."""
        return {
            "classes_s": dict(self.classes_s),
            "busy_s": self.busy_s,
            "idle_s": self.idle_s,
            "wall_s": self.wall_s,
            "num_kernels": self.num_kernels,
            "kernel_gap_s": self.kernel_gap_s,
        }


def read_step(path: str | os.PathLike[str], *, device: str = "gpu") -> TraceStep:
    """Load the trace at ``path`` and summarise its training step (``device``: ``gpu``, or
    ``cpu`` for a CPU-only trace summed from its operators)."""
    if device not in ("gpu", "cpu"):
        raise ValueError(f"device must be 'gpu' or 'cpu', got {device!r}")
    trace = load_trace(path)
    work = operator_work(trace) if device == "cpu" else list(trace.activities)
    window = training_step(trace, work)
    return summarise(trace, window, work, union=device == "gpu")


def summarise(
    trace: Trace, window: StepWindow, work: Sequence[Activity], *, union: bool = True
) -> TraceStep:
    """Sum the work launched in ``window`` (``union``: busy time as the union of intervals; a
    CPU trace's self times are summed)."""
    step = [a for a in work if window.start_us <= a.launch_us < window.end_us]
    classes = dict.fromkeys(CLASSES, 0.0)
    for activity in step:
        classes[activity.kind] += (activity.end_us - activity.start_us) * US

    def busy(items: Sequence[Activity]) -> float:
        if not union:
            return sum(a.end_us - a.start_us for a in items) * US
        origin = window.start_us  # trace timestamps are ~1e12 us: subtract before scaling
        return busy_time_s([(a.start_us - origin, a.end_us - origin) for a in items]) * US

    end_us = max([window.end_us, *(a.end_us for a in step)]) if union else window.end_us
    correlations = {a.correlation for a in step if a.correlation is not None}
    launches = Counter(
        str(e.get("name", ""))
        for e in trace.host
        if str(e.get("cat", "")).lower() in LAUNCH_CATEGORIES
        and (e.get("args") or {}).get("correlation") in correlations
    )
    shapes, calls = gemm_shapes(trace, step)
    return TraceStep(
        source=trace.source,
        rank=trace.rank,
        world_size=trace.world_size,
        device=trace.device,
        marker=window.marker,
        work="GPU kernels" if union else "CPU operators",
        wall_s=(end_us - window.start_us) * US,
        busy_s=busy(step),
        classes_s=classes,
        phases_s={p: busy([a for a in step if a.phase == p]) for p in PHASES},
        phase_kernels={p: sum(1 for a in step if a.phase == p) for p in PHASES},
        num_kernels=len(step),
        num_launches=sum(launches.values()),
        host_s=host_time_s(trace, window),
        launch_calls=dict(launches),
        gemm_shapes=shapes,
        num_gemm_calls=calls,
        unclassified=dict(Counter(a.name for a in step if a.kind == "other")),
        unplaced=sum(1 for a in step if union and not a.launched),
        collectives=collectives(step),
        communication_only_s=busy(step) - busy([a for a in step if a.kind != "communication"]),
        attention_heads=attention_heads(trace, window),
        kernel_gap_s=kernel_gap_s(
            [
                ((a.start_us - window.start_us) * US, (a.end_us - window.start_us) * US)
                for a in step
                if a.kind != "communication"
            ]
        )
        if union
        else 0.0,
    )


SDPA_OPERATOR = "aten::scaled_dot_product_attention"
"""The operator whose recorded inputs give the heads attention reads (query, key, value first,
each batch x heads x tokens x head width)."""


def attention_heads(trace: Trace, window: StepWindow) -> tuple[int, int] | None:
    """(query heads, K/V heads) of the first ``SDPA_OPERATOR`` call in ``window`` with recorded
    4-dimensional query and key shapes, else None."""
    for event in trace.host:
        if event.get("name") != SDPA_OPERATOR:
            continue
        start = float(event.get("ts", -1.0))
        if not window.start_us <= start < window.end_us:
            continue
        dims = (event.get("args") or {}).get("Input Dims") or []
        if len(dims) >= 2 and all(isinstance(d, list) and len(d) == 4 for d in dims[:2]):
            return int(dims[0][1]), int(dims[1][1])
    return None


def host_time_s(trace: Trace, window: StepWindow) -> float:
    """The window's host span less the union of the synchronising calls inside it (the host
    waiting for the GPU is not launch work)."""
    origin = window.start_us
    waits = [
        (max(e["ts"], origin) - origin, min(e["ts"] + e.get("dur", 0), window.end_us) - origin)
        for e in trace.host
        if "Synchronize" in str(e.get("name", ""))
        and e["ts"] < window.end_us
        and e["ts"] + e.get("dur", 0) > window.start_us
    ]
    return max(0.0, (window.end_us - window.start_us - busy_time_s(waits)) * US)


def gemm_shape(operator: str, dims: Any) -> tuple[int, int, int] | None:
    """(m, n, k) of an ATen GEMM call from its ``Input Dims`` (leading dimensions of the
    activation folded into m); None for batched GEMMs and unknown operators.

    >>> gemm_shape("aten::addmm", [[2048], [8192, 1024], [1024, 2048]])
    (8192, 2048, 1024)
    """
    name = operator.removeprefix("aten::")
    if not isinstance(dims, list):
        return None
    first = 1 if name in ("addmm", "_addmm_activation") else 0
    pair = dims[first : first + 2]
    if len(pair) != 2 or not all(isinstance(d, list) and len(d) >= 2 for d in pair):
        return None
    a, b = pair
    if not all(isinstance(x, int) and x > 0 for x in (*a, *b)):
        return None
    m, k = math.prod(a[:-1]), a[-1]
    if name == "linear":
        n, k_weight = b[0], b[-1]
    elif name in ("mm", "_scaled_mm", "addmm", "_addmm_activation", "matmul") and len(b) == 2:
        k_weight, n = b
    else:
        return None
    return (m, n, k) if k_weight == k else None


def gemm_shapes(
    trace: Trace, step: Sequence[Activity]
) -> tuple[tuple[tuple[int, int, int], ...], int]:
    """The (m, n, k) of each GEMM operator call of ``step`` with recorded shapes, and the
    number of GEMM operator calls (one per External id: a call may launch several kernels)."""
    gemms = [a for a in step if a.kind == "gemm" and a.name not in GEMM_WRAPPERS]
    ids = sorted({a.external_id for a in gemms if a.external_id is not None})
    ids_without = sum(1 for a in gemms if a.external_id is None)
    wanted = set(ids)
    operators = {
        (e.get("args") or {}).get("External id"): e
        for e in trace.host
        if str(e.get("cat", "")).lower() in ("cpu_op", "operator")
        and (e.get("args") or {}).get("External id") in wanted
    }
    shapes = []
    for external in ids:
        operator = operators.get(external)
        if operator is not None:
            shape = gemm_shape(str(operator.get("name", "")), operator["args"].get("Input Dims"))
            if shape is not None:
                shapes.append(shape)
    return tuple(shapes), len(ids) + ids_without


def collective_name(kernel: str, args: Mapping[str, Any]) -> str:
    """The torch.distributed name of an NCCL kernel's collective (from the ``Collective name``
    PyTorch records on it, else from the kernel name: ``ncclDevKernel_AllGather_RING_LL``)."""
    recorded = str(args.get("Collective name", "")).lower().replace("_", "")
    for key in ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce",
                "send", "recv"):  # fmt: skip
        if key in recorded:
            return _NCCL_OPS[key]
    match = _NCCL_KERNEL.search(kernel)
    if match:
        key = match.group(1).lower()
        return _NCCL_OPS.get(key, key)
    return recorded or "unknown"


def collectives(step: Sequence[Activity]) -> dict[str, CollectiveKernels]:
    """NCCL kernels of ``step`` per collective: count, time, message bytes (all_gather counts
    its output, every other op its input, as nccl-tests)."""
    sums: dict[str, list[float]] = {}
    for activity in step:
        if activity.kind != "communication":
            continue
        op = collective_name(activity.name, activity.args)
        key = "Out msg nelems" if op == "all_gather" else "In msg nelems"
        elements = activity.args.get(key)
        width = DTYPE_BYTES.get(str(activity.args.get("dtype", "")).lower(), 0)
        size = float(elements) * width if isinstance(elements, int | float) else 0.0
        entry = sums.setdefault(op, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += (activity.end_us - activity.start_us) * US
        entry[2] += size
    return {
        op: CollectiveKernels(count=int(c), time_s=t, size_bytes=b)
        for op, (c, t, b) in sorted(sums.items())
    }
