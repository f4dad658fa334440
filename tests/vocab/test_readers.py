"""Readers: the published nccl-tests tables parse to the printed numbers; logs; commbench JSON."""

from __future__ import annotations

import warnings

import pytest

import refdata
from vocab.readers import UnknownFormatError, parse_nccl_tests_text, read_many, read_results

NCCL = refdata.NCCL_DIR
needs_data = pytest.mark.skipif(not NCCL.is_dir(), reason="refdata is not installed")


def _row(records, size, in_place, op=None):
    return next(
        r
        for r in records
        if r.size_bytes == size and r.in_place == in_place and (op is None or r.op == op)
    )


@needs_data
def test_every_published_file_parses():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = read_many(sorted(p for p in NCCL.iterdir() if p.suffix in (".txt", ".csv")))
    assert len(records) == 22 + 40 + 28 + 12 + 12 + 14
    assert all(r.source == "nccl-tests" and r.world_size >= 8 for r in records)


@needs_data
def test_all_gather_ring_rows_as_printed():
    records = read_results(NCCL / "h100_8gpu_all_gather_ring.txt")
    assert len(records) == 22 and {(r.op, r.algo, r.world_size) for r in records} == {
        ("all_gather", "ring", 8)
    }
    r = _row(records, 1073741824, False)
    assert (r.count, r.time_us, r.algbw_gbps, r.busbw_gbps, r.num_wrong) == (
        33554432,
        2726.63,
        393.80,
        344.57,
        0,
    )
    r = _row(records, 8589934592, True)
    assert (r.time_us, r.algbw_gbps, r.busbw_gbps) == (20681.9, 415.34, 363.42)
    assert _row(records, 128, True).time_us == 47.28


@needs_data
def test_all_reduce_ring_rows_as_printed():
    records = read_results(NCCL / "h100_8gpu_all_reduce_ring.txt")
    r = _row(records, 33554432, True)
    assert (r.op, r.redop, r.root, r.count, r.time_us, r.algbw_gbps, r.busbw_gbps) == (
        "all_reduce",
        "sum",
        -1,
        8388608,
        214.78,
        156.23,
        273.40,
    )


@needs_data
def test_nvls_log_blocks_are_split_and_labelled_by_their_columns():
    with pytest.warns(UserWarning) as caught:
        records = read_results(NCCL / "h100_8gpu_all_reduce_nvls.txt")
    messages = [str(w.message) for w in caught]
    assert any("block 2" in m and "all_gather or all_to_all; skipped" in m for m in messages)
    assert any("block 3" in m and "read as reduce_scatter" in m for m in messages)
    ar = [r for r in records if r.op == "all_reduce"]
    rs = [r for r in records if r.op == "reduce_scatter"]
    assert len(ar) == 28 and len(rs) == 12 and len(records) == 40
    assert {r.algo for r in ar} == {"nvls"} and {r.algo for r in rs} == {None}
    r = _row(ar, 8589934592, False)
    assert (r.time_us, r.algbw_gbps, r.busbw_gbps) == (31361.7, 273.90, 479.32)
    r = _row(rs, 268435456, False)
    assert (r.count, r.time_us, r.busbw_gbps) == (8388608, 718.02, 327.12)


@needs_data
def test_busbw_tables_derive_time_with_the_bus_factor():
    a100 = read_results(NCCL / "a100_8gpu_all_reduce_busbw.csv")
    r = _row(a100, 1073741824, True)
    assert r.busbw_gbps == 228.10 and r.in_place and r.world_size == 8
    assert r.algbw_gbps == pytest.approx(228.10 / 1.75)
    assert r.time_us == pytest.approx(1073741824 / (228.10 / 1.75 * 1e9) * 1e6)
    multi = read_results(NCCL / "h100_multinode_all_reduce_busbw.csv")
    r = next(x for x in multi if x.num_nodes == 4 and x.size_bytes == 8589934592)
    assert (r.world_size, r.busbw_gbps, r.op, r.redop) == (32, 356.99, "all_reduce", "sum")
    assert {(x.num_nodes, x.world_size) for x in multi} == {(2, 16), (4, 32), (8, 64)}
    assert not any(x.in_place for x in multi)


