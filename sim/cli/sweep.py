"""``commsim sweep``: every plan file under every what-if scenario, in local processes or on Ray.

Each ``--whatif`` value is one scenario, its changes separated by ``;`` (the flags of ``commsim
plan --whatif``); every plan is also simulated as planned, and each row gives the change of
step time against it. ``-j N`` runs the simulations in N local processes, ``--ray [ADDRESS]`` as
Ray tasks (docs/whatif.md); the rows are the same either way.

    commsim sweep plan.yaml --whatif slow_gpu=3:0.2 --whatif 'nic=5:down;second_job=0-3:0.3'
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fileio.output import check_outputs, write_text
from fileio.strict import shorten
from sim.inputs.plans import load_plan_file
from sim.inputs.workers import add_ray_argument

if TYPE_CHECKING:
    from schedules.plan import Plan

COLUMNS = ("plan", "scenario", "step_time_s", "delta_pct", "mfu", "simulated_ranks", "num_gpus")
"""The CSV columns (the JSON rows also have ``tokens_per_s``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``commsim sweep``."""
    parser.add_argument("plans", nargs="+", type=Path, metavar="PLAN.yaml", help="plan files")
    parser.add_argument(
        "--whatif",
        action="append",
        default=[],
        metavar="SCENARIO",
        help="one scenario: what-if flags separated by ';' (slow_gpu=3:0.2;nic=5:down); repeatable",
    )
    parser.add_argument("-j", "--jobs", type=int, default=1, help="worker processes")
    add_ray_argument(parser)
    parser.add_argument("--json", type=Path, metavar="OUT.json", help="write every row")
    parser.add_argument("--csv", type=Path, metavar="OUT.csv", help="write every row")


def _scenarios(values: list[str]) -> list[tuple[str, ...]]:
    """Each ``--whatif`` value as its flags; an empty one (or one given twice) is refused, as
    it would only repeat a row."""
    from schedules.whatif import parse_flags

    scenarios: list[tuple[str, ...]] = []
    for value in values:
        flags = tuple(f.strip() for f in value.split(";") if f.strip())
        if not flags:
            raise ValueError(
                f"--whatif {shorten(value)}: an empty scenario; give what-if flags separated "
                "by ';' (e.g. slow_gpu=3:0.2;nic=5:down); the plan as planned is always a row"
            )
        if flags in scenarios:
            raise ValueError(f"--whatif {shorten(value)}: the same scenario given twice")
        parse_flags(flags)  # a malformed flag fails once, before any plan is read
        scenarios.append(flags)
    return scenarios


def _checked_plan(path: Path, scenarios: list[tuple[str, ...]]) -> Plan:
    """The plan file, resolved on its cluster under every scenario: a bad plan, flag, rank,
    server or switch fails here, before any simulation, with the plan's path."""
    from schedules.resolve import resolve_plan
    from schedules.whatif import parse_flags
    from sim.replay.simulate import plan_topology
    from sim.replay.whatif import check_whatif, degraded_topology

    try:
        plan = load_plan_file(path)
        topology = plan_topology(plan)
        resolve_plan(plan, topology.num_gpus)
        for flags in scenarios:
            whatif = parse_flags(flags, plan.whatif)
            check_whatif(whatif, topology)
            if whatif.links:  # a link down needs another way up
                degraded_topology(topology, dataclasses.replace(whatif, second_job=()))
    except ValueError as error:
        message, where = str(error), str(path)
        raise ValueError(message if where in message else f"{where}: {message}") from None
    return plan


def run(args: argparse.Namespace) -> int:
    """Simulate every (plan, scenario), print the table, write the files asked for."""
    from sim.search.run import run_calls
    from sim.search.sweep import simulate_scenario, with_deltas

    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if args.ray is not None and args.jobs > 1:
        print(
            "commsim: warning: --jobs is ignored with --ray (Ray places the tasks)", file=sys.stderr
        )
    targets = check_outputs(
        {"--json": (args.json, (".json",)), "--csv": (args.csv, (".csv",))},
        inputs=tuple(args.plans),
    )
    scenarios = [(), *_scenarios(args.whatif)]
    plans = [_checked_plan(path, scenarios) for path in args.plans]
    labels = [plan.name or path.stem for plan, path in zip(plans, args.plans, strict=True)]
    if len(set(labels)) < len(labels):  # two plans of one name: tell them apart by file
        labels = [str(path) for path in args.plans]
    calls = [
        (simulate_scenario, (plan, flags, label))
        for plan, label in zip(plans, labels, strict=True)
        for flags in scenarios
    ]
    rows = with_deltas(run_calls(calls, jobs=args.jobs, ray_address=args.ray))
    if (target := targets.get("--json")) is not None:
        write_text(target, json.dumps({"schema": "commsim-sweep/1", "rows": rows}, indent=1) + "\n")
    if (target := targets.get("--csv")) is not None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        write_text(target, buffer.getvalue())
    width = max(len(r["scenario"]) for r in rows)
    print(
        f"{'plan':<28} {'scenario':<{width}} {'step s':>10} {'change':>8} {'MFU':>6} {'ranks':>11}"
    )
    for r in rows:
        print(
            f"{r['plan'][:28]:<28} {r['scenario']:<{width}} {r['step_time_s']:>10.3f} "
            f"{r['delta_pct']:>+7.1f}% {r['mfu']:>6.1%} "
            f"{r['simulated_ranks']:>5}/{r['num_gpus']:<5}"
        )
    return 0
