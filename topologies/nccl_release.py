"""The NCCL release a cluster runs: software, not hardware, but it decides which algorithm and
protocol run (NCCL's tuning tables change between releases; ``sim.network.nccl_tables``).

    nccl_release("2.26.2+cuda12.8")  # (2, 26, 2)
"""

from __future__ import annotations

import re

from fileio.strict import shorten

_RELEASE = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+.][\w.+-]*)?")


def nccl_release(text: object) -> tuple[int, int, int]:
    """(major, minor, patch) of a release as NCCL prints it (``2.26.2``, ``2.26.2-1``,
    ``2.26.2+cuda12.8``, torch's ``2.21.5.a0``) or as its ``NCCL_VERSION_CODE`` (``22602``);
    ValueError naming the value otherwise."""
    code = str(text).strip() if isinstance(text, str | int) and not isinstance(text, bool) else ""
    if code.isdigit() and len(code) >= 5:  # major * 10000 + minor * 100 + patch
        number = int(code)
        return number // 10000, number // 100 % 100, number % 100
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
