"""Reading a torch.profiler trace (Kineto's Chrome JSON) and finding one training step in it.

``torch.profiler`` exports what the host and the GPU did (``export_chrome_trace``, or
``tensorboard_trace_handler``'s ``*.pt.trace.json[.gz]``): ATen operators, annotations and CUDA
runtime/driver calls on the host threads; kernels, memsets and memcopies on the GPU streams, each
tied to the host call that launched it by ``args.correlation`` and to the operator by
``args["External id"]``. One file is one rank (``distributedInfo``). This module reads such a
file without torch (gzip or plain), sorts its events into host work and GPU work, gives every
GPU activity the phase it was launched in, and finds ONE whole training step:

- the last ``ProfilerStep#N`` (``prof.step()``'s marker) that holds backward work and an
  optimizer step;
- without such a marker, the span between the last two optimizer steps (``Optimizer.step#...``
  annotations, which torch's optimizers record, else the optimizer's kernels), or from the
  trace's first host event to the only optimizer step.

Phases, from where the launch happened: ``optimizer`` inside ``Optimizer.step#...`` (or an
optimizer kernel outside backward when no annotation was recorded), ``backward`` inside
autograd's ``autograd::engine::evaluate_function: ...`` or on an autograd thread
(``pt_autograd_N``), ``forward`` everything else (the loss, gradient zeroing and input copies
included). ``vocab.trace_summary`` sums the step; a bad file is a one-line ``ValueError``.

    trace = load_trace("trace.json.gz"); window = training_step(trace)
"""

from __future__ import annotations

import bisect
import json
import os
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fileio.strict import shorten
from vocab.kernel_classes import classify

MAX_TRACE_BYTES = 2 << 30
"""Largest trace read (compressed or not): one rank's step is megabytes, a long capture of a
large job hundreds of them; a runaway file is refused before it eats the memory."""
GPU_CATEGORIES = frozenset({"kernel", "gpu_memset", "gpu_memcpy", "memset", "memcpy"})
"""Event categories of GPU activity (lower-cased; older Kineto wrote ``Kernel``, ``Memset``)."""
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver"})
"""Categories of host calls into CUDA (launches among them, tied to GPU work by correlation)."""
HOST_CATEGORIES = frozenset({"cpu_op", "operator", "user_annotation", "python_function"})
"""Categories of host work that mark steps, phases and operators."""
PHASES = ("forward", "backward", "optimizer")
"""Phases of a training step, in order."""
_STEP_MARKER = re.compile(r"^ProfilerStep#(\d+)$")
_BACKWARD_OP = "autograd::engine::evaluate_function"
_OPTIMIZER_STEP = "Optimizer.step#"


@dataclass(frozen=True, slots=True, kw_only=True)
class Activity:
    """One GPU activity (a kernel, memset or memcpy), with its launch and phase."""

    name: str
    """Kernel name as CUPTI reports it (``Memset (Device)`` for a memset)."""
    kind: str
    """Its class (``vocab.kernel_classes.classify`` of its name, else of its operator's)."""
    start_us: float
    """Start on the GPU, trace microseconds."""
    end_us: float
    """End on the GPU, trace microseconds."""
    launch_us: float
    """When the host launched it (its own start when no launch call was recorded)."""
    launched: bool
    """Whether a host launch call (by correlation id) was found for it."""
    correlation: int | None
    """The launch call's correlation id."""
    external_id: int | None
    """The launching operator's External id (for its recorded input shapes)."""
    phase: str = "forward"
    """One of ``PHASES``."""
    args: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """The event's ``args`` (collective metadata on NCCL kernels)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """A loaded trace: its host events, GPU activities and what the file says about itself."""

    source: str
    """The file it was read from."""
    rank: int
    """``distributedInfo.rank`` (0 without one)."""
    world_size: int
    """``distributedInfo.world_size`` (1 without one)."""
    device: str
    """The first ``deviceProperties`` entry's name ('' without one)."""
    host: tuple[Mapping[str, Any], ...]
    """Complete (``ph: X``) host events: operators, annotations and CUDA calls, by start."""
    activities: tuple[Activity, ...]
    """GPU activities, by start, each with its phase."""
    record_shapes: bool
    """Whether operators carry ``Input Dims`` (``record_shapes=True``)."""
    autograd_threads: frozenset[Any] = frozenset()
    """Host thread ids named like autograd's device threads (``pt_autograd_0``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepWindow:
    """The host interval of the training step chosen, and how it was found."""

    start_us: float
    """Host start of the step."""
    end_us: float
    """Host end of the step."""
    marker: str
    """``ProfilerStep#N``, or ``optimizer steps`` when it lies between optimizer steps."""