HEAD = "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
LOG = "\n".join(
    [
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20",
        "#",
        "# Using devices",
        "#  Rank  0 Group  0 Pid  11 on   nodeA device  0 [0x1b] NVIDIA H100 80GB HBM3",
        "#  Rank  1 Group  0 Pid  12 on   nodeA device  1 [0x2b] NVIDIA H100 80GB HBM3",
        "#  Rank  2 Group  0 Pid  13 on   nodeB device  0 [0x1b] NVIDIA H100 80GB HBM3",
        "#  Rank  3 Group  0 Pid  14 on   nodeB device  1 [0x2b] NVIDIA H100 80GB HBM3",
        "#",
        "# Collective test starting: all_gather_perf",
        HEAD + "     time   algbw   busbw  #wrong",
        "         256            16     float    none      -1    20.10    0.01    0.01       0"
        "    19.90    0.01    0.01     N/A",
        "        1024            64     float    none      -1    21.00    0.05    0.04       0"
        "    20.00    0.05    0.04       0",
        "# Out of bounds values : 0 OK",
        "# Collective test starting: broadcast_perf",
        "         512           128     float    none       0    10.00    0.05    0.05       0"
        "    10.00    0.05    0.05       0",
    ]
)


def test_raw_log_uses_markers_and_rank_lines():
    records = parse_nccl_tests_text(LOG)
    assert [(r.op, r.size_bytes, r.in_place) for r in records] == [
        ("all_gather", 256, False),
        ("all_gather", 256, True),
        ("all_gather", 1024, False),
        ("all_gather", 1024, True),
        ("broadcast", 512, False),
        ("broadcast", 512, True),
    ]
    assert {(r.world_size, r.num_nodes) for r in records} == {(4, 2)}
    assert records[1].num_wrong is None and records[0].num_wrong == 0
    assert records[4].root == 0 and records[4].time_us == 10.0


