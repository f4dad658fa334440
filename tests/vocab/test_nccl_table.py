"""The table reproduces nccl-tests' layout character for character."""

from __future__ import annotations

from dataclasses import replace

from vocab.nccl_table import footer, format_row, format_time_us, table_header
from vocab.records import Record

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


# nccl-tests' writeResultHeader (src/util.cu), as it prints it: trailing spaces included.
NCCL_TESTS_HEADER = [
    "#                                                              out-of-place"
    "                       in-place          ",
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
    "     time   algbw   busbw  #wrong ",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)        "
    "     (us)  (GB/s)  (GB/s)         ",
]


def test_header_is_nccl_tests_with_its_super_header():
    assert table_header() == NCCL_TESTS_HEADER
    per_iter = table_header(True)
    assert per_iter[0].split() == ["#", "out-of-place", "in-place"]
    assert per_iter[1].split()[-3:] == ["min", "median", "p99"]
    assert len(per_iter[1]) == len(per_iter[2]) == len(format_row(_record(), _record(), True))
    assert per_iter[0].index("out-of-place") < per_iter[1].index("#wrong")


def test_times_as_nccl_tests_prints_them():
    # getFloatStr(value, 7): %7.2f, %7.1f, %7.0f, whichever fits, then %7.1e.
    times = (34.734, 2726.63, 9999.994, 9999.996, 10585.12, 99999.96, 123456.7, 9999999.4)
    assert [format_time_us(t) for t in times] == [
        "  34.73", "2726.63", "9999.99", "10000.0", "10585.1", " 100000", " 123457", "9999999",
    ]  # fmt: skip
    assert [format_time_us(t) for t in (9999999.6, 12345678.9, 3.6e9, 1e100)] == [
        "1.0e+07", "1.2e+07", "3.6e+09", "1.0e+10",  # cut to 7 characters, as snprintf does
    ]  # fmt: skip


def test_a_large_row_is_printed_as_nccl_tests_does():
    slow = _record(
        op="all_reduce", size_bytes=17179869184, count=4294967296, redop="sum",
        time_us=12345678.9, algbw_gbps=1391.6, busbw_gbps=2435.3, num_wrong=1234567,
    )  # fmt: skip
    fast = replace(slow, in_place=True, time_us=99999.96, algbw_gbps=171798.69, num_wrong=0)
    assert format_row(slow, fast) == (
        " 17179869184    4294967296     float     sum      -1  1.2e+07  1391.6  2435.3"
        "  1.23457e+06   100000  171799  2435.3       0"
    )


def test_an_unchecked_count_is_one_column_narrower_as_in_nccl_tests():
    # util.cu writeBenchmarkLineBody: "  %7s  %6s  %6s  %6g" with a count, "  %7s  %6s  %6s    N/A"
    # without (refdata/collectives/a100-sendrecv-playground/sendrecv_1n.txt's in-place column)
    out = _record(op="send_recv", size_bytes=134217728, count=33554432, redop="sum")
    out = replace(out, time_us=1211.8, algbw_gbps=110.76, busbw_gbps=110.76)
    row = format_row(out, replace(out, in_place=True, num_wrong=None))
    assert row.endswith("  1211.80  110.76  110.76       0  1211.80  110.76  110.76    N/A")


def test_unchecked_blocks_print_na_and_footer_counts_failures():
    out = _record(num_wrong=None)
    assert format_row(out, None).split()[-8:] == ["34.73", "0.00", "0.00", "N/A"] + ["N/A"] * 4
    bad = [_record(busbw_gbps=2.0), _record(busbw_gbps=4.0, num_wrong=3)]
    assert footer(bad) == ["# Out of bounds values : 1 FAILED", "# Avg bus bandwidth    : 3 "]
