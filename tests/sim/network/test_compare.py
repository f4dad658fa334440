"""Selectors, scoring and the comparison plot."""

from __future__ import annotations

from dataclasses import replace

import pytest
from matplotlib.container import ErrorbarContainer

from sim.network.compare import (
    SPREAD_NOTE,
    any_matches,
    compare_records,
    comparison_figure,
    describe_holdout,
    format_table,
    mape,
    parse_selector,
    plot_comparison,
    summary,
)
from topologies.presets import build_cluster
from vocab.records import Record

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
    svg = tmp_path / "plot.svg"  # the format follows the suffix
    plot_comparison(points, str(svg), title="t")
    assert b"<svg" in svg.read_bytes()[:500]


def _ring_and_nvls_records() -> list[Record]:
    """all_reduce on 8 GPUs measured with Ring and with NVLS at the same sizes (as nccl-tests)."""
    base = replace(BASE, op="all_reduce")
    return [
        replace(base, size_bytes=1 << shift, time_us=time_us, algo=algo)
        for algo, scale in (("ring", 1.0), ("nvls", 0.8))
        for shift, time_us in ((20, 40.0 * scale), (26, 330.0 * scale), (30, 5000.0 * scale))
    ]


def test_one_series_per_measured_algorithm_and_no_zigzag():
    points = compare_records(_ring_and_nvls_records(), _factory, None)
    assert [p.series() for p in points[::3]] == [
        "all_reduce (ring), 8 ranks / 1 node(s)",
        "all_reduce (nvls), 8 ranks / 1 node(s)",
    ]
    assert [p.algo for p in points] == ["ring"] * 3 + ["nvls"] * 3
    ax = comparison_figure(points, title="t").axes[0]
    simulated = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    assert [line.get_label() for line in simulated] == [
        f"all_reduce (ring), 8 ranks / 1 node(s): simulated (time MAPE {mape(points[:3]):.1f}%)",
        f"all_reduce (nvls), 8 ranks / 1 node(s): simulated (time MAPE {mape(points[3:]):.1f}%)",
    ]
    for line in simulated:
        sizes = list(line.get_xdata())
        assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes) == 3
    measured = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(measured) == 2
    assert summary(points, min_size_bytes=0)["series"].keys() == {
        "all_reduce (ring), 8 ranks / 1 node(s)",
        "all_reduce (nvls), 8 ranks / 1 node(s)",
    }


def test_the_table_error_is_on_busbw_and_says_so():
    records = [replace(BASE, size_bytes=1 << 30, time_us=3000.0)]
    (point,) = compare_records(records, _factory, None)
    expected = (point.simulated_busbw_gbps - point.measured_busbw_gbps) / point.measured_busbw_gbps
    assert point.busbw_error_pct == pytest.approx(expected * 100)
    # busbw is inverse to time: the busbw error is not the time error (nor its negative).
    assert point.busbw_error_pct == pytest.approx(
        (point.measured_time_us / point.simulated_time_us - 1) * 100
    )
    header, units, row = format_table([point])
    assert header.split()[-2:] == ["busbw", "fit"] and units.split()[-1] == "err(%)"
    assert row.split()[-2:] == [f"{point.busbw_error_pct:+.1f}", "no"]


def test_the_table_shows_small_busbw_values():
    point = replace(
        compare_records([BASE], _factory, None)[0],
        measured_busbw_gbps=0.000253,
        simulated_busbw_gbps=0.0002344,
    )
    assert "0.000253  0.0002344" in format_table([point])[2]


