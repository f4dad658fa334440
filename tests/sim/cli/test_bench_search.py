"""Speed of ``commsim search`` on the issue's target (pytest-benchmark; skipped by default).

Llama 3 70B on 32 DGX H100 (256 GPUs), global batch 512, every default layout, 2 workers. Run
with ``python -m pytest tests/sim/cli/test_bench_search.py --benchmark-only``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sim.cli.main import main

ARGS = ["search", "--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "32",
        "--fabric", "ib-ndr", "--global-batch", "512", "-j", "2", "--top", "1"]  # fmt: skip


def test_bench_search_llama3_70b_on_256_gpus(benchmark: Any, tmp_path: Path) -> None:
    best = tmp_path / "best.yaml"
    code = benchmark.pedantic(main, args=([*ARGS, "--best-plan", str(best)],), rounds=1)
    assert code == 0
    plan = yaml.safe_load(best.read_text())
    assert plan["model"]["name"] == "llama3-70b"