def read_trace_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object of a trace file, gzip or plain; one-line ValueErrors for a file that is
    not one (missing, truncated, not JSON, no ``traceEvents`` list)."""
    name = shorten(os.path.basename(os.fspath(path)))
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_TRACE_BYTES + 1)
        if data[:2] == b"\x1f\x8b":
            data = _gunzip(data, name)
    except FileNotFoundError:
        raise FileNotFoundError(f"trace not found: {os.fspath(path)}") from None
    except IsADirectoryError:
        raise ValueError(f"trace {name} is a folder, not a file") from None
    if len(data) > MAX_TRACE_BYTES:
        raise ValueError(f"trace {name} is larger than {MAX_TRACE_BYTES:,} bytes")
    try:
        trace = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"trace {name} is not JSON ({str(exc).splitlines()[0]})") from None
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"trace {name} has no traceEvents list: not a Chrome/Kineto trace")
    return trace


def _gunzip(data: bytes, name: str) -> bytes:
    """The first gzip member of ``data``, at most ``MAX_TRACE_BYTES + 1`` bytes of it."""
    stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = stream.decompress(data, MAX_TRACE_BYTES + 1)
    except zlib.error as exc:
        raise ValueError(f"trace {name} is a truncated or corrupt gzip file ({exc})") from None
    if not stream.eof and len(out) <= MAX_TRACE_BYTES:
        raise ValueError(f"trace {name} is a truncated or corrupt gzip file (it ends early)")
    return out


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace file into host events and GPU activities with their phases."""
    raw = read_trace_json(path)
    events = [e for e in raw["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    for event in events:
        if not isinstance(event.get("ts"), int | float) or not isinstance(
            event.get("dur", 0), int | float
        ):
            raise ValueError(
                f"trace {shorten(os.path.basename(path))}: event "
                f"{shorten(event.get('name'))} has no numeric ts/dur"
            )
    host = sorted(
        (e for e in events if _category(e) in HOST_CATEGORIES | LAUNCH_CATEGORIES),
        key=lambda e: (e["ts"], -e.get("dur", 0)),
    )
    info = raw.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    devices = raw.get("deviceProperties") or [{}]
    autograd = _autograd_threads(raw["traceEvents"])
    phase = _phase_rules(host, autograd)
    launches = {
        (e.get("args") or {}).get("correlation"): e
        for e in host
        if _category(e) in LAUNCH_CATEGORIES and (e.get("args") or {}).get("correlation")
    }
    operators = {
        (e.get("args") or {}).get("External id"): str(e.get("name", ""))
        for e in host
        if _category(e) in ("cpu_op", "operator")
    }
    gpu = sorted((e for e in events if _category(e) in GPU_CATEGORIES), key=lambda e: e["ts"])
    return Trace(
        source=os.fspath(path),
        rank=int(info.get("rank", 0) or 0),
        world_size=int(info.get("world_size", 1) or 1),
        device=str(devices[0].get("name", "")) if isinstance(devices[0], dict) else "",
        host=tuple(host),
        activities=tuple(_activity(e, launches, operators, phase) for e in gpu),
        record_shapes=bool(raw.get("record_shapes"))
        or any("Input Dims" in (e.get("args") or {}) for e in host[:2000]),
        autograd_threads=frozenset(autograd),
    )


def _category(event: Mapping[str, Any]) -> str:
    return str(event.get("cat", "")).lower()


def _autograd_threads(events: list[Any]) -> set[Any]:
    """Thread ids named like autograd's device threads (``pt_autograd_0``)."""
    return {
        e.get("tid")
        for e in events
        if isinstance(e, dict)
        and e.get("ph") == "M"
        and e.get("name") == "thread_name"
        and "autograd" in str((e.get("args") or {}).get("name", ""))
    }


def _intervals(host: Sequence[Mapping[str, Any]], prefix: str) -> dict[Any, list]:
    """Per thread, the sorted (start, end) of host events whose name starts with ``prefix``."""
    out: dict[Any, list] = {}
    for event in host:
        if str(event.get("name", "")).startswith(prefix):
            start = event["ts"]
            out.setdefault(event.get("tid"), []).append((start, start + event.get("dur", 0)))
    return out


def _inside(spans: list[tuple[float, float]] | None, at: float) -> bool:
    """Whether ``at`` lies in one of the sorted, possibly nested ``spans``."""
    if not spans:
        return False
    index = bisect.bisect_right(spans, (at, float("inf")))
    return any(start <= at <= end for start, end in spans[max(0, index - 64) : index])


def _phase_rules(host: Sequence[Mapping[str, Any]], autograd: set[Any]) -> Any:
    """``phase(at, tid, kind)``: the phase of work launched at host time ``at`` on ``tid``."""
    backward = _intervals(host, _BACKWARD_OP)
    optimizer = sorted(s for spans in _intervals(host, _OPTIMIZER_STEP).values() for s in spans)

    def phase(at: float, tid: Any, kind: str) -> str:
        if _inside(optimizer, at):
            return "optimizer"
        if tid in autograd or _inside(backward.get(tid), at):
            return "backward"
        # no annotation: the optimizer's own kernels (fused or foreach AdamW) mark its step
        return "optimizer" if kind == "optimizer" and not optimizer else "forward"

    return phase


def _activity(
    event: Mapping[str, Any],
    launches: Mapping[Any, Any],
    operators: Mapping[Any, str],
    phase: Any,
) -> Activity:
    """One GPU activity; a kernel whose name matches no class takes the class of the operator
    that launched it (``aten::_fused_rms_norm_backward`` for ``GammaBetaBackward...``)."""
    args = event.get("args") or {}
    launch = launches.get(args.get("correlation"))
    at = launch["ts"] if launch is not None else event["ts"]
    tid = launch.get("tid") if launch is not None else None
    external = args.get("External id")
    kind = classify(str(event.get("name", "")))
    if kind == "other" and external in operators:
        kind = classify(operators[external])
    return Activity(
        name=str(event.get("name", "")),
        kind=kind,
        start_us=float(event["ts"]),
        end_us=float(event["ts"] + event.get("dur", 0)),
        launch_us=float(at),
        launched=launch is not None,
        correlation=args.get("correlation"),
        external_id=external if isinstance(external, int) else None,
        phase=phase(at, tid, kind),
        args=args,
    )


def operator_work(trace: Trace) -> list[Activity]:
    """A CPU-only trace's work: every ATen operator with its self time (its duration less its
    children's), as ``commbench --step`` sums a CPU step; ``start_us`` + self time is no real
    interval, so such work is summed, never unioned."""
    phase = _phase_rules(list(trace.host), set(trace.autograd_threads))
    entries: list[list[Any]] = []  # [event, end, children's time]
    stacks: dict[Any, list[list[Any]]] = {}
    for event in trace.host:
        if _category(event) not in ("cpu_op", "operator"):
            continue
        start, end = event["ts"], event["ts"] + event.get("dur", 0)
        stack = stacks.setdefault(event.get("tid"), [])
        while stack and stack[-1][1] <= start:
            stack.pop()
        if stack:
            stack[-1][2] += end - start
        entries.append([event, end, 0.0])
        stack.append(entries[-1])
    out = []
    for event, _, children in entries:
        name = str(event.get("name", ""))
        if not name.startswith("aten::"):
            continue
        kind = classify(name)
        self_us = max(0.0, event.get("dur", 0) - children)
        external = (event.get("args") or {}).get("External id")
        out.append(
            Activity(
                name=name,
                kind=kind,
                start_us=float(event["ts"]),
                end_us=float(event["ts"] + self_us),
                launch_us=float(event["ts"]),
                launched=False,
                correlation=None,
                external_id=external if isinstance(external, int) else None,
                phase=phase(event["ts"], event.get("tid"), kind),
                args=event.get("args") or {},
            )
        )
    return out


def _has_training(
    activities: list[Activity], annotated: list[tuple[float, float]], start: float, end: float
) -> tuple[bool, bool]:
    """(backward work launched in [start, end), an optimizer step in it)."""
    inside = [a for a in activities if start <= a.launch_us < end]
    backward = any(a.phase == "backward" for a in inside)
    optimizer = any(start <= s < end for s, _ in annotated) or any(
        a.phase == "optimizer" for a in inside
    )
    return backward, optimizer


def training_step(trace: Trace, work: list[Activity] | None = None) -> StepWindow:
    """The step to summarise (see the module docstring); ValueError when the trace holds no
    whole training step. ``work`` replaces the GPU activities (a CPU trace's operators)."""
    activities = list(trace.activities if work is None else work)
    name = shorten(os.path.basename(trace.source))
    if not activities:
        raise ValueError(
            f"trace {name} has no GPU kernels (no 'kernel' events): profile with "
            "ProfilerActivity.CUDA on a GPU"
        )
    annotated = sorted(
        s for spans in _intervals(trace.host, _OPTIMIZER_STEP).values() for s in spans
    )
    markers = [e for e in trace.host if _STEP_MARKER.match(str(e.get("name", "")))]
    for marker in sorted(markers, key=lambda e: e["ts"], reverse=True):
        start, end = marker["ts"], marker["ts"] + marker.get("dur", 0)
        if all(_has_training(activities, annotated, start, end)):
            return StepWindow(start_us=start, end_us=end, marker=str(marker["name"]))
    ends = _optimizer_ends(activities, annotated)
    if ends:
        start = ends[-2] if len(ends) > 1 else min(e["ts"] for e in trace.host)
        if all(_has_training(activities, annotated, start, ends[-1])):
            return StepWindow(start_us=start, end_us=ends[-1], marker="optimizer steps")
    backward = any(a.phase == "backward" for a in activities)
    optimizer = bool(annotated) or any(a.phase == "optimizer" for a in activities)
    if not backward:
        missing = "no backward (autograd) work" + ("" if optimizer else " and no optimizer step")
        missing += ": a trace of inference?"
    elif not optimizer:
        missing = "no optimizer step (no Optimizer.step annotation or optimizer kernel)"
    else:
        missing = "no step that holds both a backward and an optimizer step"
    raise ValueError(f"trace {name} holds no whole training step: it has {missing}")


def _optimizer_ends(activities: list[Activity], annotated: list[tuple[float, float]]) -> list:
    """Host end of each optimizer step: the annotations, else runs of optimizer launches."""
    if annotated:
        return [end for _, end in annotated]
    ends: list[float] = []
    last_phase = ""
    for activity in sorted(activities, key=lambda a: a.launch_us):
        if activity.phase == "optimizer" and last_phase == "optimizer":
            ends[-1] = activity.launch_us
        elif activity.phase == "optimizer":
            ends.append(activity.launch_us)
        last_phase = activity.phase
    return [end + 1e-3 for end in ends]  # the last launch itself belongs to the step
