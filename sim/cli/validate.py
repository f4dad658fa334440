"""``commsim validate``: simulate the published training runs and report the error honestly.

Every run of the cases file that can be simulated faithfully is replayed with ``simulate_plan``;
predicted and measured step times are printed per case with the error, and the MAPE per source
over the held-out cases (the few cases the compute calibration is fitted on are marked ``*`` and
excluded). Runs that cannot be simulated are listed with the knob their source does not state.
On a terminal, progress bars with the time left (tqdm, on standard error) follow the compute fit
and the cases, worker processes included, with a line per case as it finishes.

    commsim validate --json results/validation/validation.json --plot validation.png
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
from collections import Counter
from collections.abc import Sequence
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING

from fileio.output import Target, check_outputs, write_bytes, write_text
from refdata import COLLECTIVES_DIR
from sim.network.comm_model import FIDELITIES
from sim.output.progress import PhaseBars
from sim.validation.cases import DEFAULT_CASES_PATH, load_cases
from sim.validation.modes import check_mode, check_usable, id_list
from sim.validation.runner import ValidationReport, run_validation
from sim.validation.steps import (
    STEPS_PATH,
    StepPrediction,
    load_steps,
    step_summary,
    validate_steps,
)
from sim.validation.traces import TRACES_PATH, load_trace_cases, trace_summary, validate_traces

if TYPE_CHECKING:
    from matplotlib.axes import Axes

IMAGE_FORMATS = ("png", "svg", "pdf")
"""File types ``--plot`` can write, chosen by the file's suffix."""

BAND = 0.10
"""The +-10 % band drawn around y = x and used as the accuracy target."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Define the ``commsim validate`` flags."""
    parser.add_argument(
        "cases",
        nargs="?",
        type=Path,
        default=DEFAULT_CASES_PATH,
        metavar="CASES.json",
        help=f"published runs (default: {DEFAULT_CASES_PATH})",
    )
    parser.add_argument(
        "--calibrate-on",
        metavar="ID,ID,...|none",
        help="cases to fit the compute calibration on (default: per source and GPU type the run "
        "with the fewest GPUs); 'none' keeps the compute model's defaults",
    )
    parser.add_argument(
        "--ids", metavar="ID,ID,...", help="simulate only these cases (shell patterns: 'nemo*')"
    )
    parser.add_argument("--json", type=Path, metavar="OUT.json", help="write the report as JSON")
    parser.add_argument("--plot", type=Path, metavar="OUT.png", help="plot predicted vs measured")
    parser.add_argument(
        "--fidelity", choices=FIDELITIES, default="analytical", help="network model fidelity"
    )
    parser.add_argument("--calibration", type=Path, metavar="FILE", help="network calibration JSON")
    parser.add_argument(
        "-j", "--jobs", type=int, default=1, metavar="N", help="simulate cases in N processes"
    )
    parser.add_argument(
        "--leave-one-source-out",
        action="store_true",
        help="score each source with the defaults fitted on published runs (the multi-GPU "
        "in-step slowdown) refitted on the other sources",
    )
    parser.add_argument(
        "--steps",
        type=Path,
        nargs="*",
        metavar="DIR",
        help="validate on real single-GPU steps instead (commbench --step files of one or more "
        "folders, read as one set; default: the shipped H100 steps): defaults, and each file's "
        "calibration on the others",
    )
    parser.add_argument(
        "--collectives",
        type=Path,
        nargs="?",
        const=COLLECTIVES_DIR,
        metavar="DIR",
        help="validate the network model on public nccl-tests results instead (DIR/<cluster>/"
        "cluster.json; default: the shipped clusters): uncalibrated, and leave-one-cluster-out",
    )
    parser.add_argument(
        "--traces",
        type=Path,
        nargs="?",
        const=TRACES_PATH,
        metavar="DIR",
        help="validate on profiler traces instead (DIR/index.json: trace, plan, unprofiled step "
        "time; default: the shipped H100 traces): each trace's fit on every step",
    )


