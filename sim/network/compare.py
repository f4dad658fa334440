"""Measured against simulated collectives: per-point error, MAPE, hold-out selection, the plot.

Errors are simulated minus measured, relative to measured: ``error_pct`` on time (what the MAPE
averages), ``busbw_error_pct`` on busbw (what the table prints next to the busbw columns).

Records are picked for hold-out and filtering with ``sim/network/selectors.py`` (re-exported).

    points = compare_records(records, factory, calibration); print(format_table(points))
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib
import simpy
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogFormatter

from fileio.output import Target, write_bytes
from sim.network.calibration import Calibration
from sim.network.comm_model import CommModel
from sim.network.fitting import TopologyFactory, record_ranks, record_time_s
from sim.network.selectors import (
    Selector,
    Term,
    any_matches,
    describe_holdout,
    parse_selector,
)
from vocab.collectives import busbw_gbps
from vocab.records import NCCL_ALGO_NAMES, Record

__all__ = [
    "Point",
    "Selector",
    "Term",
    "any_matches",
    "band_errors",
    "compare_records",
    "describe_holdout",
    "format_table",
    "mape",
    "parse_selector",
    "plot_comparison",
    "points_json",
    "size_band",
    "summary",
]

SPREAD_NOTE = "bars: busbw of the p99 (low)\nto the fastest (high) iteration"
"""Legend title of a comparison plot whose measurements carry their spread."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One measured record next to its simulation."""

    op: str
    """Collective."""
    world_size: int
    """Ranks."""
    num_nodes: int
    """Servers."""
    size_bytes: int
    """nccl-tests size."""
    algo: str
    """Algorithm simulated."""
    protocol: str = ""
    """NCCL protocol simulated (``ll``, ``ll128``, ``simple``; empty where none applies)."""
    measured_time_us: float
    """Measured time."""
    simulated_time_us: float
    """Simulated time."""
    measured_busbw_gbps: float
    """Measured busbw."""
    simulated_busbw_gbps: float
    """Simulated busbw."""
    error_pct: float
    """(simulated - measured) / measured time, in percent (what ``mape`` averages)."""
    busbw_error_pct: float
    """(simulated - measured) / measured busbw, in percent (the table's error column)."""
    used_for_fit: bool
    """Whether the calibration was fitted on this point."""
    measured_algo: str = ""
    """Algorithm the measurement names (an nccl-tests log's header), '' when it names none."""
    measured_time_min_us: float | None = None
    """Fastest measured iteration, when the measurement has it (commbench JSON)."""
    measured_time_p99_us: float | None = None
    """99th-percentile measured iteration, when the measurement has it."""

    def series(self) -> str:
        """Label of the curve the point belongs to: one per op, algorithm measured and layout."""
        algo = f" ({self.measured_algo})" if self.measured_algo else ""
        return f"{self.op}{algo}, {self.world_size} ranks / {self.num_nodes} node(s)"

    def measured_busbw_range_gbps(self) -> tuple[float, float] | None:
        """busbw at the p99 and at the fastest iteration (low, high); None without the spread."""
        if not self.measured_time_min_us or not self.measured_time_p99_us:
            return None
        low, high = (
            busbw_gbps(self.op, self.size_bytes, t_us * 1e-6, self.world_size)
            for t_us in (self.measured_time_p99_us, self.measured_time_min_us)
        )
        return low, high


