"""``commsim plan``: simulate one training step of a parallel plan and report it.

Reads a plan YAML (model, cluster, parallel, training), replays one optimizer step on the
cluster's topology and prints the text report (or ``--json``); optionally writes the result JSON,
a Chrome trace for ui.perfetto.dev and a timeline plot. Every file is rendered first and written
atomically afterwards, so a run that fails leaves no file behind, half-written or otherwise.

    commsim plan examples/small-zb.yaml --trace step.json --timeline step.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fileio.output import Target, check_outputs, write_bytes
from sim.inputs.calibrations import calibration_mismatch, compute_calibration_for, load_calibrations
from sim.inputs.plans import (
    add_import_arguments,
    assemble_plan,
    export_plan_bytes,
    imported_files,
    load_plan_file,
    wants_assembly,
)
from sim.network.comm_model import FIDELITIES
from sim.output.report import format_duration, format_report, pipeline_stage, rank_title
from sim.output.timeline import figure_bytes, representative_ranks, timeline_figure
from sim.output.trace import chrome_trace, trace_json
from sim.output.whatif_report import culprit_titles, whatif_lines
from sim.replay.result import PlanResult

if TYPE_CHECKING:
    from schedules.plan import Plan
    from topologies.topology import Topology

MAX_CULPRIT_LANES = 4
"""Singled-out ranks a what-if's timeline adds to the representative ranks."""
IMAGE_FORMATS = ("png", "svg", "pdf")
"""File types ``--timeline`` can write, chosen by the file's suffix."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Define the ``commsim plan`` flags."""
    parser.add_argument(
        "plan", type=Path, nargs="?", metavar="PLAN.yaml", help="plan file (see docs/plan.md)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON, not text")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE.json", help="write result JSON")
    parser.add_argument("--trace", type=Path, metavar="TRACE.json", help="write a Chrome trace")
    parser.add_argument(
        "--timeline", type=Path, metavar="PLOT.png", help="write a timeline plot (png, svg, pdf)"
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="network calibration JSON (commsim calibrate)",
    )
    parser.add_argument(
        "--compute-calibration", type=Path, metavar="FILE", help="compute calibration JSON"
    )
    parser.add_argument(
        "--force-calibration",
        action="store_true",
        help="apply a network calibration fitted on another intra-node fabric",
    )
    add_import_arguments(parser)
    parser.add_argument(
        "--fidelity",
        choices=FIDELITIES,
        default="analytical",
        help="network model (default: %(default)s)",
    )
    parser.add_argument(
        "--no-fold",
        action="store_true",
        help="simulate every rank instead of one per symmetric set",
    )
    parser.add_argument(
        "--whatif",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a what-if on top of the plan's whatif: section, repeatable: slow_gpu=RANK:0.2, "
        "slow_node=NODE:0.1, nic=RANK:0.5, nic=RANK:down, second_job=NODES:0.3 (nodes 0-3 or "
        "0,2; in bursts NODES:0.5:PERIOD_MS:BUSY[:OFFSET_MS]; as its own collectives "
        "NODES:all_reduce:SIZE_MIB:PERIOD_MS[:OFFSET_MS]), link=leaf0-spine7:0.5 or :down, "
        "moe_imbalance=1.5 "
        "(every MoE layer) or moe_imbalance=3:2.0,7:1.5 (per layer); "
        "the report compares the step with the plan without them (docs/whatif.md)",
    )


def run(args: argparse.Namespace) -> int:
    """Simulate the plan, print the report or JSON, write the requested files; returns 0."""
    targets = check_outputs(
        {
            "--output": (args.output, (".json",)),
            "--trace": (args.trace, (".json",)),
            "--timeline": (args.timeline, tuple(f".{f}" for f in IMAGE_FORMATS)),
            "--export-plan": (getattr(args, "export_plan", None), (".yaml", ".yml")),
        },
        inputs=tuple(
            p
            for p in (args.plan, args.calibration, args.compute_calibration, *imported_files(args))
            if p is not None
        ),
    )
    if wants_assembly(args):
        plan = assemble_plan(args, warn=_warn)
    elif args.plan is None:
        raise ValueError("give a PLAN.yaml, or build one with --model, --cluster and the importers")
    else:
        plan = load_plan_file(args.plan)
    if args.whatif:
        from schedules.whatif import parse_flags

        plan = dataclasses.replace(plan, whatif=parse_flags(args.whatif, plan.whatif))
    result, plan, topology = simulate(plan, args)
    files = render_files(result, plan, targets)
    if (export := targets.get("--export-plan")) is not None:
        files.append((export, export_plan_bytes(plan)))
    for target, data in files:
        write_bytes(target, data)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, allow_nan=False))
    else:
        print(format_report(result, plan, gpu=topology.gpu_spec(0), fidelity=args.fidelity), end="")
        if lines := whatif_lines(result):
            print("\n" + "\n".join(lines))
    return 0


