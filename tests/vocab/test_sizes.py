"""vocab.sizes: nccl-tests' size syntax."""

from __future__ import annotations

import pytest

from vocab.sizes import parse_size


def test_sizes_use_binary_units():
    assert [parse_size(t) for t in ("64", "1K", "16M", "2G", "1kb", "4MiB")] == [
        64,
        1024,
        16 << 20,
        2 << 30,
        1024,
        4 << 20,
    ]


def test_decimal_sizes_as_nccl_tests_reads_them():
    # parsesize: sscanf("%lf %1s"), then the double cast to size_t
    assert [parse_size(t) for t in ("1.5K", "0.5M", ".25G", "2.", "1.3")] == [
        1536,
        512 << 10,
        256 << 20,
        2,
        1,
    ]


@pytest.mark.parametrize("text", ["", "1.2.5M", "-1K", "1X", "K", ".", "1e3"])
def test_bad_sizes_name_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="bad size"):
        parse_size(text)
