"""``commsim compare``: score and plot simulated against measured collectives.

Simulates every measured record (its own algorithm when it names one), prints busbw measured vs
simulated with the busbw error per size and the time MAPE, writes a JSON and a plot (busbw vs
size, log-log, one series per op, algorithm and layout; filled markers were used for fitting,
hollow ones were not; bars from the p99 to the fastest iteration where the measurement has them).
``--holdout EXPR`` fits a calibration on the records that do NOT match and scores only those that
do: the number to quote.

    commsim compare data.txt --topology dgx-h100 --holdout 'op=all_gather' -o plot.png
"""

from __future__ import annotations

import argparse
import json
import sys

from fileio.output import check_outputs, write_text
from sim.inputs.calibrations import node_mismatch
from sim.inputs.measured import add_reading_arguments, read_measured, release_from_measured
from sim.inputs.topology import add_topology_arguments, topology_factory
from sim.network.analytical import ALGORITHMS
from sim.network.calibration import Calibration, load_calibration
from sim.network.comm_model import FIDELITIES, check_algo_name
from sim.network.compare import (
    any_matches,
    compare_records,
    describe_holdout,
    format_table,
    parse_selector,
    plot_comparison,
    points_json,
    summary,
)
from sim.network.fitting import fit_calibration
from vocab.records import Record
from vocab.sizes import parse_size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``commsim compare``."""
    parser.add_argument("measured", nargs="+", help="commbench JSON/CSV, nccl-tests logs or tables")
    add_topology_arguments(parser)
    parser.add_argument("--calibration", default=None, help="calibration JSON to simulate with")
    parser.add_argument(
        "--holdout", action="append", default=[], metavar="EXPR",
        help="fit on records NOT matching EXPR, score on those matching (e.g. 'op=all_gather', "
        "'nodes=8', 'size<1M'); repeatable (a record matching any is held out)",
    )  # fmt: skip
    parser.add_argument("--fit", action="store_true", help="fit on all records (in-sample score)")
    parser.add_argument(
        "--only", action="append", default=[], metavar="EXPR", help="use only matching records"
    )
    parser.add_argument("--algo", default="auto", help=f"auto or one of {', '.join(ALGORITHMS)}")
    parser.add_argument("--fidelity", default="analytical", help=" or ".join(FIDELITIES))
    parser.add_argument("--min-size", default="1M", help="also report MAPE for sizes >= this")
    parser.add_argument("-o", "--output", default=None, help="plot PNG to write")
    parser.add_argument("--json", default=None, help="comparison JSON to write")
    add_reading_arguments(parser)


def _calibration(
    args: argparse.Namespace, records: list[Record]
) -> tuple[Calibration | None, list[Record], str]:
    """(calibration, records it was fitted on, description)."""
    modes = sum([bool(args.holdout), args.fit, args.calibration is not None])
    if modes > 1:
        raise ValueError("choose one of --holdout, --fit and --calibration")
    if args.calibration is not None:
        calibration = load_calibration(args.calibration)
        if note := node_mismatch(calibration, args.topology):
            print(f"commsim: warning: --calibration {args.calibration}: {note}", file=sys.stderr)
        return (
            calibration,
            _fitted_records(calibration, records, args.measured),
            (f"calibration {args.calibration}"),
        )
    if not args.holdout and not args.fit:
        return None, [], "uncalibrated (default parameters)"
    selectors = [parse_selector(text) for text in args.holdout]
    train = [r for r in records if not any_matches(selectors, r)]
    if not train or len(train) == len(records):
        raise ValueError(f"--holdout {args.holdout} must leave records on both sides")
    calibration, notes = fit_calibration(
        train, topology_factory(args), topology_name=args.topology, sources=args.measured,
        assumed_algo=args.algo,
    )  # fmt: skip
    for note in notes:
        print(f"# note: {note}")
    how = "fitted on all records" if args.fit else describe_holdout(selectors)
    return calibration, train, how


def _fitted_records(
    calibration: Calibration, records: list[Record], paths: list[str]
) -> list[Record]:
    """Records the calibration's provenance says it was fitted on (same file, op, size, world)."""
    source = calibration.fitted_from
    if not set(map(str, source.get("sources", []))) & set(paths):
        return []
    ops, sizes, worlds = (set(source.get(k, [])) for k in ("ops", "sizes_bytes", "world_sizes"))
    return [r for r in records if r.op in ops and r.size_bytes in sizes and r.world_size in worlds]


def run(args: argparse.Namespace) -> int:
    """Compare, print, write JSON and PNG."""
    check_algo_name(args.algo)  # also where every file names its records' algorithm
    targets = check_outputs(
        {"--json": (args.json, (".json",)), "-o": (args.output, (".png", ".svg", ".pdf"))},
        inputs=(*args.measured, args.calibration),
    )
    records = read_measured(
        args.measured, args.only, op=args.op, allow_wrong=args.allow_wrong, note=_note
    )
    release_from_measured(args, _note)
    min_size = parse_size(args.min_size)
    calibration, train, how = _calibration(args, records)
    trained = {id(r) for r in train}
    points = compare_records(
        records, topology_factory(args), calibration, fidelity=args.fidelity, algo=args.algo,
        used_for_fit=lambda r: id(r) in trained,
    )  # fmt: skip
    result = summary(points, min_size_bytes=min_size)
    print(f"# commsim compare: topology {args.topology}, {how}, fidelity {args.fidelity}")
    print("\n".join(format_table(points)))
    for name, stats in result["series"].items():
        print(
            f"# time MAPE {name}: {_pct(stats['mape_pct'])} all sizes, "
            f"{_pct(stats['mape_pct_min_size'])} for sizes >= {args.min_size}"
        )
    if len({(b["op"], b["num_nodes"]) for b in result["bands"]}) > 1 or len(result["bands"]) > 1:
        print(f"# {'op':<16} {'nodes':>5}  {'size band':<15} {'points':>6} {'MAPE':>7} {'mean':>7}")
        for b in result["bands"]:
            print(
                f"# {b['op']:<16} {b['num_nodes']:>5}  {b['band']:<15} {b['num_points']:>6} "
                f"{_pct(b['mape_pct']):>7} {b['mean_error_pct']:>+6.1f}%"
            )
    print(
        f"# time MAPE ({result['scored_on']}, {result['num_points']} points): "
        f"{_pct(result['mape_pct'])} all sizes, {_pct(result['mape_pct_min_size'])} "
        f"for sizes >= {args.min_size}"
    )
    if args.json:
        document = {
            "schema": "commsim-compare/1", "measured": args.measured, "topology": args.topology,
            "nodes": args.nodes, "fabric": args.fabric, "calibration": how,
            "holdout": args.holdout, "only": args.only, "fidelity": args.fidelity,
            "algo": args.algo, "summary": result, "points": points_json(points),
            "fitted_params": calibration.to_json() if calibration is not None else None,
        }  # fmt: skip
        write_text(targets["--json"], json.dumps(document, indent=1) + "\n")
        print(f"# wrote {args.json}")
    if args.output:
        title = (
            f"{args.topology}: measured vs simulated, {how}; "
            f"time MAPE {_pct(result['mape_pct'])} ({result['scored_on']})"
        )
        plot_comparison(points, targets["-o"], title=title)
        print(f"# wrote {args.output}")
    return 0


def _note(line: str) -> None:
    print(f"# note: {line}")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"