def test_unknown_files_are_a_clear_error(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    with pytest.raises(UnknownFormatError, match=r"notes\.txt: no commbench or nccl-tests results"):
        read_results(bad)
    other = tmp_path / "x.json"
    other.write_text('{"schema": "other/2", "results": []}')
    with pytest.raises(UnknownFormatError, match="schema 'other/2'"):
        read_results(other)


def test_malformed_commbench_files_name_the_file_and_row(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": ')
    with pytest.raises(ValueError, match=r"broken\.json: malformed JSON"):
        read_results(broken)
    partial = tmp_path / "partial.json"
    partial.write_text('{"schema": "commbench/1", "results": [{"op": "all_reduce"}]}')
    with pytest.raises(ValueError, match=r"partial\.json: result 0: .*missing"):
        read_results(partial)
    not_list = tmp_path / "notlist.json"
    not_list.write_text('{"schema": "commbench/1", "results": 3}')
    with pytest.raises(ValueError, match="'results' must be a list"):
        read_results(not_list)
    header = "op,size_bytes,count,dtype,world_size,num_nodes,in_place,time_us,algbw_gbps,busbw_gbps"
    rest = ",num_wrong,redop,root,time_min_us,time_median_us,time_p99_us,num_iters,algo,source"
    junk = tmp_path / "junk.csv"
    junk.write_text(f"{header}{rest}\nall_reduce,abc,1,float32,4,1,false,1,1,1,,,,,,,,,\n")
    with pytest.raises(ValueError, match=r"junk\.csv: result 0: .*'abc'"):
        read_results(junk)
    row = "all_reduce,1024,256,float32,4,1,false,10,0.1,0.15,0,sum,-1,,,,20"
    warp = tmp_path / "warp.csv"
    warp.write_text(f"{header}{rest}\n{row},warp,measured\n{row},NVLSTree,measured\n")
    with pytest.raises(ValueError, match=r"warp\.csv: result 0 .*algo 'warp' is not an algo"):
        read_results(warp)
    warp.write_text(f"{header}{rest}\n{row},NVLSTree,measured\n")  # NCCL's spelling reads
    assert read_results(warp)[0].algo == "NVLSTree"
    for name in ("gloo", "auto", "PAT"):  # the CPU backend's, none forced, NCCL's PAT
        warp.write_text(f"{header}{rest}\n{row},{name},measured\n")
        assert read_results(warp)[0].algo == name


ROWS = [
    "     1048576        262144     float     sum      -1    20.00   52.43   52.43       0"
    "    19.00   55.19   55.19       0",
    "     2097152        524288     float     sum      -1    30.00   69.91   69.91       0"
    "    29.00   72.32   72.32       0",
]
"""Two all_reduce rows of a 2-rank run (busbw = algbw x 2(n-1)/n = algbw)."""


def _all_reduce_log(rows, ranks=2):
    """An nccl-tests all_reduce log of ``ranks`` ranks on one node; rows from line 4 + ranks."""
    rank_lines = [
        f"#  Rank {r:2d} Group  0 Pid  1{r} on   nodeA device {r:2d} [0x1b] NVIDIA H100 80GB HBM3"
        for r in range(ranks)
    ]
    lines = [
        f"# nThread 1 nGpus {ranks} minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5",
        *rank_lines,
        "# Collective test starting: all_reduce_perf",
        HEAD + "     time   algbw   busbw  #wrong",
        *rows,
    ]
    return "\n".join(lines) + "\n"


def test_a_valid_log_reads_both_rows():
    records = parse_nccl_tests_text(_all_reduce_log(ROWS))
    assert [(r.size_bytes, r.in_place, r.busbw_gbps) for r in records] == [
        (1048576, False, 52.43),
        (1048576, True, 55.19),
        (2097152, False, 69.91),
        (2097152, True, 72.32),
    ]


SHORT = " ".join(ROWS[1].split()[:7])
"""The second row cut after its out-of-place algbw (a log truncated mid-write)."""


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (SHORT, r"7 fields, where a row has 13 \(19 with min/median/p99 times\)"),
        (ROWS[1].replace("69.91   69.91", "69.91   inf"), "out-of-place busbw 'inf' is not finite"),
        (ROWS[1].replace("29.00", "nan"), "in-place time 'nan' is not finite"),
        (ROWS[1].replace("     -1 ", "     x1 "), "root 'x1' is not an integer"),
        (ROWS[1].replace("29.00", "abc"), "in-place time 'abc' is not a number"),
    ],
)
def test_a_broken_row_is_one_error_line_naming_file_line_and_text(tmp_path, row, problem):
    path = tmp_path / "run.txt"
    path.write_text(_all_reduce_log([ROWS[0], row]))  # line 6 is fine, line 7 is not
    with pytest.raises(
        ValueError, match=rf"^run\.txt line 7: {problem}: 2097152 524288 float"
    ) as e:
        read_results(path)
    assert "\n" not in str(e.value)
    assert str(e.value).endswith(" ".join(row.split()))


SINGLE = (
    "     1048576        262144     float     sum      -1    20.00   52.43    0.00       0"
    "    19.00   55.19    0.00       0"
)
"""An all_reduce row of a 1-rank run: bus factor 2(n-1)/n = 0, so busbw prints 0."""


@pytest.mark.parametrize("where", ["Rank lines", "nranks"])
def test_a_one_rank_run_says_it_has_no_bus_bandwidth(tmp_path, where):
    path = tmp_path / "single.txt"
    if where == "Rank lines":
        path.write_text(_all_reduce_log([SINGLE], ranks=1))
    else:
        path.write_text(f"h:1:1 NCCL INFO comm 0x1 rank 0 nranks 1 cudaDev 0\n{SINGLE}\n")
    message = (
        r"^single\.txt: a 1-rank run \(world size 1\) has no bus bandwidth to calibrate on; "
        r"measure with 2 or more ranks$"
    )
    with pytest.raises(ValueError, match=message):
        read_results(path, op="all_reduce")


def test_one_rank_blocks_beside_real_runs_are_skipped_with_a_warning():
    text = _all_reduce_log([SINGLE], ranks=1) + _all_reduce_log(ROWS, ranks=2)
    with pytest.warns(UserWarning, match=r"log block 1 .*: a 1-rank run .*; skipped"):
        records = parse_nccl_tests_text(text)
    assert len(records) == 4 and {r.world_size for r in records} == {2}


