"""vocab.collectives against hand-computed nccl-tests numbers."""

from __future__ import annotations

import pytest

from vocab.collectives import (
    algbw_gbps,
    busbw_gbps,
    canonical_op,
    get,
    parse_ops,
    time_from_busbw_s,
)


def test_bus_factors_by_hand():
    assert get("all_reduce").busbw_factor(8) == 2 * 7 / 8
    assert get("all_gather").busbw_factor(4) == 3 / 4
    assert get("reduce_scatter").busbw_factor(3) == 2 / 3
    assert get("all_to_all").busbw_factor(2) == 1 / 2
    assert get("broadcast").busbw_factor(8) == get("send_recv").busbw_factor(8) == 1.0


def test_published_row_arithmetic():
    # h100 all_reduce ring, 1 GiB: 5208.30 us -> algbw 206.16, busbw 360.78 (as printed)
    size, t = 1073741824, 5208.30e-6
    assert round(algbw_gbps(size, t), 2) == 206.16
    assert round(busbw_gbps("all_reduce", size, t, 8), 2) == 360.78
    assert time_from_busbw_s("all_reduce", size, 360.78, 8) == pytest.approx(t, rel=2e-5)


def test_counts_round_per_rank_to_16_bytes():
    # 80 ranks, 32 MiB float32 all_gather: per rank 104857.6 -> 104857 -> 104856 (x4 aligned)
    counts = get("all_gather").counts(33554432, 4, 80)
    assert (counts.count, counts.size_bytes) == (104856, 33553920)
    rs = get("reduce_scatter").counts(1024, 4, 3)
    assert (rs.send_elems, rs.recv_elems, rs.count, rs.size_bytes) == (252, 84, 84, 1008)
    ar = get("all_reduce").counts(1000, 8, 3)
    assert (ar.count, ar.size_bytes) == (125, 1000)


def test_op_names():
    assert (
        canonical_op("allreduce") == "all_reduce" and canonical_op("sendrecv_perf") == "send_recv"
    )
    assert parse_ops("all_gather, reduce_scatter,all_gather") == ["all_gather", "reduce_scatter"]
    assert len(parse_ops("all")) == 7
    with pytest.raises(ValueError, match="unknown op 'gather'"):
        parse_ops("gather")
