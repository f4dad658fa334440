"""The Chrome trace: valid JSON, one process per rank, one thread per stream, X events in us."""

from __future__ import annotations

import json

from sim.output.trace import chrome_trace, stream_ids, trace_json
from sim.replay.result import Span

SPANS = (
    Span(rank=0, stream="compute", name="F0.c0", kind="compute", start_s=0.0, end_s=0.001),
    Span(
        rank=0,
        stream="tp",
        name="AR(fwd)",
        kind="collective",
        start_s=0.001,
        end_s=0.0015,
        size_bytes=8_388_608.0,
        group="tp",
    ),
    Span(rank=0, stream="compute", name="B0.c0", kind="compute", start_s=0.0025, end_s=0.0045),
    Span(
        rank=4,
        stream="pp",
        name="send F0",
        kind="p2p",
        start_s=0.0015,
        end_s=0.00175,
        size_bytes=1e6,
        group="pp",
    ),
    Span(rank=4, stream="compute", name="F0.c0", kind="compute", start_s=0.00175, end_s=0.00275),
    Span(rank=4, stream="dp", name="RS(unit 1)", kind="collective", start_s=0.003, end_s=0.004),
)
TITLES = {0: "rank 0 (pp stage 0)", 4: "rank 4 (pp stage 1)"}


def _events(phase: str, name: str | None = None) -> list[dict]:
    trace = json.loads(trace_json(chrome_trace(SPANS, rank_titles=TITLES)))
    return [e for e in trace["traceEvents"] if e["ph"] == phase and name in (None, e["name"])]


def test_trace_is_valid_json_with_display_unit() -> None:
    trace = json.loads(trace_json(chrome_trace(SPANS, rank_titles=TITLES)))
    assert trace["displayTimeUnit"] == "ms"
    assert len(trace["traceEvents"]) == 2 * 2 + 2 * 5 + len(SPANS)


def test_one_process_per_rank_named_with_its_stage() -> None:
    names = {e["pid"]: e["args"]["name"] for e in _events("M", "process_name")}
    assert names == TITLES


def test_one_thread_per_stream_with_stable_ids() -> None:
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in _events("M", "thread_name")}
    # compute first, then the known streams in STREAM_ORDER: tp, pp, dp.
    assert threads == {
        (0, 0): "compute",
        (0, 1): "tp",
        (4, 0): "compute",
        (4, 2): "pp",
        (4, 3): "dp",
    }


def test_complete_events_have_microsecond_times_and_args() -> None:
    events = _events("X")
    assert len(events) == len(SPANS)
    ar = next(e for e in events if e["name"] == "AR(fwd)")
    assert (ar["pid"], ar["tid"], ar["ts"], ar["dur"]) == (0, 1, 1000.0, 500.0)
    assert ar["args"] == {"kind": "collective", "size_bytes": 8_388_608.0, "group": "tp"}
    b0 = next(e for e in events if e["name"] == "B0.c0")
    assert (b0["ts"], b0["dur"], b0["cat"]) == (2500.0, 2000.0, "compute")
    assert b0["args"] == {"kind": "compute"}
    send = next(e for e in events if e["name"] == "send F0")
    assert (send["pid"], send["tid"], send["ts"], send["dur"]) == (4, 2, 1500.0, 250.0)


def test_events_sorted_per_track_and_output_deterministic() -> None:
    forward = chrome_trace(SPANS, rank_titles=TITLES)
    backward = chrome_trace(tuple(reversed(SPANS)), rank_titles=TITLES)
    assert trace_json(forward) == trace_json(backward)
    keys = [(e["pid"], e["tid"], e["ts"]) for e in forward["traceEvents"] if e["ph"] == "X"]
    assert keys == sorted(keys)


def test_untitled_rank_and_unknown_stream() -> None:
    span = Span(rank=7, stream="zz", name="x", kind="wait", start_s=0.0, end_s=1.0)
    trace = chrome_trace([span])
    meta = {e["name"]: e["args"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert meta["process_name"] == {"name": "rank 7"}
    assert meta["thread_name"] == {"name": "zz"}
    assert stream_ids(["zz", "dp", "compute", "aa"]) == {"compute": 0, "dp": 1, "aa": 2, "zz": 3}


def _p2p(rank: int, name: str, start_s: float) -> Span:
    return Span(
        rank=rank, stream="pp", name=name, kind="p2p", start_s=start_s, end_s=start_s + 1e-4
    )


def test_flow_arrows_join_sends_to_receives_in_time_order() -> None:
    spans = [
        _p2p(4, "recv F0 0->4", 0.002),  # second transfer of the same name (another chunk)
        _p2p(0, "send F0 0->4", 0.001),
        _p2p(4, "recv F0 0->4", 0.001),
        _p2p(0, "send F0 0->4", 0.002),
        _p2p(4, "send B0 4->0", 0.003),  # its receiver was not simulated: no arrow
    ]
    flows = [e for e in chrome_trace(spans)["traceEvents"] if e["ph"] in ("s", "f")]
    assert [(e["ph"], e["id"], e["pid"], e["ts"]) for e in flows] == [
        ("s", 1, 0, 1000.0),
        ("f", 1, 4, 1000.0),
        ("s", 2, 0, 2000.0),
        ("f", 2, 4, 2000.0),
    ]
    assert all(e["tid"] == 0 and e["name"] == "F0 0->4" for e in flows)
    assert flows[1]["bp"] == "e"
