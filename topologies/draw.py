"""Drawing a cluster with matplotlib (Agg, no display): levels top to bottom, links by colour.

Rows from the top: core, spine/aggregation, leaf switches, NICs, CPUs, PCIe switches, GPUs,
NVSwitch. Servers sit side by side; a large cluster is summarised: its first ``max_servers``
servers are drawn with the switches they connect to (at most ``max_per_row`` per row) and a note
says how many servers and switches are not shown.

    draw_topology(build_cluster("dgx-h100", num_nodes=16, fabric="ib-ndr"), "cluster.png")
"""

from __future__ import annotations

import io
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from fileio.output import Target, check_output, write_bytes
from topologies.topology import Topology, count_by_kind

FORMATS = (".png", ".svg", ".pdf")
"""What a drawing can be written as."""

ROWS = {"core": 7.0, "spine": 6.0, "leaf": 5.0, "nic": 4.0, "cpu": 3.2, "pcie_switch": 2.5,
        "gpu": 1.5, "nvswitch": 0.6}  # fmt: skip
"""Height of each node kind."""
EDGE_COLOURS = {"nvlink": "#2ca02c", "pcie": "#ff7f0e", "network": "#1f77b4",
                "cpu_link": "#9467bd", "loopback": "#7f7f7f"}  # fmt: skip
"""Colour of each link kind."""
NODE_STYLE = {"gpu": ("s", "#76b900"), "nvswitch": ("D", "#2ca02c"),
              "pcie_switch": ("v", "#ff7f0e"), "cpu": ("o", "#9467bd"),
              "nic": ("^", "#1f77b4"), "leaf": ("h", "#17becf"),
              "spine": ("h", "#1f77b4"), "core": ("h", "#08306b")}  # fmt: skip
"""Marker and colour of each node kind."""
Segment = tuple[tuple[float, float], tuple[float, float]]
"""A line from one node's position to another's."""
_SERVER_ORDER = ("nic", "cpu", "pcie_switch", "gpu", "nvswitch")


def _server_positions(
    topology: Topology, servers: int
) -> tuple[dict[str, tuple[float, float]], float]:
    """x, y of every node of the first ``servers`` servers; and the total width used."""
    by_server: dict[int, dict[str, list[str]]] = {}
    for n, d in topology.graph.nodes(data=True):
        index = d.get("node_index")
        if index is not None and index < servers:
            by_server.setdefault(index, {}).setdefault(d["kind"], []).append(n)
    width = max((len(names) for kinds in by_server.values() for names in kinds.values()), default=1)
    positions: dict[str, tuple[float, float]] = {}
    for index, kinds in sorted(by_server.items()):
        left = index * (width + 1.5)
        for kind in _SERVER_ORDER:
            names = kinds.get(kind, [])
            for i, n in enumerate(names):
                x = left + (i + 0.5) * width / len(names)
                positions[n] = (x, ROWS[kind])
    return positions, len(by_server) * (width + 1.5) - 1.5


def _fabric_positions(
    topology: Topology, drawn: dict[str, tuple[float, float]], width: float, max_per_row: int
) -> dict[str, int]:
    """Add the fabric switches reachable upwards from drawn NICs; returns hidden counts."""
    graph = topology.graph
    frontier = [n for n in drawn if graph.nodes[n]["kind"] == "nic"]
    hidden: dict[str, int] = {}
    for kind in ("leaf", "spine", "core"):
        above = sorted(
            {m for n in frontier for m in graph.successors(n) if graph.nodes[m]["kind"] == kind},
            key=_natural,
        )
        shown = above[:max_per_row]
        total = count_by_kind(graph, (kind,))[kind]
        if total > len(shown):
            hidden[kind] = total - len(shown)
        for i, n in enumerate(shown):
            drawn[n] = ((i + 0.5) * width / max(len(shown), 1), ROWS[kind])
        frontier = shown
    return hidden


def _natural(name: str) -> tuple[object, ...]:
    """Sort key that orders ``leaf2`` before ``leaf10``."""
    parts: list[object] = []
    number = ""
    for char in name + "\0":
        if char.isdigit():
            number += char
            continue
        if number:
            parts.append(int(number))
            number = ""
        parts.append(char)
    return tuple(parts)


def draw_topology(
    topology: Topology, target: Target | str | Path, *, max_servers: int = 4, max_per_row: int = 8
) -> None:
    """Write a drawing of ``topology`` (PNG, SVG or PDF, from the target's extension)."""
    checked = target if isinstance(target, Target) else check_output(target, formats=FORMATS)
    servers = min(topology.num_nodes, max_servers)
    positions, width = _server_positions(topology, servers)
    hidden = _fabric_positions(topology, positions, width, max_per_row)
    figure = Figure(figsize=(max(9.0, min(24.0, width * 0.45 + 5)), 7.0), dpi=110)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    segments: dict[str, list[Segment]] = {}
    for u, v, kind in topology.graph.edges(data="kind"):
        if u < v and u in positions and v in positions:
            segments.setdefault(kind, []).append((positions[u], positions[v]))
    for kind, lines in segments.items():
        width_pt = {"nvlink": 2.5, "network": 0.8}.get(kind, 1.2)
        ax.add_collection(
            LineCollection(lines, colors=EDGE_COLOURS[kind], linewidths=width_pt, alpha=0.8)
        )
    for kind, (marker, colour) in NODE_STYLE.items():
        names = [n for n in positions if topology.graph.nodes[n]["kind"] == kind]
        if names:
            xs, ys = zip(*(positions[n] for n in names), strict=True)
            ax.scatter(xs, ys, marker=marker, s=110, c=colour, edgecolors="black", zorder=3)
    if len(positions) <= 160:
        for n, (x, y) in positions.items():
            ax.annotate(n.split("/")[-1], (x, y), xytext=(0, -12), textcoords="offset points",
                        ha="center", fontsize=6)  # fmt: skip
    _decorate(ax, topology, positions, servers, hidden, segments)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format=checked.format)
    write_bytes(checked, buffer.getvalue())


def _decorate(
    ax: Axes,
    topology: Topology,
    positions: dict[str, tuple[float, float]],
    servers: int,
    hidden: dict[str, int],
    segments: dict[str, list[Segment]],
) -> None:
    """Row labels, legend, title and the "not shown" note."""
    for index in range(servers):
        xs = [
            x
            for n, (x, _) in positions.items()
            if topology.graph.nodes[n].get("node_index") == index
        ]
        ax.text((min(xs) + max(xs)) / 2, 0.05, f"server {index}", ha="center", fontsize=9)
    rows_used = sorted({kind for kind in ROWS if count_by_kind(topology.graph, (kind,))[kind]})
    ax.set_yticks([ROWS[k] for k in rows_used], [k.replace("_", " ") for k in rows_used])
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    handles = [
        Line2D([], [], color=EDGE_COLOURS[kind], linewidth=2.5, label=kind.replace("_", " "))
        for kind in EDGE_COLOURS
        if kind in segments
    ]
    ax.legend(handles=handles, title="link", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(f"{topology.name}: {topology.num_gpus} GPUs in {topology.num_nodes} server(s)")
    notes = []
    if topology.num_nodes > servers:
        notes.append(f"... {topology.num_nodes - servers} more servers not shown")
    notes += [f"... {count} more {kind} switches not shown" for kind, count in hidden.items()]
    if notes:
        ax.text(1.01, 0.55, "\n".join(notes), transform=ax.transAxes, va="top", fontsize=9,
                bbox={"facecolor": "white", "edgecolor": "grey"})  # fmt: skip
    ax.autoscale_view()
    ax.margins(x=0.04, y=0.08)