def test_plot_is_log_log_with_the_measured_spread_as_bars():
    records = [
        replace(BASE, size_bytes=s, time_us=t, time_min_us=t / 2, time_p99_us=t * 4)
        for s, t in ((1 << 10, 30.0), (1 << 20, 40.0), (1 << 30, 3000.0))
    ]
    points = compare_records(records, _factory, None)
    fig = comparison_figure(points, title="t")
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    (container,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert container.has_yerr
    (bars,) = container.lines[2]
    for segment, p in zip(bars.get_segments(), points, strict=True):
        low, high = p.measured_busbw_range_gbps() or (0.0, 0.0)
        assert low == pytest.approx(p.measured_busbw_gbps / 4)  # at the p99 time
        assert high == pytest.approx(p.measured_busbw_gbps * 2)  # at the fastest time
        assert sorted(segment[:, 1]) == pytest.approx([low, high])
    legend = ax.get_legend()
    assert legend is not None and legend.get_title().get_text() == SPREAD_NOTE
    # Without a spread (an nccl-tests table): no bars, no note.
    ax = comparison_figure(compare_records([BASE], _factory, None), title="t").axes[0]
    (container,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert not container.has_yerr
    legend = ax.get_legend()
    assert legend is not None and legend.get_title().get_text() == ""


def test_measured_labels_say_held_out_only_when_something_was_fitted():
    def labels(used_for_fit):
        points = compare_records([BASE], _factory, None, used_for_fit=used_for_fit)
        ax = comparison_figure(points, title="t").axes[0]
        legend = ax.get_legend()
        assert legend is not None
        return [t.get_text() for t in legend.get_texts()]

    series = "all_gather, 8 ranks / 1 node(s)"
    assert labels(lambda _r: False)[1] == f"{series}: measured"
    fitted = compare_records(
        [BASE, replace(BASE, size_bytes=1 << 30, time_us=3000.0)],
        _factory,
        None,
        used_for_fit=lambda r: r.size_bytes < 1 << 25,
    )
    legend = comparison_figure(fitted, title="t").axes[0].get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()][1:] == [
        f"{series}: measured (fitted on)",
        f"{series}: measured (held out)",
    ]


@pytest.mark.parametrize(
    ("holdouts", "expected"),
    [
        (["op!=all_reduce,all_gather"],
         "fitted on op=all_reduce,all_gather, scored on op!=all_reduce,all_gather"),
        (["op=all_gather,reduce_scatter"],
         "fitted on op!=all_gather,reduce_scatter, scored on op=all_gather,reduce_scatter"),
        (["nodes=8"], "fitted on nodes!=8, scored on nodes=8"),
        (["size<1M"], "fitted on size>=1M, scored on size<1M"),
        (["size<1M & nodes=1"], "fitted on size>=1M | nodes!=1, scored on size<1M & nodes=1"),
        (["nodes=8", "algo=nvls"],
         "fitted on nodes!=8 & algo!=nvls, scored on nodes=8 | algo=nvls"),
        (["nodes=8 & op=all_reduce", "size>4K"],
         "fitted on the other records, scored on nodes=8 & op=all_reduce | size>4K"),
    ],
)  # fmt: skip
def test_holdout_description_reads_without_double_negation(holdouts, expected):
    assert describe_holdout([parse_selector(text) for text in holdouts]) == expected


def test_errors_per_op_size_band_and_node_count() -> None:
    from sim.network.compare import Point, band_errors, size_band

    def point(op: str, nodes: int, size: int, error: float) -> Point:
        return Point(op=op, world_size=8 * nodes, num_nodes=nodes, size_bytes=size, algo="ring",
                     measured_time_us=100.0, simulated_time_us=100.0 * (1 + error / 100),
                     measured_busbw_gbps=1.0, simulated_busbw_gbps=1.0, error_pct=error,
                     busbw_error_pct=-error, used_for_fit=False)  # fmt: skip

    assert [size_band(s) for s in (1024, 1 << 16, 8 << 20, 1 << 26, 8 << 30)] == [
        "< 64 KiB", "64 KiB - 1 MiB", "1 - 64 MiB", "64 MiB - 1 GiB", ">= 1 GiB",
    ]  # fmt: skip
    rows = band_errors([
        point("all_reduce", 2, 4 << 20, -30.0), point("all_reduce", 2, 8 << 20, -10.0),
        point("all_reduce", 1, 2 << 30, 4.0), point("all_gather", 1, 1024, 50.0),
    ])  # fmt: skip
    assert [(r["op"], r["num_nodes"], r["band"], r["num_points"]) for r in rows] == [
        ("all_gather", 1, "< 64 KiB", 1),
        ("all_reduce", 1, ">= 1 GiB", 1),
        ("all_reduce", 2, "1 - 64 MiB", 2),
    ]
    assert (rows[2]["mape_pct"], rows[2]["mean_error_pct"]) == (20.0, -20.0)