def simulate(plan: Plan, args: argparse.Namespace) -> tuple[PlanResult, Plan, Topology]:
    """Resolve the plan on its cluster and replay one step with the requested calibrations."""
    from schedules.resolve import resolve_plan
    from schedules.stacks import stack_warning
    from sim.replay.simulate import plan_topology, simulate_plan

    comm_calibration, compute_source = load_calibrations(args.calibration, args.compute_calibration)
    if comm_calibration is not None and (note := calibration_mismatch(comm_calibration, plan)):
        fabric_differs = note.startswith("fitted on another intra-node fabric")
        if fabric_differs and not getattr(args, "force_calibration", False):
            raise ValueError(
                f"--calibration {args.calibration}: {note}; --force-calibration to use it"
            )
        _warn(f"--calibration {args.calibration}: {note}")
    topology = plan_topology(plan)
    if (assumption := stack_warning(plan)) is not None:
        _warn(assumption)
    compute_calibration = compute_calibration_for(compute_source, topology.gpu_spec(0), warn=_warn)
    plan = resolve_plan(plan, topology.num_gpus)
    options = {
        "topology": topology, "comm_calibration": comm_calibration,
        "compute_calibration": compute_calibration, "fidelity": args.fidelity,
        "fold": not args.no_fold,
    }  # fmt: skip
    result = simulate_plan(plan, **options)
    if plan.whatif:
        from sim.replay.simulate import compare_whatif

        result.extra["whatif"]["compared"] = compare_whatif(plan, result, **options)
    return result, plan, topology


def render_files(
    result: PlanResult, plan: Plan, targets: dict[str, Target]
) -> list[tuple[Target, bytes]]:
    """The bytes of every requested output file, rendered before any is written."""
    files: list[tuple[Target, bytes]] = []
    if (output := targets.get("--output")) is not None:
        document = json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n"
        files.append((output, document.encode()))
    if "--trace" not in targets and "--timeline" not in targets:
        return files  # the spans are built only for a trace or a timeline
    titles = culprit_titles(result, rank_titles(result, plan))
    if (trace := targets.get("--trace")) is not None:
        files.append((trace, trace_json(chrome_trace(result.spans, rank_titles=titles)).encode()))
    if (timeline := targets.get("--timeline")) is not None:
        ranks = representative_ranks(result.spans, lambda r: pipeline_stage(r, plan))
        culprits = result.extra.get("whatif", {}).get("culprits", [])
        ranks += [r for r in culprits if r in titles and r not in ranks][:MAX_CULPRIT_LANES]
        fig = timeline_figure(
            result.spans, ranks=ranks, rank_titles=titles, title=plot_title(result, plan)
        )
        files.append((timeline, figure_bytes(fig, timeline.format)))
    return files


def rank_titles(result: PlanResult, plan: Plan) -> dict[int, str]:
    """A title per simulated rank, e.g. ``"rank 8 (pp stage 1)"``."""
    return {r: rank_title(r, plan) for r in sorted({span.rank for span in result.spans})}


def plot_title(result: PlanResult, plan: Plan) -> str:
    """The timeline's title: model, parallel degrees, schedule and step time."""
    par = plan.parallel
    schedule = f"{par.schedule}, " if par.pp > 1 else ""
    return (
        f"{plan.model.name} on {result.num_gpus} GPUs: tp{par.tp} pp{par.pp} cp{par.cp} "
        f"dp{par.dp} ({par.data_parallel}), {schedule}"
        f"step {format_duration(result.step_time_s)}"
    )


def _warn(line: str) -> None:
    print(f"commsim: warning: {line}", file=sys.stderr)
