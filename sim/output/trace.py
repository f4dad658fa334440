"""Chrome trace (Trace Event Format) of a simulated step, to open in ui.perfetto.dev.

Each simulated GPU is a process (``pid`` = global rank, named "rank N (pp stage s)") and each of
its streams a thread (``tid`` per stream name, named "compute", "tp", "dp", "pp", ...), so
Perfetto shows one track per GPU stream. Every span is a complete event (``"ph": "X"``) with
``ts``/``dur`` in microseconds and its kind, bytes and process group in ``args``; a flow arrow
joins each pipeline ``send X`` span to the matching ``recv X`` span on the other rank. The output
depends only on the spans, in a fixed order, so the same step gives the same file byte for byte.

    text = trace_json(chrome_trace(result.spans, rank_titles={0: "rank 0 (pp stage 0)"}))
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sim.replay.result import Span

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
    events += _p2p_flows(ordered, tids)
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
        "ts": _us(span.start_s),
        "dur": _us(span.duration_s),
        "args": args,
    }


def _p2p_flows(spans: Sequence[Span], tids: Mapping[str, int]) -> list[dict[str, Any]]:
    """Flow arrows from each ``send X`` p2p span to the ``recv X`` span of the same transfer.

    Transfers that share a name (e.g. the same micro-batch in two model chunks) pair in time order.
    """
    receives: dict[str, list[Span]] = defaultdict(list)
    for span in sorted(spans, key=_by_time):
        if _transfer(span, "recv "):
            receives[_transfer(span, "recv ")].append(span)
    flows: list[dict[str, Any]] = []
    for send in sorted(spans, key=_by_time):
        pending = receives.get(_transfer(send, "send "))
        if not pending:
            continue
        recv = pending.pop(0)
        common = {"name": _transfer(send, "send "), "cat": "p2p", "id": len(flows) // 2 + 1}
        flows.append({**common, "ph": "s", **_place(send, tids), "ts": _us(send.start_s)})
        flows.append(
            {**common, "ph": "f", "bp": "e", **_place(recv, tids), "ts": _us(recv.start_s)}
        )
    return flows


def _by_time(span: Span) -> tuple[float, float, int, str]:
    return (span.start_s, span.end_s, span.rank, span.name)


def _transfer(span: Span, prefix: str) -> str:
    """``F3 0->2`` for a p2p span named ``<prefix>F3 0->2``, else the empty string."""
    if span.kind != "p2p" or not span.name.startswith(prefix):
        return ""
    return span.name.removeprefix(prefix)


def _place(span: Span, tids: Mapping[str, int]) -> dict[str, int]:
    return {"pid": span.rank, "tid": tids[span.stream]}


def _us(time_s: float) -> float:
    return round(time_s * _US_PER_S, _US_DECIMALS)


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