def compare_records(
    records: Sequence[Record],
    topology_for: TopologyFactory,
    calibration: Calibration | None,
    *,
    fidelity: str = "analytical",
    algo: str = "auto",
    used_for_fit: Callable[[Record], bool] = lambda _r: False,
) -> list[Point]:
    """Simulate every out-of-place record (in-place when that is all there is), in order.

    The record's own algorithm is simulated when it names one, else ``algo``.
    """
    chosen = [r for r in records if not r.in_place] or list(records)
    points = []
    for record in chosen:
        topology = topology_for(record.num_nodes, record.world_size // max(record.num_nodes, 1))
        ranks = record_ranks(record, topology)
        model = CommModel(simpy.Environment(), topology, fidelity=fidelity, calibration=calibration)
        forced = NCCL_ALGO_NAMES.get(record.algo.lower()) if record.algo else None
        run_algo, protocol = model.choice(record.op, ranks, record.size_bytes, forced or algo)
        model.env.run(model.run(record.op, ranks, record.size_bytes, algo=run_algo))
        simulated_s = model.env.now
        measured_s = record_time_s(record)
        n = record.world_size
        measured_busbw = busbw_gbps(record.op, record.size_bytes, measured_s, n)
        simulated_busbw = busbw_gbps(record.op, record.size_bytes, simulated_s, n)
        points.append(
            Point(
                op=record.op, world_size=record.world_size, num_nodes=record.num_nodes,
                size_bytes=record.size_bytes, algo=run_algo, protocol=protocol or "",
                measured_time_us=measured_s * 1e6,
                simulated_time_us=simulated_s * 1e6,
                measured_busbw_gbps=measured_busbw, simulated_busbw_gbps=simulated_busbw,
                error_pct=(simulated_s - measured_s) / measured_s * 100.0,
                busbw_error_pct=(simulated_busbw - measured_busbw) / measured_busbw * 100.0,
                used_for_fit=used_for_fit(record), measured_algo=forced or record.algo or "",
                measured_time_min_us=record.time_min_us, measured_time_p99_us=record.time_p99_us,
            )
        )  # fmt: skip
    return points


def mape(points: Sequence[Point], *, min_size_bytes: int = 0) -> float | None:
    """Mean absolute percentage error of the time over points >= ``min_size_bytes`` (None: none)."""
    chosen = [abs(p.error_pct) for p in points if p.size_bytes >= min_size_bytes]
    return sum(chosen) / len(chosen) if chosen else None


SIZE_BANDS: tuple[tuple[str, int], ...] = (
    ("< 64 KiB", 0),
    ("64 KiB - 1 MiB", 1 << 16),
    ("1 - 64 MiB", 1 << 20),
    ("64 MiB - 1 GiB", 1 << 26),
    (">= 1 GiB", 1 << 30),
)
"""Size bands of the error breakdown (latency-bound, protocol switches, bandwidth-bound)."""


def size_band(size_bytes: int) -> str:
    """The ``SIZE_BANDS`` label a message size falls in."""
    return [name for name, low in SIZE_BANDS if size_bytes >= low][-1]


def band_errors(points: Sequence[Point]) -> list[dict[str, Any]]:
    """Time MAPE and mean signed error per (op, size band, node count), in a stable order: where
    the model is weak, across every measurement file compared at once."""
    groups: dict[tuple[str, int, str], list[Point]] = {}
    for p in points:
        groups.setdefault((p.op, p.num_nodes, size_band(p.size_bytes)), []).append(p)
    order = [name for name, _ in SIZE_BANDS]
    rows = []
    for (op, nodes, band), ps in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], order.index(kv[0][2]))
    ):
        rows.append(
            {
                "op": op,
                "num_nodes": nodes,
                "band": band,
                "num_points": len(ps),
                "mape_pct": mape(ps),
                "mean_error_pct": sum(p.error_pct for p in ps) / len(ps),
            }
        )
    return rows


def summary(points: Sequence[Point], *, min_size_bytes: int) -> dict[str, Any]:
    """MAPE overall and per series, on the scored points, all sizes and >= ``min_size_bytes``."""
    scored = [p for p in points if not p.used_for_fit] or list(points)
    series: dict[str, list[Point]] = {}
    for p in scored:
        series.setdefault(p.series(), []).append(p)
    return {
        "scored_on": "held-out points" if len(scored) < len(points) else "all points",
        "num_points": len(scored),
        "min_size_bytes": min_size_bytes,
        "mape_pct": mape(scored),
        "mape_pct_min_size": mape(scored, min_size_bytes=min_size_bytes),
        "series": {
            name: {
                "mape_pct": mape(ps),
                "mape_pct_min_size": mape(ps, min_size_bytes=min_size_bytes),
                "num_points": len(ps),
            }
            for name, ps in series.items()
        },
        "bands": band_errors(scored),
    }  # fmt: skip


