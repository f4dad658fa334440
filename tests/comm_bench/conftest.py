"""Shared helpers: run commbench as a user would (a subprocess) and read what it wrote.

Runs use gloo unless a test names a backend, so that the suite passes the same on a laptop, a
CI runner and a GPU box (where ``--backend auto`` would pick NCCL: one rank per GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import refdata

SHARED_DATA = Path(refdata.ROOT)
"""The published measurements shipped with the project."""


@dataclass(frozen=True)
class Run:
    """One finished commbench process."""

    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float
    output: Path

    def document(self) -> dict[str, Any]:
        return json.loads(self.output.read_text())


def run_commbench(
    tmp_path: Path,
    args: list[str],
    env: dict[str, str] | None = None,
    launcher: list[str] | None = None,
    timeout_s: float = 120.0,
) -> Run:
    """Run ``python -m comm_bench args --output tmp/run.json`` (or under ``launcher``)."""
    output = tmp_path / "run.json"
    full_env = dict(os.environ, PYTHONWARNINGS="ignore", **(env or {}))
    if "--backend" not in args:
        args = [*args, "--backend", "gloo"]
    command = (launcher or [sys.executable, "-m", "comm_bench"]) + args + ["--output", str(output)]
    start = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, env=full_env, cwd=tmp_path, timeout=timeout_s
    )
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - start, output)


@pytest.fixture
def commbench(tmp_path: Path) -> Callable[..., Run]:
    """``commbench(args, env=...)`` runs the command in a fresh directory."""
    return lambda args, **kw: run_commbench(tmp_path, args, **kw)
