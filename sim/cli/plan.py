"""``commsim plan``: simulate one training step of a parallel plan and report it.

Reads a plan YAML (model, cluster, parallel, training), replays one optimizer step on the
cluster's topology and prints the text report (or ``--json``); optionally writes the result JSON,
a Chrome trace for ui.perfetto.dev and a timeline plot. Every file is rendered first and written
atomically afterwards, so a run that fails leaves no file behind, half-written or otherwise.

    commsim plan examples/small-zb.yaml --trace step.json --timeline step.png
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fileio.output import Target, check_outputs, write_bytes
from sim.cli.plan_inputs import (
    add_import_arguments,
    assemble_plan,
    export_plan_bytes,
    imported_files,
    wants_assembly,
)
from sim.output.report import format_duration, format_report, pipeline_stage, rank_title
from sim.output.timeline import figure_bytes, representative_ranks, timeline_figure
from sim.output.trace import chrome_trace, trace_json
from sim.replay.result import PlanResult

if TYPE_CHECKING:
    from schedules.plan import Plan
    from topologies.topology import Topology

FIDELITIES = ("analytical", "flow")
"""Network fidelities ``simulate_plan`` accepts (see sim/network/model.py)."""

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
        plan = assemble_plan(args)
    elif args.plan is None:
        raise ValueError("give a PLAN.yaml, or build one with --model, --cluster and the importers")
    else:
        plan = load_plan_file(args.plan)
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
    return 0


def load_plan_file(path: Path) -> Plan:
    """``schedules.plan.load_plan`` on a file, with YAML syntax errors turned into one line."""
    from schedules.plan import load_plan

    if not path.is_file():
        raise FileNotFoundError(f"plan file not found: {path}")
    try:
        return load_plan(path)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: malformed YAML: {yaml_error_line(exc)}") from exc


def yaml_error_line(exc: yaml.YAMLError) -> str:
    """One line naming the problem and where it is (line and column, 1-based)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def simulate(plan: Plan, args: argparse.Namespace) -> tuple[PlanResult, Plan, Topology]:
    """Resolve the plan on its cluster and replay one step with the requested calibrations."""
    from schedules.resolve import resolve_plan
    from sim.replay.simulate import plan_topology, simulate_plan

    comm_calibration, compute_calibration = load_calibrations(args)
    if comm_calibration is not None and (note := calibration_mismatch(comm_calibration, plan)):
        fabric_differs = note.startswith("fitted on another intra-node fabric")
        if fabric_differs and not getattr(args, "force_calibration", False):
            raise ValueError(
                f"--calibration {args.calibration}: {note}; --force-calibration to use it"
            )
        print(f"commsim: warning: --calibration {args.calibration}: {note}", file=sys.stderr)
    topology = plan_topology(plan)
    compute_calibration = compute_calibration_for(compute_calibration, topology.gpu_spec(0))
    plan = resolve_plan(plan, topology.num_gpus)
    result = simulate_plan(
        plan,
        topology=topology,
        comm_calibration=comm_calibration,
        compute_calibration=compute_calibration,
        fidelity=args.fidelity,
        fold=not args.no_fold,
    )
    return result, plan, topology


def calibration_mismatch(calibration: Any, plan: Plan) -> str | None:
    """A note when a network calibration was fitted on another node preset than the plan's."""
    from topologies.presets import NODE_PRESETS

    fitted_on, node = calibration.topology, plan.cluster.node
    if fitted_on not in NODE_PRESETS or not isinstance(node, str) or node == fitted_on:
        return None
    if node in NODE_PRESETS and NODE_PRESETS[node].intra != NODE_PRESETS[fitted_on].intra:
        return (
            f"fitted on another intra-node fabric ({fitted_on!r}: "
            f"{NODE_PRESETS[fitted_on].intra}) than this plan's {node!r} "
            f"({NODE_PRESETS[node].intra}): its efficiencies would move data faster than the "
            "links allow"
        )
    return (
        f"fitted on {fitted_on!r}, not on this plan's {node!r}; its latencies and "
        "efficiencies are applied as they are"
    )


def load_calibrations(args: argparse.Namespace) -> tuple[Any, Any]:
    """The network and compute calibrations named on the command line (None when not given).

    The compute one is a ``commsim-compute`` calibration, or a ``commbench --step`` measurement
    (returned as its JSON object: ``compute_calibration_for`` fits it once the GPU is known).
    """
    from sim.network.calibration import load_calibration

    comm = _load_json_file("--calibration", args.calibration, load_calibration)
    compute = _load_json_file(
        "--compute-calibration", args.compute_calibration, _load_compute_source
    )
    return comm, compute


def _load_compute_source(path: Path) -> Any:
    from comm_bench.compute_calibration import load_compute_calibration
    from fileio.strict import load_json
    from sim.compute.step_fit import STEP_SCHEMA

    data = load_json(path.read_text(encoding="utf-8"), name=str(path))
    if isinstance(data, dict) and data.get("schema") == STEP_SCHEMA:
        return data
    return load_compute_calibration(path)


def compute_calibration_for(source: Any, gpu: Any) -> Any:
    """A compute calibration for ``gpu``: as loaded, or fitted to a step measurement."""
    if not isinstance(source, dict):
        from sim.replay.offload import host_part

        host = host_part(source, gpu)
        if host is not source:
            print(
                "commsim: warning: --compute-calibration was measured on the CPU: only its CPU "
                "Adam rate is used (the step of an offloaded optimizer)",
                file=sys.stderr,
            )
        return host
    from sim.compute.step_fit import calibration_from_step

    try:
        return calibration_from_step(source, gpu)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"--compute-calibration: malformed step measurement ({exc})") from None


def _load_json_file(flag: str, path: Path | None, loader: Callable[[Path], Any]) -> Any:
    if path is None:
        return None
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {path}: file not found")
    try:
        return loader(path)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} {path}: not valid JSON ({exc.msg}, line {exc.lineno})") from exc


def render_files(
    result: PlanResult, plan: Plan, targets: dict[str, Target]
) -> list[tuple[Target, bytes]]:
    """The bytes of every requested output file, rendered before any is written."""
    files: list[tuple[Target, bytes]] = []
    if (output := targets.get("--output")) is not None:
        document = json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n"
        files.append((output, document.encode()))
    titles = rank_titles(result, plan)
    if (trace := targets.get("--trace")) is not None:
        files.append((trace, trace_json(chrome_trace(result.spans, rank_titles=titles)).encode()))
    if (timeline := targets.get("--timeline")) is not None:
        ranks = representative_ranks(result.spans, lambda r: pipeline_stage(r, plan))
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
