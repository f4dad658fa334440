"""The report of ``commsim validate --collectives``: its table and its plot.

``format_summary`` prints per cluster the busbw error of the uncalibrated presets and of the
network parameters fitted on every other cluster (sizes >= 1 MiB), then where the
leave-one-out errors sit (op, node count, size band), then the fabric presets' checks;
``plot_bytes`` draws simulated against measured busbw per cluster.

    print("\n".join(format_summary(report_json(results, clusters), results)))
"""

from __future__ import annotations

from typing import Any

from sim.validation.collectives import MODES, ClusterPoints, breakdown


def format_summary(document: dict[str, Any], results: list[ClusterPoints]) -> list[str]:
    """The printed report: per cluster, where the errors sit, the fabric checks."""
    summary = document["summary"]
    raw, loco = (summary["modes"][m] for m in MODES)
    clusters = document["clusters"]
    wide = max([len("cluster"), *map(len, clusters)])
    fabric_wide = max([13, *(len(c["fabric"] or "-") for c in clusters.values())])
    lines = [
        f"commsim validate --collectives: {len(clusters)} clusters, busbw error "
        "(simulated / measured - 1) on sizes >= 1 MiB",
        f"  {'cluster':<{wide}} {'server':<13} {'fabric':<{fabric_wide}} {'nodes':<14} "
        f"{'points':>6} {'uncalibrated':>13} {'leave-one-out':>14}",
    ]
    for name, described in clusters.items():
        a, b = raw["clusters"][name], loco["clusters"][name]
        nodes = described["nodes"]
        lines.append(
            f"  {name:<{wide}} {described['server']:<13} "
            f"{described['fabric'] or '-':<{fabric_wide}} {','.join(map(str, nodes)):<14} "
            f"{a['num_points']:>6} {_cell(a):>13} {_cell(b):>14}"
        )
    lines.append(
        f"  all: uncalibrated {_pct(raw['busbw_mape_pct'])} over {raw['num_points']} points "
        f"(worst {raw['worst_cluster']}), leave-one-cluster-out {_pct(loco['busbw_mape_pct'])} "
        f"(worst {loco['worst_cluster']})"
    )
    lines.append(
        f"  leave-one-cluster-out calibrated {loco['num_calibrated_points']} of the "
        f"{loco['num_points']} points ({_pct(loco['calibrated_busbw_mape_pct'])} over them; "
        "uncalibrated where no other cluster has the same GPU generation and NVLink kind within "
        "a server, or the same fabric preset across)"
    )
    lines.append("  (cells: busbw MAPE, then the mean signed error)")
    lines.append("leave-one-cluster-out by op, nodes and size band (all clusters):")
    scored = [p for r in results if r.mode == MODES[1] for p in r.scored()]
    for row in breakdown(scored):
        lines.append(
            f"  {row['op']:<15} {row['num_nodes']:>3} node(s)  {row['band']:<15} "
            f"{row['num_points']:>4} points  {_pct(row['busbw_mape_pct']):>6}  "
            f"mean {row['mean_busbw_error_pct']:+.1f}%"
        )
    lines.append("fabric presets against public measurements (uncalibrated, across servers):")
    for fabric, checks in sorted(document["fabric_checks"].items()):
        for check in checks:
            lines.append(
                f"  {fabric:<{fabric_wide}} {check['cluster']:<{wide}} "
                f"nodes {','.join(map(str, check['nodes']))}"
                f": {_pct(check['busbw_mape_pct'])} ({check['mean_busbw_error_pct']:+.1f}% mean, "
                f"{check['num_points']} points)" + (", in-sample" if check.get("in_sample") else "")
            )
    return lines


def _cell(row: dict[str, Any]) -> str:
    if row["busbw_mape_pct"] is None:
        return "n/a"
    return f"{row['busbw_mape_pct']:.1f}% {row['mean_busbw_error_pct']:+.0f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def plot_bytes(results: list[ClusterPoints], image_format: str) -> bytes:
    """Simulated against measured busbw, one panel per mode, one colour per cluster."""
    from io import BytesIO

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 5.5))
    FigureCanvasAgg(figure)
    names = sorted({r.cluster for r in results})
    colours = {n: f"C{i % 10}" for i, n in enumerate(names)}
    markers = "osD^v<>ph*"
    for index, mode in enumerate(MODES):
        ax = figure.add_subplot(1, 2, index + 1)
        top = 1.0
        for r in (r for r in results if r.mode == mode):
            pts = r.scored()
            if not pts:
                continue
            x = [p.measured_busbw_gbps for p in pts]
            y = [p.simulated_busbw_gbps for p in pts]
            top = max(top, *x, *y)
            k = names.index(r.cluster)
            ax.scatter(
                x, y, s=14, color=colours[r.cluster], marker=markers[k // 10 % len(markers)],
                label=r.cluster, alpha=0.8,
            )  # fmt: skip
        ax.plot([0, top * 1.05], [0, top * 1.05], color="black", lw=0.8)
        ax.fill_between(
            [0, top * 1.05], [0, top * 0.945], [0, top * 1.155], color="grey", alpha=0.15
        )
        ax.set_xlabel("measured busbw (GB/s)")
        ax.set_ylabel("simulated busbw (GB/s)")
        ax.set_title(f"{mode} (band: +-10%)")
        ax.set_xlim(0, top * 1.05)
        ax.set_ylim(0, top * 1.05)
    figure.axes[-1].legend(fontsize=6, loc="upper left", ncol=2)
    figure.tight_layout()
    buffer = BytesIO()
    figure.savefig(buffer, format=image_format, dpi=120)
    return buffer.getvalue()
