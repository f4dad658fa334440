"""The NCCL release a cluster runs: software, not hardware, but it decides which algorithm and
protocol run (NCCL's tuning tables change between releases; ``sim.network.nccl_tables``).

    nccl_release("2.26.2+cuda12.8")  # (2, 26, 2)
"""

from __future__ import annotations

import re

from fileio.strict import shorten

_RELEASE = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+][\w.+-]*)?")


def nccl_release(text: object) -> tuple[int, int, int]:
    """(major, minor, patch) of a release as NCCL prints it (``2.26.2``, ``2.26.2-1``,
    ``2.26.2+cuda12.8``); ValueError naming the value otherwise."""
    match = _RELEASE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"nccl_version={shorten(text)}; expected a release such as 2.26.2 (as NCCL prints it)"
        )
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def check_nccl_version(text: object) -> str:
    """``text`` as ``major.minor.patch`` (checked; ``""`` stays ``""``: the default release)."""
    if text == "":
        return ""
    return ".".join(str(part) for part in nccl_release(text))
