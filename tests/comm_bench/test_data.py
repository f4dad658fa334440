"""The input patterns: every reduction exact in every dtype, checked by emulating the ranks."""

from __future__ import annotations

import pytest
import torch

from comm_bench.data import (
    EXACT_LIMIT,
    TORCH_DTYPES,
    count_wrong,
    expected_output,
    fill_input,
    reduce_pattern,
)
from vocab.collectives import REDUCTIONS


def test_sum_pattern_by_hand():
    # 4 ranks, int8: m = 8 (4 x 7 <= 127); residue 0 sums 0+1+2+3, residue 5 sums 5+6+7+0
    pattern = reduce_pattern("sum", 4, "int8")
    assert pattern.modulus == 8
    assert pattern.expected == (6, 10, 14, 18, 22, 18, 14, 10)


def test_prod_and_large_world_sum_patterns_by_hand():
    # 3 ranks hold v = [2, 1] shifted by rank: residue 0 sees 2, 1, 2 -> 4; residue 1 sees 1, 2, 1
    assert reduce_pattern("prod", 3, "bfloat16").expected == (4, 2)
    # 300 ranks cannot sum 0..1 in bfloat16 (limit 256): sparse ones every 2 ranks -> 150
    large = reduce_pattern("sum", 300, "bfloat16")
    assert (large.values, large.expected) == ((1, 0), (150, 150))
    # int8 prod: at most 6 twos meet (2**6 = 64 <= 127), so 8 ranks use m = 2: 2**4
    assert reduce_pattern("prod", 8, "int8").expected == (16, 16)


def _emulate(redop: str, world: int, dtype: str, num_elems: int, rep: int) -> torch.Tensor:
    """Reduce all ranks' inputs one by one in the dtype itself, as a backend would."""
    pattern = reduce_pattern(redop, world, dtype)
    inputs = []
    for rank in range(world):
        buf = torch.zeros(num_elems, dtype=TORCH_DTYPES[dtype])
        fill_input("all_reduce", buf, rank, world, rep, pattern)
        inputs.append(buf)
    acc = inputs[0].clone()
    for x in inputs[1:]:
        if redop in ("sum", "avg"):
            acc += x
        elif redop == "prod":
            acc *= x
        else:
            acc = torch.minimum(acc, x) if redop == "min" else torch.maximum(acc, x)
    if redop == "avg":
        acc = (
            acc / world if acc.is_floating_point() else torch.div(acc, world, rounding_mode="trunc")
        )
    return acc.to(TORCH_DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("redop", REDUCTIONS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 8, 64, 300])
def test_reductions_are_exact_in_every_dtype(dtype, redop, world):
    pattern = reduce_pattern(redop, world, dtype)
    if not pattern.exact:
        assert redop == "avg" and (world & (world - 1) or world > EXACT_LIMIT[dtype])
        return
    for rep in (0, 1):
        result = _emulate(redop, world, dtype, 40, rep)
        expected = expected_output("all_reduce", result, 0, world, 0, rep, pattern)
        assert count_wrong(result, expected, rank=0) == 0
    assert max(abs(v) for v in pattern.expected) <= EXACT_LIMIT[dtype]


def test_gather_scatter_and_p2p_expectations_by_hand():
    world, count = 3, 4
    recv = torch.zeros(world * count, dtype=torch.int8)
    gathered = expected_output("all_gather", recv, 1, world, 0, 0, None)
    # element g of the output is rank g // 4's value at g: (g + 3 * owner) % 113
    assert gathered.tolist() == [0, 1, 2, 3, 7, 8, 9, 10, 14, 15, 16, 17]
    a2a = expected_output("all_to_all", recv, 1, world, 0, 0, None)
    # rank 1 receives chunk 1 (elements 4..7) of each sender s
    assert a2a.tolist() == [4, 5, 6, 7, 7, 8, 9, 10, 10, 11, 12, 13]
    one = torch.zeros(count, dtype=torch.int8)
    assert expected_output("send_recv", one, 0, world, 0, 0, None).tolist() == [6, 7, 8, 9]
    assert expected_output("broadcast", one, 0, world, 2, 0, None).tolist() == [6, 7, 8, 9]
    assert expected_output("reduce", one, 1, world, 0, 0, reduce_pattern("sum", 3, "int8")) is None


def test_corruption_hook_makes_one_element_wrong(monkeypatch):
    expected = torch.arange(5, dtype=torch.float32)
    monkeypatch.setenv("COMMBENCH_CORRUPT_RANK", "1")
    assert count_wrong(expected.clone(), expected, rank=0) == 0
    assert count_wrong(expected.clone(), expected, rank=1) == 1


def test_tolerant_comparison_for_inexact_average():
    expected = torch.tensor([3.0, 3.0], dtype=torch.bfloat16)
    nearly = torch.tensor([3.0, 3.015625], dtype=torch.bfloat16)  # one bf16 ulp above 3
    assert count_wrong(nearly, expected, rank=0) == 1
    assert count_wrong(nearly, expected, rank=0, ulps=6) == 0
