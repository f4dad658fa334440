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


@pytest.mark.parametrize("text", ["", "1.5M", "-1K", "1X", "K"])
def test_bad_sizes_name_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="bad size"):
        parse_size(text)
