"""What ``commsim fit --trace`` prints, writes as JSON and plots: the traced step, the fit, and
predicted against traced time per class, per phase and per collective.

Milliseconds and microseconds at this edge only. A fitted class the model still prices above
the trace is flagged: its kernels, even at the GPU's peak, take longer than the traced loop's
(the plan's kernel stack moves more bytes than a loop that fuses more, e.g. a fused RMSNorm);
the step's error then comes from there. The plot (matplotlib, Agg canvas, imported only when a
plot is asked for) shows the class and phase rows as paired bars.

    print(fit_text(fit, classes=rows, phases=phase_rows, collectives=[]))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.replay.trace_compare import Row, rows_json
from sim.replay.trace_fit import TraceFit

BOUND_TOLERANCE = 0.01
"""A fitted class predicted this much above the trace is flagged as bounded by the peak."""
FITTED_CLASSES = ("gemm", "attention", "elementwise", "loss", "copy", "optimizer")
"""Rows of the class table whose times the fit matches when it can."""
TOP_UNCLASSIFIED = 3
"""Names of unclassified kernels listed."""


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:10.3f}"


def _error(row: Row) -> str:
    return "       -" if row.error is None else f"{row.error:+8.1%}"


def table(title: str, rows: Sequence[Row]) -> list[str]:
    """Rows as aligned text: what, traced ms, predicted ms, error."""
    lines = [title, f"  {'':<22} {'traced ms':>10} {'predicted':>10} {'error':>8}"]
    lines += [f"  {r.what:<22} {_ms(r.traced_s)} {_ms(r.predicted_s)} {_error(r)}" for r in rows]
    return lines


def bounded_classes(rows: Sequence[Row]) -> list[str]:
    """Fitted classes the model prices above the trace (bounded by the GPU's peak)."""
    return [
        r.what
        for r in rows
        if r.what in FITTED_CLASSES and r.error is not None and r.error > BOUND_TOLERANCE
    ]


def _trace_lines(fit: TraceFit) -> list[str]:
    step = fit.step
    gemms = fit.gemms
    share = "" if gemms.rate is None else f" ({gemms.rate:.0%})"
    unclassified = sorted(step.unclassified.items(), key=lambda item: -item[1])
    names = ", ".join(f"{name[:48]} x{count}" for name, count in unclassified[:TOP_UNCLASSIFIED])
    lines = [
        f"trace {Path(step.source).name}: {step.marker} of rank {step.rank}/{step.world_size}"
        f" ({step.device or 'device not named'}), {step.num_kernels} {step.work}, "
        f"{step.num_launches} launch calls",
        f"  profiled: wall {step.wall_s * 1e3:.3f} ms, busy {step.busy_s * 1e3:.3f} ms, idle "
        f"{step.idle_s / step.wall_s:.1%}; host {step.host_s_per_launch * 1e6:.1f} us per launch"
        + (f"; {step.kernel_gap_s * 1e6:.2f} us between kernels" if step.kernel_gap_s else ""),
        f"  step time fitted to {fit.step_time_s * 1e3:.3f} ms: {fit.step_time_from}",
        f"  GEMMs: {gemms.num_calls} traced, the plan runs {gemms.num_modelled}; "
        + (
            f"{gemms.num_matched} of {gemms.num_shaped} with recorded shapes match the plan's "
            f"GEMM shapes{share}"
            if gemms.num_shaped
            else "no shapes recorded (profile with record_shapes=True to match them)"
        ),
        f"  the fit places {fit.placed_share:.1%} of the traced kernel time; could not classify "
        f"{sum(step.unclassified.values())} kernels ({step.classes_s['other'] * 1e3:.3f} ms)"
        + (f": {names}" if names else ""),
    ]
    if step.unplaced:
        lines.append(
            f"  {step.unplaced} kernels had no launch call in the trace: their phase is a guess"
        )
    return lines


def _calibration_line(fit: TraceFit) -> str:
    calibration = fit.calibration
    eff = calibration.efficiency
    parts = [f"{key} {value:.1%}" for key, value in sorted(eff.items())]
    host = calibration.host_s_per_launch
    host_text = (
        f"host {host * 1e6:.2f} us per launch (fitted: the step was launch-bound)"
        if host is not None
        else "host per launch: default (the kernels alone fill the step)"
    )
    launches = calibration.launches_per_kernel
    return (
        "fitted efficiencies (of peak): " + ", ".join(parts) + f"; {launches or 0:.2f} launches "
        f"per modelled kernel; {host_text}"
    )


def fit_text(
    fit: TraceFit,
    *,
    classes: Sequence[Row],
    phases: Sequence[Row],
    collectives: Sequence[Row],
    written: str | None = None,
) -> str:
    """The report of a trace fit as text."""
    lines = [*_trace_lines(fit), _calibration_line(fit)]
    lines += table("kernel time by class, predicted with the fitted calibration:", classes)
    bounded = bounded_classes(classes)
    if bounded:
        lines.append(
            f"  {', '.join(bounded)}: priced above the trace even at the GPU's peak: the plan's "
            "kernels move more than the traced loop's (it fuses more)"
        )
    lines += table("GPU time by phase, replayed step against the trace:", phases)
    if collectives:
        lines.append("collectives of the traced rank (traced NCCL kernels vs simulated):")
        lines.append(
            f"  {'':<16} {'traced':>7} {'ms':>10} {'GB':>8}  {'sim':>5} {'ms':>10} {'GB':>8}"
        )
        for row in collectives:
            lines.append(
                f"  {row.what:<16} {row.traced_count or 0:>7} {_ms(row.traced_s)} "
                f"{row.traced_bytes / 1e9:>8.3f}  {row.predicted_count or 0:>5} "
                f"{_ms(row.predicted_s)} {row.predicted_bytes / 1e9:>8.3f}"
            )
    if written:
        lines.append(f"wrote {written}: pass it to commsim plan --compute-calibration")
    return "\n".join(lines)


def fit_json(
    fit: TraceFit, *, classes: Sequence[Row], phases: Sequence[Row], collectives: Sequence[Row]
) -> dict[str, Any]:
    """The report of a trace fit as a JSON object."""
    step = fit.step
    return {
        "trace": Path(step.source).name,
        "marker": step.marker,
        "rank": step.rank,
        "world_size": step.world_size,
        "device": step.device,
        "num_kernels": step.num_kernels,
        "num_launches": step.num_launches,
        "wall_s": step.wall_s,
        "busy_s": step.busy_s,
        "idle_s": step.idle_s,
        "host_s_per_launch_profiled": step.host_s_per_launch,
        "kernel_gap_s": step.kernel_gap_s,
        "step_time_s": fit.step_time_s,
        "step_time_from": fit.step_time_from,
        "placed_share": fit.placed_share,
        "unclassified": dict(step.unclassified),
        "unplaced": step.unplaced,
        "gemm_match": {
            "num_calls": fit.gemms.num_calls,
            "num_modelled": fit.gemms.num_modelled,
            "num_shaped": fit.gemms.num_shaped,
            "num_matched": fit.gemms.num_matched,
            "rate": fit.gemms.rate,
        },
        "calibration": fit.calibration.to_json(),
        "classes": rows_json(list(classes)),
        "phases": rows_json(list(phases)),
        "collectives": rows_json(list(collectives)),
    }


def comparison_figure_bytes(
    classes: Sequence[Row], phases: Sequence[Row], *, title: str, image_format: str = "png"
) -> bytes:
    """Paired bars (traced, predicted) per class and per phase, rendered to bytes."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2))
    FigureCanvasAgg(fig)
    for index, (rows, name) in enumerate(((classes, "kernel time by class"),
                                          (phases, "by phase")), start=1):  # fmt: skip
        axes = fig.add_subplot(1, 2, index)
        positions = range(len(rows))
        axes.bar([p - 0.2 for p in positions], [r.traced_s * 1e3 for r in rows], 0.4,
                 label="traced", color="#4c72b0")  # fmt: skip
        axes.bar([p + 0.2 for p in positions], [r.predicted_s * 1e3 for r in rows], 0.4,
                 label="predicted", color="#dd8452")  # fmt: skip
        axes.set_xticks(list(positions), [r.what.split(" (")[0] for r in rows], rotation=30,
                        ha="right")  # fmt: skip
        axes.set_ylabel("ms")
        axes.set_title(name)
        axes.legend()
    fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format=image_format, dpi=120)
    return buffer.getvalue()