SENDRECV = "\n".join(
    [
        "# nThread 1 nGpus 8 minBytes 134217728 maxBytes 268435456 step: 2(factor)",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
        "   134217728      33554432     float     sum      -1   1211.2  110.81  110.81      0"
        "   1211.8  110.76  110.76    N/A",
        "   268435456      67108864     float     sum      -1   1423.3  188.60  188.60      0"
        "   1420.2  189.01  189.01    N/A",
        "",
    ]
)


def test_a_sendrecv_table_prints_its_reduction_and_reads_as_send_recv():
    """nccl-tests' sendrecv loops over the reductions (src/sendrecv.cu), so its redop column
    reads ``sum`` although nothing is reduced: the block is send_recv (busbw = algbw), with the
    redop as printed; the older ``none`` spelling reads too."""
    from vocab.collectives import get

    assert get("send_recv").prints_redop and not get("all_gather").prints_redop
    records = parse_nccl_tests_text(SENDRECV, name="sendrecv.txt", op="send_recv", world=8)
    out = [r for r in records if not r.in_place]
    assert [(r.op, r.size_bytes, r.time_us, r.redop) for r in out] == [
        ("send_recv", 134217728, 1211.2, "sum"),
        ("send_recv", 268435456, 1423.3, "sum"),
    ]
    older = parse_nccl_tests_text(SENDRECV.replace(" sum ", "none"), op="send_recv", world=8)
    assert [r.size_bytes for r in older if not r.in_place] == [134217728, 268435456]


def test_a_two_rank_table_with_a_reduction_and_no_op_reads_as_all_reduce():
    """On two ranks all_reduce's busbw factor is 1, as send_recv's, and both print the
    reduction: a block that does not say it is a sendrecv stays the all_reduce it was read as;
    one that says so is the send_recv."""
    table = SENDRECV.replace("nGpus 8", "nGpus 2")
    with pytest.warns(UserWarning, match="columns are those of all_reduce, no op named"):
        records = parse_nccl_tests_text(table, name="t.txt", world=2)
    assert {r.op for r in records} == {"all_reduce"}
    declared = parse_nccl_tests_text(table, name="t.txt", op="send_recv", world=2)
    assert {r.op for r in declared} == {"send_recv"}


def test_the_nccl_release_a_file_prints_is_read(tmp_path):
    from sim.inputs.measured import nccl_version_of

    log = tmp_path / "ar.log"
    log.write_text("host:1:1 [0] NCCL INFO NCCL version 2.26.2+cuda12.8\n#  size count\n")
    assert nccl_version_of(log) == "2.26.2"
    header = tmp_path / "ag.log"  # nccl-tests' own header: NCCL_VERSION_CODE
    header.write_text("# nccl-tests version 2.13.9 nccl-headers=21805 nccl-library=21803\n")
    assert nccl_version_of(header) == "2.18.3"
    document = tmp_path / "run.json"
    document.write_text('{"schema": "commbench/1", "env": {"nccl_version": "2.28.9"}}')
    assert nccl_version_of(document) == "2.28.9"
    silent = tmp_path / "plain.log"
    silent.write_text("#  size count type\n")
    assert nccl_version_of(silent) is None
    torch_suffix = tmp_path / "torch.json"  # newer torch: (2, 21, 5, 'a0'); older: 22105
    torch_suffix.write_text('{"schema": "commbench/1", "env": {"nccl_version": "2.21.5.a0"}}')
    assert nccl_version_of(torch_suffix) == "2.21.5"
    torch_suffix.write_text('{"schema": "commbench/1", "env": {"nccl_version": "22105"}}')
    assert nccl_version_of(torch_suffix) == "2.21.5"
    torch_suffix.write_text('{"schema": "commbench/1", "env": {"nccl_version": "two"}}')
    with pytest.raises(ValueError, match=r"torch\.json: nccl_version='two'"):
        nccl_version_of(torch_suffix)
    both = tmp_path / "both.log"
    both.write_text("NCCL version 2.18.3+cuda12.2\nNCCL version 2.26.2+cuda12.8\n")
    with pytest.raises(ValueError, match=r"prints several NCCL releases: 2\.18\.3, 2\.26\.2"):
        nccl_version_of(both)