def run(args: argparse.Namespace) -> int:
    """Run the validation; print the table; write the JSON and plot if asked."""
    check_mode(args)
    if args.steps is not None:
        return run_steps(args)
    if args.traces is not None:
        return run_traces(args)
    if args.collectives is not None:
        return run_collectives(args)
    if args.leave_one_source_out:
        return run_loso(args)
    if not Path(args.cases).is_file():
        raise FileNotFoundError(f"cases file not found: {args.cases} (give CASES.json)")
    targets = check_outputs(
        {
            "--json": (args.json, (".json",)),
            "--plot": (args.plot, tuple(f".{f}" for f in IMAGE_FORMATS)),
        },
        inputs=(args.cases, args.calibration),
    )
    comm_calibration = None
    if args.calibration is not None:
        from sim.network.calibration import load_calibration

        comm_calibration = load_calibration(args.calibration)
    calibrate_on = None
    if args.calibrate_on is not None:
        calibrate_on = id_list(args.calibrate_on, "--calibrate-on")
    if calibrate_on == ("none",):
        calibrate_on = ()
    cases, ids = load_cases(args.cases), id_list(args.ids)
    check_usable(Path(args.cases), cases, ids)
    bars = PhaseBars()
    try:
        report = run_validation(
            cases,
            ids=ids,
            calibrate_on=calibrate_on,
            fidelity=args.fidelity,
            comm_calibration=comm_calibration,
            progress=bars,
            jobs=args.jobs,
        )
    finally:
        bars.close()
    if not report.results and report.failed:  # every case failed: nothing to report
        case_id, message = report.failed[0]
        raise ValueError(
            f"{args.cases}: every case failed to simulate ({len(report.failed)}; first "
            f"{case_id}: {message})"
        )
    outputs: list[tuple[Target, bytes]] = []
    if (json_target := targets.get("--json")) is not None:
        document = report.to_json()
        document["config"].update(provenance(Path(args.cases), jobs=args.jobs))
        document["env"] = environment()
        outputs.append((json_target, (json.dumps(document, indent=2) + "\n").encode()))
    if (plot_target := targets.get("--plot")) is not None:
        outputs.append((plot_target, plot_bytes(report, plot_target.format)))
    for target, data in outputs:
        write_bytes(target, data)
    print(format_report(report))
    return 0


def run_loso(args: argparse.Namespace) -> int:
    """``--leave-one-source-out``: every source scored with the slowdown fitted without it."""
    from sim.validation.loso import leave_one_source_out

    if not Path(args.cases).is_file():
        raise FileNotFoundError(f"cases file not found: {args.cases} (give CASES.json)")
    targets = check_outputs({"--json": (args.json, (".json",))}, inputs=(args.cases,))
    cases, ids = load_cases(args.cases), id_list(args.ids)
    check_usable(Path(args.cases), cases, ids)
    bars = PhaseBars()
    try:
        report = leave_one_source_out(cases, ids=ids, progress=bars, jobs=args.jobs)
    finally:
        bars.close()
    if (json_target := targets.get("--json")) is not None:
        document = report.to_json()
        document["config"] = provenance(Path(args.cases), jobs=args.jobs)
        document["env"] = environment()
        write_bytes(json_target, (json.dumps(document, indent=2) + "\n").encode())
    lines = [
        "commsim validate --leave-one-source-out: each source scored with the multi-GPU in-step "
        "slowdown fitted without it, on the other sources' runs of its GPU generation (least "
        "absolute error in log step time)",
        f"  {'source':<16} {'cases':>5} {'slowdown':>9} {'MAPE':>7} {'max |error|':>12} "
        f"{'mean error':>11}",
    ]
    for source, figures in report.summary().items():
        slowdown = f"{figures['in_step_slowdown']:>9.3f}" if source != "all" else " " * 9
        lines.append(
            f"  {source:<16} {int(figures['num_cases']):>5} {slowdown} "
            f"{figures['mape']:>7.1%} {figures['max_abs_error']:>12.1%} "
            f"{figures['mean_error']:>+11.1%}"
        )
    lines.append("  (the 'all' row is over every case, each with its source's held-out slowdown)")
    counts = Counter(line.family for line in report.lines)
    fits = ", ".join(
        f"{family} {value:.3f} ({counts[family] if family != 'all' else len(report.lines)} runs)"
        for family, value in report.fitted_on_all.items()
    )
    lines.append(f"  in-sample fits: {fits}")
    lines += [f"FAILED {case_id}: {message}" for case_id, message in report.failed]
    print("\n".join(lines))
    return 0


def run_collectives(args: argparse.Namespace) -> int:
    """``--collectives``: every shipped cluster uncalibrated and fitted on the others."""
    from sim.validation.collective_report import format_summary, plot_bytes
    from sim.validation.collectives import (
        dumps,
        load_clusters,
        report_json,
        validate_collectives,
    )

    folder = Path(args.collectives)
    if not folder.is_dir():
        raise FileNotFoundError(f"--collectives: folder not found: {folder}")
    targets = check_outputs(
        {
            "--json": (args.json, (".json",)),
            "--plot": (args.plot, tuple(f".{f}" for f in IMAGE_FORMATS)),
        },
        inputs=(folder,),
    )
    clusters = load_clusters(folder)
    results = validate_collectives(clusters)
    document = report_json(results, clusters)
    if (target := targets.get("--json")) is not None:
        write_text(target, dumps(document))
    if (target := targets.get("--plot")) is not None:
        write_bytes(target, plot_bytes(results, target.format))
    print("\n".join(format_summary(document, results)))
    return 0


