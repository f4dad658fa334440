"""Chrome trace (Trace Event Format) of a simulated step, to open in ui.perfetto.dev.

Each simulated GPU is a process (``pid`` = global rank, named "rank N (pp stage s)") and each of
its streams a thread (``tid`` per stream name, named "compute", "tp", "dp", "pp", ...), so
Perfetto shows one track per GPU stream. Every span is a complete event (``"ph": "X"``) with
``ts``/``dur`` in microseconds and its kind, bytes and process group in ``args``. The output
depends only on the spans, in a fixed order, so the same step gives the same file byte for byte.

    text = trace_json(chrome_trace(result.spans, rank_titles={0: "rank 0 (pp stage 0)"}))
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from sim.result import Span

STREAM_ORDER = ("compute", "tp", "sp", "cp", "ep", "pp", "dp", "hsdp", "optimizer")
"""Streams listed first, in this order, on every rank; any other stream follows, sorted by name."""

_US_PER_S = 1e6
_US_DECIMALS = 3
"""ts/dur are rounded to the nanosecond: exact enough, and keeps large traces small."""


def stream_ids(streams: Iterable[str]) -> dict[str, int]:
    """Thread id per stream name: ``STREAM_ORDER`` first, then the others by name."""
    present = set(streams)
    known = [s for s in STREAM_ORDER if s in present]
    others = sorted(present.difference(STREAM_ORDER))
    return {stream: tid for tid, stream in enumerate(known + others)}


def chrome_trace(
    spans: Iterable[Span], *, rank_titles: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """The trace object: metadata naming every rank and stream, then one X event per span."""
    spans = tuple(spans)
    tids = stream_ids(s.stream for s in spans)
    ordered = sorted(spans, key=lambda s: (s.rank, tids[s.stream], s.start_s, s.end_s, s.name))
    titles = rank_titles or {}
    tracks = sorted({(s.rank, tids[s.stream], s.stream) for s in ordered})
    events: list[dict[str, Any]] = []
    for rank in sorted({s.rank for s in ordered}):
        events += _process_metadata(rank, titles.get(rank, f"rank {rank}"))
    for rank, tid, stream in tracks:
        events += _thread_metadata(rank, tid, stream)
    events += [_complete_event(span, tids[span.stream]) for span in ordered]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def trace_json(trace: Mapping[str, Any]) -> str:
    """Serialise a trace compactly (one event per line, so diffs and greps stay readable)."""
    events = ",\n".join(json.dumps(e, separators=(",", ":")) for e in trace["traceEvents"])
    return f'{{"displayTimeUnit":"{trace["displayTimeUnit"]}","traceEvents":[\n{events}\n]}}\n'


def _complete_event(span: Span, tid: int) -> dict[str, Any]:
    args: dict[str, Any] = {"kind": span.kind}
    if span.size_bytes:
        args["size_bytes"] = span.size_bytes
    if span.group is not None:
        args["group"] = span.group
    return {
        "name": span.name,
        "cat": span.kind,
        "ph": "X",
        "pid": span.rank,
        "tid": tid,
        "ts": round(span.start_s * _US_PER_S, _US_DECIMALS),
        "dur": round(span.duration_s * _US_PER_S, _US_DECIMALS),
        "args": args,
    }


def _process_metadata(rank: int, title: str) -> list[dict[str, Any]]:
    return [
        {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": title}},
        {
            "name": "process_sort_index",
            "ph": "M",
            "pid": rank,
            "tid": 0,
            "args": {"sort_index": rank},
        },
    ]


def _thread_metadata(rank: int, tid: int, stream: str) -> list[dict[str, Any]]:
    return [
        {"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": stream}},
        {
            "name": "thread_sort_index",
            "ph": "M",
            "pid": rank,
            "tid": tid,
            "args": {"sort_index": tid},
        },
    ]
