"""Throughput against memory per GPU for every simulated layout, with the Pareto front, titled
with the model and the cluster, and the GPU's HBM (and the search's headroom) as lines.

data = pareto_figure_bytes(rows, front, "png", title="llama3-8b on 8 x h100-sxm", hbm_gib=80)
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def pareto_figure_bytes(
    rows: Sequence[Any], front: Sequence[Any], fmt: str, *, title: str = "",
    hbm_gib: float | None = None, headroom: float = 1.0,
) -> bytes:  # fmt: skip
    """``pareto_figure`` as ``fmt`` bytes."""
    fig = pareto_figure(rows, front, title=title, hbm_gib=hbm_gib, headroom=headroom)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, bbox_inches="tight", dpi=120)
    return buffer.getvalue()


def pareto_figure(
    rows: Sequence[Any], front: Sequence[Any], *, title: str = "",
    hbm_gib: float | None = None, headroom: float = 1.0,
) -> Figure:  # fmt: skip
    """Every layout a dot, the front a line, the best one named; ``title`` (the model and
    cluster) over it, ``hbm_gib`` (the GPU's memory) and ``headroom`` x that (the search's
    limit) as vertical lines."""
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
    if hbm_gib is not None:
        ax.axvline(hbm_gib, color="black", linewidth=1.0, label=f"HBM ({hbm_gib:.0f} GiB)")
        if headroom < 1.0:
            ax.axvline(hbm_gib * headroom, color="black", linewidth=0.8, linestyle="--",
                       label=f"search limit ({headroom:.0%} of HBM)")  # fmt: skip
    ax.set_xlabel("memory per GPU (GiB, worst stage)")
    ax.set_ylabel("throughput (tokens/s)")
    what = "throughput against memory"
    ax.set_title(f"{title}: {what}" if title else f"commsim search: {what}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig
