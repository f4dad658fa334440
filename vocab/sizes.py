"""Sizes as nccl-tests writes them on its command line: ``64``, ``1K``, ``16M``, ``2G``.

Binary units (K = 1024 bytes), an optional ``B``/``iB`` after the unit, any letter case, and a
decimal fraction as nccl-tests' ``parsesize`` reads one (``1.5K`` is 1536 bytes; a fraction of a
byte is dropped, as its cast to ``size_t`` does); what commbench's ``-b/-e/-i`` flags, commsim's
size flags and ``--only 'size>=1M'`` selectors take.

    >>> parse_size("16M")
    16777216
"""

from __future__ import annotations

import re
from fractions import Fraction

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(
    r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE | re.ASCII
)
"""ASCII digits only: ``\\d`` would take a full-width ``１K`` (which ``int`` reads as 1)."""


def parse_size(text: str) -> int:
    """``"64"``, ``"1K"``, ``"16M"``, ``"2G"`` (binary units, as nccl-tests) to bytes."""
    match = _SIZE_RE.match(text)
    if match is None:
        raise ValueError(f"bad size {text!r}; use a number with an optional K, M, G or T suffix")
    return int(Fraction(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])