def run_steps(args: argparse.Namespace) -> int:
    """``--steps``: every step file on defaults, and each one's calibration on the others."""
    folders = [Path(folder) for folder in args.steps] or [STEPS_PATH]
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"--steps: folder not found: {folder}")
    targets = check_outputs({"--json": (args.json, (".json",))}, inputs=tuple(folders))
    predictions = validate_steps(load_steps(*folders))
    shown = " ".join(str(folder) for folder in folders)
    _report_predictions(
        f"--steps {shown}", predictions, step_summary(predictions),
        schema="commsim-step-validation/1", source=("steps", shown),
        target=targets.get("--json"), columns=("step", "calibrated on", 42),
    )  # fmt: skip
    return 0


def run_traces(args: argparse.Namespace) -> int:
    """``--traces``: every traced job on defaults, and with each trace's fit."""
    if not Path(args.traces).is_dir():
        raise FileNotFoundError(f"--traces: folder not found: {args.traces}")
    targets = check_outputs({"--json": (args.json, (".json",))}, inputs=(args.traces,))
    predictions = validate_traces(load_trace_cases(Path(args.traces)))
    _report_predictions(
        f"--traces {args.traces}", predictions, trace_summary(predictions),
        schema="commsim-trace-validation/1", source=("traces", str(args.traces)),
        target=targets.get("--json"), columns=("step", "fitted on trace", 28),
    )  # fmt: skip
    return 0


def _report_predictions(
    title: str,
    predictions: Sequence[StepPrediction],
    summary: dict[str, dict[str, float]],
    *,
    schema: str,
    source: tuple[str, str],
    target: Target | None,
    columns: tuple[str, str, int],
) -> None:
    """Write the predictions' JSON (when asked) and print their table and summary."""
    if target is not None:
        document = {
            "schema": schema,
            source[0]: source[1],
            "summary": summary,
            "predictions": [
                {
                    "case": p.case,
                    "calibrated_on": p.calibrated_on,
                    "measured_step_time_s": p.measured_s,
                    "predicted_step_time_s": p.predicted_s,
                    "error": p.error,
                }
                for p in predictions
            ],
            "env": environment(),
        }
        write_bytes(target, (json.dumps(document, indent=2) + "\n").encode())
    case, calibrated, width = columns
    lines = [f"commsim validate {title}: {len(predictions)} predictions"]
    lines.append(
        f"{case:<{width}} {calibrated:<{width}} {'measured s':>10} {'predicted s':>11} {'error':>7}"
    )
    lines += [
        f"{p.case:<{width}} {p.calibrated_on or '(defaults)':<{width}} {p.measured_s:>10.4f} "
        f"{p.predicted_s:>11.4f} {p.error:>+7.1%}"
        for p in predictions
    ]
    lines += [
        f"  {key:<12} {int(figures['num']):>3} predictions  MAPE {figures['mape']:6.1%}  "
        f"max |error| {figures['max_abs_error']:6.1%}"
        for key, figures in summary.items()
    ]
    print("\n".join(lines))


def provenance(cases_path: Path, *, jobs: int) -> dict[str, object]:
    """The cases file (path and SHA-256) and the run settings, for the JSON ``config`` block."""
    digest = hashlib.sha256(cases_path.read_bytes()).hexdigest()
    return {"cases": str(cases_path), "cases_sha256": digest, "jobs": jobs}


