"""Per-iteration statistics from time marks."""

from __future__ import annotations

from comm_bench.timing import percentile_nearest_rank, summarize


def test_summary_of_marks_by_hand():
    timing = summarize([0.0, 1.0, 3.0, 6.0, 10.0])  # samples 1, 2, 3, 4
    assert (timing.mean_s, timing.min_s, timing.median_s, timing.p99_s, timing.num_iters) == (
        2.5,
        1.0,
        2.5,
        4.0,
        4,
    )


def test_nearest_rank_percentile():
    samples = list(range(1, 201))  # 1..200: p99 is the 198th smallest
    assert percentile_nearest_rank(samples, 99) == 198
    assert percentile_nearest_rank([5.0, 1.0, 3.0], 99) == 5.0
    assert percentile_nearest_rank([5.0, 1.0, 3.0], 50) == 3.0
