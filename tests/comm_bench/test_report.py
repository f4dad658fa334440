"""The table reproduces nccl-tests' layout character for character."""

from __future__ import annotations

from dataclasses import replace

from comm_bench.records import Record
from comm_bench.report import footer, format_row, format_time_us, table_header

ROW = (
    "         128             4     float    none      -1    34.73    0.00    0.00       0"
    "    47.28    0.00    0.00       0"
)
BIG = (
    "  8589934592     268435456     float     sum      -1  20767.1  413.63  361.93       0"
    "  20643.2  416.11  364.10       0"
)


def _record(**kw):
    base = dict(
        op="all_gather",
        size_bytes=128,
        count=4,
        dtype="float32",
        world_size=8,
        num_nodes=1,
        in_place=False,
        time_us=34.73,
        algbw_gbps=0.0,
        busbw_gbps=0.0,
        num_wrong=0,
        redop="none",
        root=-1,
    )
    return Record(**(base | kw))


def test_rows_match_published_lines():
    out = _record()
    assert format_row(out, replace(out, in_place=True, time_us=47.28)) == ROW
    rs = _record(
        op="reduce_scatter",
        size_bytes=8589934592,
        count=268435456,
        redop="sum",
        time_us=20767.1,
        algbw_gbps=413.63,
        busbw_gbps=361.93,
    )
    ip = replace(rs, in_place=True, time_us=20643.2, algbw_gbps=416.11, busbw_gbps=364.10)
    assert format_row(rs, ip) == BIG


def test_header_and_time_formats():
    assert table_header()[0] == (
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
        "     time   algbw   busbw  #wrong"
    )
    assert [format_time_us(t) for t in (34.734, 2726.63, 10585.12, 123456.7)] == [
        "  34.73",
        "2726.63",
        "10585.1",
        " 123457",
    ]
    assert "median" in table_header(True)[0]


def test_unchecked_blocks_print_na_and_footer_counts_failures():
    out = _record(num_wrong=None)
    assert format_row(out, None).split()[-8:] == ["34.73", "0.00", "0.00", "N/A"] + ["N/A"] * 4
    bad = [_record(busbw_gbps=2.0), _record(busbw_gbps=4.0, num_wrong=3)]
    assert footer(bad) == ["# Out of bounds values : 1 FAILED", "# Avg bus bandwidth    : 3 "]
