"""Published measurements the project calibrates and validates on, shipped with it.

``nccl/``: nccl-tests tables and busbw curves from real servers; ``validation/cases.json``:
published training runs with every knob needed to simulate them. Each file names its source
(``README.md`` here); none of it was measured by this project. Data only: imports nothing.

    from refdata import CASES_PATH, NCCL_DIR
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent
"""This folder, wherever the package is installed."""
NCCL_DIR = ROOT / "nccl"
"""Published nccl-tests results (``*.txt`` raw logs, ``*.csv`` busbw curves)."""
COLLECTIVES_DIR = ROOT / "collectives"
"""Public nccl-tests results of many clusters (``<cluster>/cluster.json`` and its files)."""
CASES_PATH = ROOT / "validation" / "cases.json"
"""Published training runs (``commsim validate``'s default cases file)."""
