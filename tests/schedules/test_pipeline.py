"""Pipeline orders against Megatron's / torch's / sail-sg's published behaviour."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedules.pipeline import Pass, max_in_flight, passes_per_kind
from schedules.pipeline_schedules import pipeline_orders
from schedules.pipeline_schedules.gpipe import gpipe
from schedules.pipeline_schedules.interleaved import (
    interleaved,
    schedule_table,
    warmup_interleaved,
)
from schedules.pipeline_schedules.one_f_one_b import one_f_one_b, warmup_1f1b
from schedules.pipeline_schedules.zero_bubble import zb_h1


def names(order: tuple[Pass, ...]) -> list[str]:
    return [str(p) for p in order]


def test_1f1b_p2_m3_orders() -> None:
    rank0, rank1 = one_f_one_b(2, 3)
    assert names(rank0) == ["F0", "F1", "B0", "F2", "B1", "B2"]
    assert names(rank1) == ["F0", "B0", "F1", "B1", "F2", "B2"]


def test_1f1b_warmup_is_megatrons() -> None:
    assert [warmup_1f1b(4, r, 8) for r in range(4)] == [3, 2, 1, 0]
    assert [warmup_1f1b(4, r, 2) for r in range(4)] == [2, 2, 1, 0]
    # fewer micro-batches than stages: rank 0 runs every forward first
    assert names(one_f_one_b(4, 2)[0]) == ["F0", "F1", "B0", "B1"]


def test_1f1b_peak_in_flight_is_p_minus_r() -> None:
    orders = one_f_one_b(4, 8)
    assert [max_in_flight(o) for o in orders] == [4, 3, 2, 1]


def test_gpipe_runs_every_forward_first() -> None:
    order = gpipe(3, 3)[2]
    assert names(order) == ["F0", "F1", "F2", "B0", "B1", "B2"]
    assert max_in_flight(order) == 3


def test_megatron_schedule_table_example() -> None:
    # megatron/core/pipeline_parallel/schedules.py docstring: PP2, M5, VP2, group size 3
    table = schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


@pytest.mark.parametrize(
    ("p", "r", "v", "m", "expected"),
    [
        (4, 0, 2, 8, 10),  # 2*3 + 1*4
        (4, 3, 2, 8, 4),  # 0 + 4
        (4, 1, 3, 8, 12),  # 2*2 + 2*4
        (2, 0, 2, 4, 4),  # 2*1 + 1*2
        (4, 0, 2, 4, 8),  # 10 >= m*v = 8: everything is warmup
    ],
)
def test_interleaved_warmup_counts(p: int, r: int, v: int, m: int, expected: int) -> None:
    assert warmup_interleaved(p, r, m, v) == expected
    order = interleaved(p, m, v)[r]
    leading_forwards = next(i for i, step in enumerate(order) if step.kind == "B")
    # the first steady step is F(k + W) then B(k); with all-warmup every forward leads
    assert leading_forwards == (expected + 1 if expected < m * v else expected)


def test_interleaved_order_follows_the_table_and_reverses_chunks_in_backward() -> None:
    rank0 = interleaved(2, 5, 2, group_size=3)[0]
    warmup = warmup_interleaved(2, 0, 5, 2, 3)
    assert warmup == 2 + 3
    assert names(rank0[:warmup]) == ["F0", "F1", "F2", "F0.c1", "F1.c1"]
    # steady: F(k + W) then B(k), backward chunk = v - 1 - table chunk
    assert names(rank0[warmup : warmup + 4]) == ["F2.c1", "B0.c1", "F3", "B1.c1"]


def test_interleaved_rejects_what_megatron_rejects() -> None:
    with pytest.raises(ValueError, match="group size"):
        interleaved(4, 6, 2)  # m % p = 2 < p
    with pytest.raises(ValueError, match="vpp >= 2"):
        interleaved(4, 8, 1)


def test_zb_h1_defers_r_weight_passes_on_rank_r() -> None:
    orders = zb_h1(4, 6)
    assert names(orders[0]) == names(one_f_one_b(4, 6)[0])
    last = orders[3]
    assert names(last) == [
        "F0", "Bi0", "F1", "Bi1", "F2", "Bi2", "F3", "Bi3", "W0",
        "F4", "Bi4", "W1", "F5", "Bi5", "W2", "W3", "W4", "W5",
    ]  # fmt: skip
    for r, order in enumerate(orders[1:], start=1):
        assert passes_per_kind(order) == {"F": 6, "B": 0, "Bi": 6, "W": 6}
        after_last_bi = len(order) - 1 - max(i for i, s in enumerate(order) if s.kind == "Bi")
        assert after_last_bi == r + 1  # the W popped after it, then the r held back


@given(
    st.sampled_from(["1f1b", "gpipe", "zb-h1"]),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=1, max_value=12),
)
def test_every_schedule_runs_each_pass_once_forward_first(schedule: str, p: int, m: int) -> None:
    for order in pipeline_orders(schedule, p, m):
        seen: dict[str, set[int]] = {"F": set(), "B": set(), "Bi": set(), "W": set()}
        for step in order:
            assert step.microbatch not in seen[step.kind]
            if step.kind in ("B", "Bi"):
                assert step.microbatch in seen["F"]
            if step.kind == "W":
                assert step.microbatch in seen["Bi"]
            seen[step.kind].add(step.microbatch)
        assert seen["F"] == set(range(m))
        assert seen["B"] | seen["Bi"] == set(range(m))


@given(st.integers(2, 5), st.integers(2, 3), st.integers(1, 3))
def test_interleaved_covers_every_chunk_and_microbatch(p: int, v: int, groups: int) -> None:
    m = p * groups
    for order in interleaved(p, m, v):
        forward = [(s.microbatch, s.chunk) for s in order if s.kind == "F"]
        backward = [(s.microbatch, s.chunk) for s in order if s.kind == "B"]
        expected = {(mb, c) for mb in range(m) for c in range(v)}
        assert set(forward) == expected == set(backward)
        assert len(forward) == len(backward) == m * v


def test_unknown_schedule_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        pipeline_orders("dualpipe", 2, 4)
