"""Throughput against memory per GPU for every simulated layout, with the Pareto front.

data = pareto_figure_bytes(rows, front, "png")
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def pareto_figure_bytes(rows: Sequence[Any], front: Sequence[Any], fmt: str) -> bytes:
    """The plot as ``fmt`` bytes: every layout a dot, the front a line, the best one named."""
    fig = Figure(figsize=(8, 5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.scatter([r.memory_gib for r in rows], [r.tokens_per_s for r in rows], s=12,
               color="#999999", label=f"layouts ({len(rows)})")  # fmt: skip
    ax.plot([r.memory_gib for r in front], [r.tokens_per_s for r in front], "o-",
            color="#c44e52", label="Pareto front (no layout faster with less memory)")  # fmt: skip
    best = max(rows, key=lambda r: r.tokens_per_s)
    ax.annotate(best.name, (best.memory_gib, best.tokens_per_s), fontsize=7,
                xytext=(5, -12), textcoords="offset points")  # fmt: skip
    ax.set_xlabel("memory per GPU (GiB, worst stage)")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title("commsim search: throughput against memory")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, bbox_inches="tight", dpi=120)
    return buffer.getvalue()