def environment() -> dict[str, object]:
    """The machine the validation ran on, for the JSON ``env`` block."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "command": "commsim validate",
    }


def format_report(report: ValidationReport) -> str:
    """The text report: per-case table (with the fitted in-step slowdown's part of the
    prediction), MAPE per source, cases not simulated, runtime."""
    lines = [
        f"commsim validate: {len(report.results)} published runs simulated "
        f"({report.fidelity} network); {len(report.skipped)} cannot be simulated faithfully",
        f"{'case':<50} {'GPUs':>5} {'measured s':>11} {'predicted s':>12} {'error':>8}"
        f" {'exposed comm s':>15} {'bubble s':>9} {'host s':>8} {'in-step s':>10}",
    ]
    for result in report.results:
        mark = " *" if result.calibration else ""
        exposed_s = sum(v for k, v in result.breakdown.items() if k.startswith("exposed_"))
        bubble_s = result.breakdown.get("bubble_s", 0.0)
        host_s = result.breakdown.get("host_s", 0.0)
        lines.append(
            f"{result.case_id + mark:<50} {result.num_gpus:>5} "
            f"{result.measured_step_time_s:>11.3f} {result.predicted_step_time_s:>12.3f} "
            f"{result.error:>+8.1%} {exposed_s:>15.3f} {bubble_s:>9.3f} {host_s:>8.3f}"
            f" {result.in_step_slowdown_s:>10.3f}"
        )
    lines.append(
        "in-step s: the part of the predicted compute that is the fitted in-step slowdown "
        "(not a mechanism)"
    )
    if report.calibration_cases:
        lines.append("* calibration case: compute time scale fitted on it, excluded from MAPE")
        for gpu, fit in report.calibration.items():
            lines.append(
                f"  {gpu}: time scale {fit['time_scale']:.3f} on every kernel, "
                f"fitted on {', '.join(fit['cases'])}"
            )
    lines.append("MAPE over held-out cases, per source:")
    lines.extend(_summary_lines(report.summary()))
    lines.append("... and per source table:")
    lines.extend(_summary_lines(report.summary_by_table()))
    memory = [r for r in report.results if r.memory_error is not None]
    if memory:
        lines.append("Peak memory per GPU, where the source reports it (GiB; nothing fitted):")
        lines.extend(
            f"  {r.case_id:<48} measured {r.measured_memory_gib:7.2f}  predicted "
            f"{r.predicted_memory_gib:7.2f}  error {r.memory_error:+6.1%}"
            for r in memory
        )
        lines.extend(_summary_lines(report.memory_summary()))
    fits = report.fits_summary()
    if fits["num_cases"]:
        lines.append(
            f"Runs that ran, predicted to fit their GPUs' memory (reserved <= HBM): "
            f"{fits['num_fit']} of {fits['num_cases']}"
        )
        lines.extend(
            f"  over: {r.case_id:<48} predicted {r.predicted_memory_gib:7.2f} of "
            f"{r.hbm_gib:.0f} GiB"
            for r in report.results
            if r.fits is False
        )
    for case_id, message in report.failed:
        lines.append(f"FAILED {case_id}: {message}")
    if report.skipped:
        lines.append("Not simulated (what the source does not state):")
        lines.extend(f"  {m.case_id}: {'; '.join(m.missing)}" for m in report.skipped)
    lines.append(f"Validation runtime: {report.runtime_s:.1f} s")
    return "\n".join(lines)


def _summary_lines(summary: dict[str, dict[str, float]]) -> list[str]:
    return [
        f"  {name:<28} {int(figures['num_cases']):>3} cases  MAPE {figures['mape']:6.1%}  "
        f"max |error| {figures['max_abs_error']:6.1%}  mean error {figures['mean_error']:+6.1%}"
        for name, figures in summary.items()
    ]


def plot_bytes(report: ValidationReport, image_format: str = "png") -> bytes:
    """Predicted vs measured step time, log-log, y = x with +-10 % bands, coloured by source."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.0, 6.0), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    values = [r.measured_step_time_s for r in report.results]
    values += [r.predicted_step_time_s for r in report.results]
    low, high = (min(values) / 1.5, max(values) * 1.5) if values else (0.1, 100.0)
    line = [low, high]
    axes.plot(line, line, color="black", linewidth=1.0, label="y = x")
    axes.fill_between(
        line,
        [v * (1 - BAND) for v in line],
        [v * (1 + BAND) for v in line],
        color="grey",
        alpha=0.2,
        label=f"+-{BAND:.0%}",
    )
    _scatter_groups(axes, report)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlim(low, high)
    axes.set_ylim(low, high)
    axes.set_xlabel("measured step time (s)")
    axes.set_ylabel("predicted step time (s)")
    overall = report.summary().get("all", {}).get("mape", math.nan)
    axes.set_title(f"commsim validate: published training runs (held-out MAPE {overall:.1%})")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="upper left", fontsize=8)
    buffer = BytesIO()
    figure.savefig(buffer, format=image_format)
    return buffer.getvalue()


COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
"""Colour per source (cycled)."""
MARKERS = ("o", "s", "^", "D", "v", "P")
"""Marker per table within a source (cycled)."""


def _scatter_groups(axes: Axes, report: ValidationReport) -> None:
    """One scatter per source table: colour by source, marker by table, calibration hollow."""
    by_table = report.summary_by_table()
    sources = sorted({r.source for r in report.results})
    for source_index, source in enumerate(sources):
        colour = COLOURS[source_index % len(COLOURS)]
        groups = sorted({r.group for r in report.results if r.source == source})
        for group_index, group in enumerate(groups):
            marker = MARKERS[group_index % len(MARKERS)]
            for calibration in (False, True):
                chosen = [
                    r for r in report.results if r.group == group and r.calibration == calibration
                ]
                if not chosen:
                    continue
                mape = by_table.get(group, {}).get("mape", math.nan)
                label = f"{group}, calibration" if calibration else f"{group} (MAPE {mape:.1%})"
                axes.scatter(
                    [r.measured_step_time_s for r in chosen],
                    [r.predicted_step_time_s for r in chosen],
                    s=36,
                    label=label,
                    marker=marker,
                    facecolors="none" if calibration else colour,
                    edgecolors=colour,
                )
