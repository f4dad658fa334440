"""Selectors, scoring and the comparison plot."""

from __future__ import annotations

from dataclasses import replace

import pytest

from comm_bench.records import Record
from sim.network.compare import (
    any_matches,
    compare_records,
    format_table,
    mape,
    parse_selector,
    plot_comparison,
    summary,
)
from topologies.presets import build_cluster

BASE = Record(
    op="all_gather", size_bytes=1 << 20, count=1 << 15, dtype="float32", world_size=8,
    num_nodes=1, in_place=False, time_us=40.0, algbw_gbps=0.0, busbw_gbps=0.0,
)  # fmt: skip


def test_selectors_pick_records_by_op_nodes_size_and_placement():
    assert parse_selector("op=all_gather,reduce_scatter").matches(BASE)
    assert not parse_selector("op=all_reduce").matches(BASE)
    assert parse_selector("size<2M").matches(BASE) and not parse_selector("size<1M").matches(BASE)
    assert parse_selector("size>=1M & nodes=1 & placement=out").matches(BASE)
    assert not parse_selector("op!=all_gather").matches(BASE)
    assert parse_selector("world>4").matches(BASE)
    assert any_matches(
        [parse_selector("nodes=8"), parse_selector("algo=ring")], replace(BASE, algo="Ring")
    )


@pytest.mark.parametrize("text", ["speed=3", "op", "size<big", "nodes=two", "op<3", "size<1M,2M"])
def test_bad_selectors_name_the_term(text):
    with pytest.raises(ValueError):
        parse_selector(text)


def _factory(num_nodes: int, _per_node: int):
    return build_cluster("dgx-h100", num_nodes, "ib-ndr" if num_nodes > 1 else None)


def test_compare_scores_time_errors_and_marks_fitted_points(tmp_path):
    records = [
        replace(BASE, size_bytes=s, time_us=t) for s, t in ((1 << 20, 40.0), (1 << 30, 3000.0))
    ]
    records.append(replace(BASE, in_place=True))  # in-place twins are ignored
    points = compare_records(records, _factory, None, used_for_fit=lambda r: r.size_bytes < 1 << 25)
    assert [p.size_bytes for p in points] == [1 << 20, 1 << 30]
    for p, r in zip(points, records, strict=False):
        assert p.error_pct == pytest.approx((p.simulated_time_us - r.time_us) / r.time_us * 100)
    assert [p.used_for_fit for p in points] == [True, False]
    stats = summary(points, min_size_bytes=1 << 25)
    assert stats["scored_on"] == "held-out points" and stats["num_points"] == 1
    assert summary(points[1:], min_size_bytes=0)["scored_on"] == "all points"
    assert stats["mape_pct"] == pytest.approx(abs(points[1].error_pct))
    assert mape(points, min_size_bytes=1 << 40) is None
    assert len(format_table(points)) == 4
    path = tmp_path / "plot.png"
    plot_comparison(points, str(path), title="t")
    assert path.read_bytes()[:4] == b"\x89PNG"