def format_table(points: Sequence[Point]) -> list[str]:
    """Text rows: series, size, algorithm, busbw measured / simulated, busbw error, fit marker.

    The error is on busbw, as the two columns before it: (simulated - measured) / measured.
    busbw has four significant digits, so the small sizes of a slow fabric do not read 0.00.
    """
    lines = [
        "#  op              ranks nodes         size  algo           proto    measured"
        "  simulated   busbw  fit",
        "#                                       (B)                           (GB/s)"
        "     (GB/s)  err(%)",
    ]
    for p in points:
        lines.append(
            f"   {p.op:<15} {p.world_size:5d} {p.num_nodes:5d} {p.size_bytes:12d}  {p.algo:<14}"
            f" {p.protocol or '-':<6}"
            f" {p.measured_busbw_gbps:9.4g}  {p.simulated_busbw_gbps:9.4g}"
            f"  {p.busbw_error_pct:+6.1f}  {'yes' if p.used_for_fit else 'no'}"
        )
    return lines


def points_json(points: Sequence[Point]) -> list[dict[str, Any]]:
    """The points as JSON rows."""
    return [asdict(p) for p in points]


def comparison_figure(points: Sequence[Point], *, title: str) -> Figure:
    """busbw vs size, log-log: per series a simulated line and the measured markers.

    Filled markers were fitted on, hollow ones held out (plain "measured" when no point was
    fitted on); where the measurement has a spread, bars reach from the busbw of the p99
    iteration to that of the fastest one.
    """
    series: dict[str, list[Point]] = {}
    for p in points:
        series.setdefault(p.series(), []).append(p)
    any_fitted = any(p.used_for_fit for p in points)
    fig = Figure(figsize=(13, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (name, ps) in enumerate(series.items()):
        ps = sorted(ps, key=lambda p: p.size_bytes)
        color = colors[index % len(colors)]
        ax.plot([p.size_bytes for p in ps], [p.simulated_busbw_gbps for p in ps], "-",
                color=color, label=f"{name}: simulated (time MAPE {mape(ps):.1f}%)")  # fmt: skip
        for fitted in (True, False):
            chosen = [p for p in ps if p.used_for_fit == fitted]
            if chosen:
                label = _measured_label(name, fitted, any_fitted)
                _plot_measured(ax, chosen, color, label, filled=fitted)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    # Plain numbers (400, 0.002) rather than 4x10^2 on the busbw axis.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    ax.set_xlabel("size (bytes, nccl-tests definition)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(textwrap.fill(title, 120), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    spread = any(p.measured_busbw_range_gbps() for p in points)
    ax.legend(
        fontsize=7, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
        title=SPREAD_NOTE if spread else None,
    )  # fmt: skip
    return fig


def _measured_label(name: str, fitted: bool, any_fitted: bool) -> str:
    if not any_fitted:
        return f"{name}: measured"
    return f"{name}: measured ({'fitted on' if fitted else 'held out'})"


def _plot_measured(ax: Axes, points: list[Point], color: str, label: str, *, filled: bool) -> None:
    """Markers at the mean busbw, with p99..min bars where the spread is known."""
    busbw = [p.measured_busbw_gbps for p in points]
    ranges = [p.measured_busbw_range_gbps() or (b, b) for p, b in zip(points, busbw, strict=True)]
    yerr = None
    if any(p.measured_busbw_range_gbps() for p in points):
        yerr = [
            [max(b - low, 0.0) for b, (low, _) in zip(busbw, ranges, strict=True)],
            [max(high - b, 0.0) for b, (_, high) in zip(busbw, ranges, strict=True)],
        ]
    ax.errorbar(
        [p.size_bytes for p in points], busbw, yerr=yerr, fmt="o", color=color, elinewidth=0.8,
        capsize=2, markerfacecolor=color if filled else "white", label=label,
    )  # fmt: skip


def plot_comparison(points: Sequence[Point], target: Target | str, *, title: str) -> None:
    """Write ``comparison_figure`` in the target's format (png, svg or pdf by its suffix)."""
    if isinstance(target, Target):
        image_format = target.format or "png"
    else:
        image_format = Path(target).suffix.lstrip(".").lower() or "png"
    buffer = io.BytesIO()
    comparison_figure(points, title=title).savefig(buffer, format=image_format, dpi=120)
    write_bytes(target, buffer.getvalue())
